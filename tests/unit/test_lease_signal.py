"""The long poll's wake-up (store/lease_signal.py): a notification from another thread wakes a
waiter at once, and none is lost between a look at the database and the wait."""

from __future__ import annotations

import asyncio
import threading
import time

from store.lease_signal import LeaseSignal, Wakeup


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


def test_a_wakeup_ends_a_sleep_early_once_and_then_sleeps_again() -> None:
    """The round driver's sleep: a change committed elsewhere (``set``, from another thread)
    ends it at once; the next sleep is a full one again."""
    wakeup = Wakeup()
    threading.Timer(0.05, wakeup.set).start()
    began = time.monotonic()
    wakeup.sleep(10.0)
    assert time.monotonic() - began < 5.0
    began = time.monotonic()
    wakeup.sleep(0.1)
    assert time.monotonic() - began >= 0.09
