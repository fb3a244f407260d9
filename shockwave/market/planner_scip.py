"""The exact count MIP on SCIP, for when the greedy cannot certify its plan.

Model (shapes as in :mod:`shockwave.market.planner`): integer n_j in [0, cap_j]; for a job whose
term phi_j(n) is concave over its integer points, an epigraph
variable y_j under the secant lines through consecutive integer points (exact at integers, no
approximation error); for a non-concave job (a faster regime ahead, or the restart overhead of a
job that is not running), a one-hot choice of n_j. The objective is written relative to the
empty plan, so SCIP's relative gap is the gap on the achievable gain. The greedy plan is handed
to SCIP as a starting solution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pyscipopt import Model, quicksum

from shockwave.market.planner import PlannerParams, Problem, SolveStatus


@dataclass(frozen=True, slots=True)
class ScipResult:
    counts: npt.NDArray[np.int64]
    value: float
    bound: float
    status: SolveStatus


def solve_with_scip(
    problem: Problem, params: PlannerParams, start: npt.NDArray[np.int64]
) -> ScipResult | None:
    """Solve the count MIP; None when SCIP returns no solution at all."""
    count = len(problem.jobs)
    model = Model("shockwave-plan")
    model.hideOutput()
    model.setParam("limits/time", max(0.01, params.time_limit_s))
    model.setParam("limits/gap", params.relative_gap)
    model.setParam("parallel/maxnthreads", 1)
    n_vars = []
    y_vars = []
    onehots: dict[int, list[Any]] = {}
    for j in range(count):
        cap = int(problem.caps[j])
        gain = problem.value[j, : cap + 1] - problem.value[j, 0]
        floor = min(cap, int(problem.floors[j])) if problem.floors is not None else 0
        n = model.addVar(f"n{j}", vtype="I", lb=floor, ub=cap)
        y = model.addVar(f"y{j}", lb=None, ub=float(gain.max()))
        if _concave(gain):
            for k in range(cap):
                model.addCons(y <= float(gain[k]) + float(gain[k + 1] - gain[k]) * (n - k))
            if cap == 0:
                model.addCons(y <= 0.0)
        else:
            picks = [model.addVar(f"b{j}_{k}", vtype="B") for k in range(cap + 1)]
            onehots[j] = picks
            model.addCons(quicksum(picks) == 1)
            model.addCons(n == quicksum(k * b for k, b in enumerate(picks)))
            model.addCons(y <= quicksum(float(gain[k]) * b for k, b in enumerate(picks)))
        n_vars.append(n)
        y_vars.append(y)
    widths = [float(problem.gpus[j]) for j in range(count)]
    model.addCons(quicksum(w * n for w, n in zip(widths, n_vars, strict=True)) <= problem.capacity)
    model.setObjective(quicksum(y_vars), "maximize")
    _add_start(model, problem, start, n_vars, y_vars, onehots)
    model.optimize()
    if model.getNSols() == 0:
        return None
    best = model.getBestSol()
    counts = np.array([round(model.getSolVal(best, n)) for n in n_vars], dtype=np.int64)
    counts = np.clip(counts, 0, problem.caps)
    value = problem.objective(counts)
    offset = float(problem.value[:, 0].sum())
    bound = float(model.getDualbound()) + offset
    status = {
        "optimal": SolveStatus.OPTIMAL,
        "gaplimit": SolveStatus.GAP_LIMIT,
    }.get(model.getStatus(), SolveStatus.TIME_LIMIT)
    return ScipResult(counts=counts, value=value, bound=max(bound, value), status=status)


def _concave(values: npt.NDArray[np.float64]) -> bool:
    diffs = np.diff(values)
    return bool(np.all(diffs[1:] <= diffs[:-1] + 1e-15)) if len(diffs) >= 2 else True


def _add_start(
    model: Model,
    problem: Problem,
    start: npt.NDArray[np.int64],
    n_vars: list[Any],
    y_vars: list[Any],
    onehots: dict[int, list[Any]],
) -> None:
    """Hand the greedy plan to SCIP as a complete feasible solution."""
    sol = model.createSol()
    for j, n in enumerate(start):
        k = int(n)
        model.setSolVal(sol, n_vars[j], k)
        model.setSolVal(sol, y_vars[j], float(problem.value[j, k] - problem.value[j, 0]))
        for i, b in enumerate(onehots.get(j, [])):
            model.setSolVal(sol, b, 1.0 if i == k else 0.0)
    model.addSol(sol, free=True)
