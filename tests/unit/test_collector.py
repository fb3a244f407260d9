"""The quiet collector of long simulations: quiet inside its block, the process's own settings
restored after it, on an error too."""

from __future__ import annotations

import gc

import pytest

from shockwave_cli.collector import QUIET_THRESHOLDS, quiet_collector


def test_the_collector_is_quiet_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    assert before != QUIET_THRESHOLDS
    with quiet_collector():
        assert gc.get_threshold() == QUIET_THRESHOLDS
        assert gc.get_freeze_count() > 0, "what existed on entry is frozen out of collections"
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_an_error_inside_restores_the_collector() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="boom"), quiet_collector():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
