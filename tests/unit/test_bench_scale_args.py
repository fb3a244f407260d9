"""bench.scale's deployment flags: the agents' API processes run below the users' own."""

from __future__ import annotations

import pytest

from bench.scale import AGENTS_NICE, niced, parse_args


def test_agents_yield_the_cpu_to_users_processes_of_their_own() -> None:
    assert parse_args([]).agents_nice == AGENTS_NICE > 0
    assert parse_args(["--user-apis", "0"]).agents_nice == 0
    assert parse_args(["--agents-nice", "0"]).agents_nice == 0
    assert niced(0) == [] and niced(7) == ["nice", "-n", "7"]


@pytest.mark.parametrize("niceness", ["-1", "20"])
def test_a_niceness_out_of_range_is_refused(
    niceness: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--agents-nice", niceness])
    assert "--agents-nice must be 0 to 19" in capsys.readouterr().err
