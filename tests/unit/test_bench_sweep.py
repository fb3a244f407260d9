"""bench/sweep.py: the verdict rules of issue 19, and one tiny cell end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import sweep
from shockwave_cli.commands.inputs import load_throughputs

REFERENCE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "reference"


def metrics(makespan: float, jct: float, ftf: float = 0.9, unfair: float = 0.0) -> dict[str, Any]:
    return {
        "makespan_s": makespan,
        "makespan_lower_bound_s": 1000.0,
        "avg_jct_s": jct,
        "worst_ftf": ftf,
        "unfair_fraction": unfair,
    }


def runs(ours: dict[str, Any], **baselines: dict[str, Any]) -> list[sweep.Run]:
    found = [sweep.Run("c", 0, "shockwave", ours, 1.0)]
    found += [sweep.Run("c", 0, name, m, 1.0) for name, m in baselines.items()]
    return found


@pytest.mark.parametrize(
    ("ours", "met"),
    [
        (metrics(1050.0, 500.0), True),  # at 1.05x the bound, though OSSP is sooner
        (metrics(1090.0, 500.0), True),  # above 1.05x but no later than the best baseline
        (metrics(1200.0, 500.0), False),  # later than both
        (metrics(1000.0, 700.0), False),  # JCT worse than Gavel's
        (metrics(1000.0, 500.0, ftf=1.3), False),
        (metrics(1000.0, 500.0, unfair=0.06), False),
    ],
)
def test_verdict_rules(ours: dict[str, Any], met: bool) -> None:
    (verdict,) = sweep.judge(runs(ours, gavel=metrics(1300.0, 600.0), ossp=metrics(1090.0, 2000.0)))
    assert verdict.best_baseline == "ossp"
    assert verdict.met is met


def test_a_tiny_cell_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = sweep.Cell("tiny", 6, 8, 300.0, "short", "mixed")
    monkeypatch.setattr(sweep, "GRID", (tiny,))
    monkeypatch.setattr(sweep, "BASELINES", ("gavel", "fifo"))
    code = sweep.main(
        ["--reference", str(REFERENCE), "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]
    )
    report = json.loads((tmp_path / "sweep.json").read_text())
    assert {r["policy"] for r in report["runs"]} == {"shockwave", "gavel", "fifo"}
    (verdict,) = report["verdicts"]
    assert verdict["cell"] == "tiny" and code == (0 if report["all_met"] else 1)
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_unknown_cell_is_refused(tmp_path: Path) -> None:
    assert (
        sweep.main(["--reference", str(REFERENCE), "--cells", "nope", "--out", str(tmp_path)]) == 2
    )


def test_shockwave_params_from_the_command_line() -> None:
    parsed = sweep.parse_overrides(["packing_order=deadline", "fairness_exponent=6", "x=0.5"])
    assert parsed == {"packing_order": "deadline", "fairness_exponent": 6, "x": 0.5}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        sweep.parse_overrides(["packing_order"])
    assert sweep.main(["--shockwave-param", "no_such_knob=1", "--cells", "light-default-24"]) == 2


def test_real_trace_verdicts_use_the_production_targets() -> None:
    found = runs(
        metrics(1000.0, 550.0, ftf=1.5, unfair=0.3),
        gavel=metrics(1300.0, 600.0, ftf=1.6),
        themis=metrics(1200.0, 560.0, ftf=2.0),
        fifo=metrics(1100.0, 500.0, ftf=9.0),
    )
    (real,) = sweep.judge(found, frozenset({"c"}))
    assert real.jct_over_best_fair == 550.0 / 560.0 and real.ftf_over_best_baseline == 1.5 / 1.6
    assert real.met  # FTF above 1.2 and 30% unfair, but better than every baseline
    (generated,) = sweep.judge(found)
    assert not generated.met
    worse = runs(metrics(1000.0, 570.0), gavel=metrics(1300.0, 600.0), themis=metrics(1200, 560))
    assert not sweep.judge(worse, frozenset({"c"}))[0].met


def test_a_real_trace_cell_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traces = tmp_path / "traces"
    (traces / "itp").mkdir(parents=True)
    day = 86400
    rows = [(0, 600, 1), (100, 1800, 2), (200, 3600, 16), (300, 900, 1), (9 * day, 600, 1)]
    (traces / "itp" / "tiny.csv").write_text(
        "job_id,submission_time,duration,num_gpu\n"
        + "".join(f"j{i},{a},{d},{g}\n" for i, (a, d, g) in enumerate(rows))
    )
    cell = sweep.Cell("itp-tiny-1.2x", 0, 0, 0.0, "real", "default", "itp/tiny.csv", 1.2)
    monkeypatch.setattr(sweep, "REAL_GRID", (cell,))
    monkeypatch.setattr(sweep, "BASELINES", ("gavel", "fifo"))
    table = load_throughputs(REFERENCE / "throughputs" / "tacc_throughputs.json")
    resolved = sweep.resolve(cell, traces, table)
    # The busiest week holds the first four jobs; its demand is far below one node, and the
    # 16-GPU job needs two nodes of 8.
    assert (resolved.jobs, resolved.gpus) == (4, 16)
    code = sweep.main(
        [
            *("--reference", str(REFERENCE), "--traces", str(traces), "--grid", "real"),
            *("--seeds", "1", "--workers", "1", "--out", str(tmp_path / "out")),
        ]
    )
    report = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert {r["policy"] for r in report["runs"]} == {"shockwave", "gavel", "fifo"}
    assert all(r["metrics"]["jobs_completed"] == 4 for r in report["runs"])
    lines = (tmp_path / "out" / "runs.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["policy"] for line in lines) == ["fifo", "gavel", "shockwave"]
    (verdict,) = report["verdicts"]
    assert verdict["real"] and code == (0 if report["all_met"] else 1)
