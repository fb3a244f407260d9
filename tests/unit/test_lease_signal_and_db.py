"""The long poll's wake-up (store/lease_signal.py) and the SQLite engine's durability setting
(store/db.py): a notification from another thread wakes a waiter at once and none is lost
between a look at the database and the wait; ``synchronous`` is what the caller chose."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from store.db import make_engine
from store.lease_signal import LeaseSignal


def test_a_notification_from_another_thread_wakes_a_waiter_at_once() -> None:
    signal = LeaseSignal()

    async def wait() -> tuple[bool, float]:
        seen = signal.generation
        threading.Timer(0.05, signal.notify).start()
        began = time.monotonic()
        woke = await signal.wait(seen, timeout_s=10.0)
        return woke, time.monotonic() - began

    woke, took = asyncio.run(wait())
    assert woke and took < 5.0


def test_a_wait_times_out_without_news_and_returns_at_once_for_one_it_missed() -> None:
    signal = LeaseSignal()
    seen = signal.generation
    assert asyncio.run(signal.wait(seen, timeout_s=0.05)) is False
    signal.notify()  # between the waiter's look at the database and its wait
    began = time.monotonic()
    assert asyncio.run(signal.wait(seen, timeout_s=10.0)) is True
    assert time.monotonic() - began < 1.0


@pytest.mark.parametrize(("choice", "pragma"), [("full", 2), ("normal", 1)])
def test_sqlite_synchronous_is_the_callers_choice(tmp_path: Path, choice: str, pragma: int) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}", sqlite_synchronous=choice)
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA synchronous")).scalar_one() == pragma
        assert connection.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
    engine.dispose()
    with pytest.raises(ValueError, match="sqlite_synchronous"):
        make_engine("sqlite:///x.db", sqlite_synchronous="off")
