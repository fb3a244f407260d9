"""What the e2e tests' failure messages show: ``wait_until``'s message, a callable one read when
the wait gives up, so a failure shows the logs of that moment (a message built before the wait
showed logs from its start, which hid what went wrong during it); and a process started again
under its name goes on in its log (an agent's restart began a new log, which hid the run before
it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shockwave_cli.runtime.supervision import NotReady, Supervisor, wait_until


def test_a_callable_message_is_read_only_when_the_wait_gives_up() -> None:
    calls: list[int] = []
    log = ["started"]

    def message() -> str:
        calls.append(1)
        return " / ".join(log)

    def condition() -> bool:
        log.append("still waiting")
        return False

    with pytest.raises(NotReady) as raised:
        wait_until(condition, 0.05, message, poll_s=0.01)
    assert len(calls) == 1
    assert str(raised.value).startswith("timed out after 0s waiting for started / still waiting")
    assert raised.value.args[0].count("still waiting") == len(log) - 1


def test_a_met_condition_never_builds_the_message() -> None:
    def message() -> str:
        raise AssertionError("built although the wait succeeded")

    wait_until(lambda: True, 1, message)


def test_a_plain_string_message_still_works() -> None:
    with pytest.raises(NotReady, match="waiting for the thing"):
        wait_until(lambda: False, 0.01, "the thing", poll_s=0.005)


def test_a_process_started_again_under_its_name_goes_on_in_its_log(tmp_path: Path) -> None:
    """An agent killed and started again (a new process of the same name) keeps the first
    one's output in the log: a failure after a restart shows what happened before it."""
    with Supervisor(tmp_path, {}) as supervisor:
        for name, said in (("agent", "first run"), ("agent", "second run"), ("api", "api")):
            process = supervisor.start(name, [sys.executable, "-c", f"print({said!r})"]).process
            assert process is not None
            process.wait(10)
    log = (tmp_path / "agent.log").read_text()
    assert log.count("=== start") == 2
    assert log.index("first run") < log.index("second run")
    assert "first run" not in (tmp_path / "api.log").read_text()
