"""shockwave.domain.waiting: the one cause a job does not run, most basic first."""

from __future__ import annotations

import pytest

from shockwave.domain.lifecycle import JobState
from shockwave.domain.waiting import Cause, Gpus, PlanView, why_waiting

NONE = Gpus(total={}, ready={})
TWO_READY = Gpus(total={"a100": 2}, ready={"a100": 2})
PLAN = PlanView(rounds=(), first=3, last=9)


@pytest.mark.parametrize(
    ("state", "needs", "gpus", "plan", "cause"),
    [
        (JobState.SUCCEEDED, 1, NONE, None, Cause.FINISHED),
        (JobState.RUNNING, 1, TWO_READY, PLAN, Cause.RUNNING),
        (JobState.PENDING, 1, NONE, None, Cause.NO_READY_NODE),
        (JobState.PENDING, 1, NONE, PLAN, Cause.NO_READY_NODE),
        (JobState.PENDING, 1, Gpus(total={"a100": 4}, ready={}), PLAN, Cause.NO_READY_NODE),
        (JobState.PENDING, 8, TWO_READY, PLAN, Cause.UNSCHEDULABLE),
        (
            JobState.PENDING,
            4,
            Gpus(total={"a100": 4}, ready={"a100": 2}),
            PLAN,
            Cause.NOT_ENOUGH_GPUS,
        ),
        (JobState.SUSPENDED, 2, TWO_READY, None, Cause.NO_PLAN),
        (JobState.PENDING, 2, TWO_READY, PlanView(rounds=(5, 6), first=3, last=9), Cause.PLANNED),
        (JobState.PENDING, 2, TWO_READY, PLAN, Cause.WAITING_FOR_SHARE),
    ],
)
def test_the_most_basic_cause_is_named(
    state: JobState, needs: int, gpus: Gpus, plan: PlanView | None, cause: Cause
) -> None:
    assert why_waiting(state, needs, gpus, plan).cause is cause


def test_reasons_name_the_figures_behind_them() -> None:
    lost = why_waiting(JobState.PENDING, 1, Gpus(total={"a100": 4}, ready={}), None)
    assert lost.reason.startswith("no node is READY (4 GPUs registered, none READY)")
    mixed = Gpus(total={"a100": 2, "v100": 2}, ready={"a100": 1, "v100": 2})
    short = why_waiting(JobState.PENDING, 4, mixed, None)
    assert (
        short.reason
        == "not enough READY GPUs: it needs 4, the READY nodes have 3 (a100: 1, v100: 2)"
    )
    planned = why_waiting(JobState.PENDING, 1, TWO_READY, PlanView((5, 6), 3, 9))
    assert planned.reason == "planned for 2 of the plan's rounds, from round 5 (plan up to round 9)"
