"""bench.scale's deployment flags: the agents' API processes run below the users' own, and
as many as the cost model recommends for the fleet."""

from __future__ import annotations

import pytest

from bench.scale import AGENTS_NICE, NODES_PER_API, agents_apis, niced, parse_args


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


def test_the_agents_processes_default_to_one_per_512_nodes_within_the_cores() -> None:
    assert NODES_PER_API == 512
    assert agents_apis(64, 2) == 1
    assert agents_apis(512, 2) == 1
    assert agents_apis(1024, 2) == 2
    assert agents_apis(10_000, 2) == 2
    assert agents_apis(10_000, 16) == 16
    assert agents_apis(1024, 1) == 1
    assert parse_args(["--nodes", "1024", "--apis", "3"]).apis == 3
