"""bench/replay_parity.py: the production-week case's workload (a window of a cluster's busiest
week, imported by ``shockwave import-trace``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import replay_parity
from shockwave_cli.commands.inputs import load_throughputs, load_workload

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
THROUGHPUTS = SHARED / "reference" / "throughputs" / "tacc_throughputs.json"
DAY = 86400


def write_log(traces: Path, rows: list[tuple[int, int, int]]) -> None:
    (traces / "itp").mkdir(parents=True)
    (traces / "itp" / "cluster99.csv").write_text(
        "job_id,submission_time,duration,num_gpu\n"
        + "".join(f"j{i},{a},{d},{g}\n" for i, (a, d, g) in enumerate(rows))
    )


def test_the_window_is_counted_from_the_busiest_week(tmp_path: Path) -> None:
    # A light first week, then the busiest one from 20 days on; the window keeps its jobs
    # arriving 1,000 to 5,000 s into it, rebased so that the first arrives at 0.
    start = 20 * DAY
    rows = [(0, 600, 1), (50, 900, 2)]
    rows += [(start, 90_000, 8), (start + 1_000, 3_600, 16), (start + 1_500, 1_800, 2)]
    rows += [(start + 4_999, 600, 1), (start + 5_000, 600, 4)]
    write_log(tmp_path / "traces", rows)
    out = tmp_path / "out"
    out.mkdir()
    files = replay_parity.itp_files(tmp_path / "traces", "99", "1000:5000", THROUGHPUTS, out)
    workload = load_workload(*files, load_throughputs(THROUGHPUTS))
    assert [(j.spec.arrival_s, j.spec.gpus) for j in workload.jobs] == [
        (0.0, 16),
        (500.0, 2),
        (3_999.0, 1),
    ]


@pytest.mark.parametrize("window", ["5000:1000", "0:700000", "-1:100", "soon"])
def test_a_bad_window_is_refused(tmp_path: Path, window: str) -> None:
    write_log(tmp_path / "traces", [(0, 600, 1)])
    with pytest.raises(ValueError):
        replay_parity.itp_files(tmp_path / "traces", "99", window, THROUGHPUTS, tmp_path)


def test_the_default_case_has_gangs_wider_than_a_node(tmp_path: Path) -> None:
    files = replay_parity.itp_files(
        SHARED / "public-traces", "06", "78000:84000", THROUGHPUTS, tmp_path
    )
    workload = load_workload(*files, load_throughputs(THROUGHPUTS))
    widths = sorted(j.spec.gpus for j in workload.jobs)
    assert widths == [4] * 5 + [32] * 9
