"""The quiet collector of simulations and of the services: quiet while any thread is inside a
block, the process's own settings restored when the last one leaves, on an error too."""

from __future__ import annotations

import gc
import threading

import pytest

from solver_service.collector import QUIET_THRESHOLDS, quiet_collector


def test_the_collector_is_quiet_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    assert before != QUIET_THRESHOLDS
    with quiet_collector():
        assert gc.get_threshold() == QUIET_THRESHOLDS
        assert gc.get_freeze_count() > 0, "what existed on entry is frozen out of collections"
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_quiet_until_the_last_thread_leaves() -> None:
    before = gc.get_threshold()
    assert before != QUIET_THRESHOLDS
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with quiet_collector():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with quiet_collector():
        assert gc.get_threshold() == QUIET_THRESHOLDS
        assert gc.get_freeze_count() > 0, "what existed on entry is frozen out of collections"
        thread.start()
        assert entered.wait(10)
    assert gc.get_threshold() == QUIET_THRESHOLDS, "the other thread is still inside"
    release.set()
    thread.join(10)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_an_error_inside_restores_the_collector() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="boom"), quiet_collector():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
