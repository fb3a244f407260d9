"""``wait_until``'s message: a callable one is read when the wait gives up, so a failure shows
the logs of that moment (a message built before the wait showed logs from its start, which
hid what went wrong during it)."""

from __future__ import annotations

import pytest

from shockwave_cli.supervision import NotReady, wait_until


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
