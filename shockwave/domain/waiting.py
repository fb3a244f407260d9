""" "Why am I waiting": the one cause a job does not run now, in words and as a code.

The API's prediction endpoint, the dashboard's queue and ``shockwave jobs why`` all ask this one
rule, so the same job gets the same answer everywhere. Causes are tried from the most basic up:
a finished job; a running one; a gang wider than every registered GPU together (unschedulable); no
READY node at all; not enough READY GPUs (by kind) for the gang; its tenant at its GPU limit
(``max_gpus``); no plan yet; then the plan's
answer (planned from a later round, or not in the plan: waiting for its share).

Pure: standard library only, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from shockwave.domain.lifecycle import JobState
from shockwave.domain.tenancy import AT_LIMIT


class Cause(StrEnum):
    """Why a job is not running now (``running``/``finished``: it is not waiting)."""

    FINISHED = "finished"
    RUNNING = "running"
    UNSCHEDULABLE = "unschedulable"
    NO_READY_NODE = "no_ready_node"
    NOT_ENOUGH_GPUS = "not_enough_gpus"
    TENANT_AT_LIMIT = "tenant_at_limit"
    NO_PLAN = "no_plan"
    PLANNED = "planned"
    WAITING_FOR_SHARE = "waiting_for_share"


@dataclass(frozen=True, slots=True)
class Gpus:
    """GPUs by kind (``gpu_type``, "" when unnamed): of every registered node (``total``) and of
    the READY ones (``ready``). The round driver places a gang on any GPUs, whatever their
    kind, so the counts decide; the kinds are named in the reason for the reader."""

    total: Mapping[str, int]
    ready: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PlanView:
    """What the freshest plan says of the job: ``rounds`` (indices, current round on) and the
    plan's last round, ``last``; ``None`` for the whole view when no plan is stored.
    ``gpu_type``: the GPU type the plan puts the job on (typed clusters; None otherwise)."""

    rounds: Sequence[int]
    first: int
    last: int
    gpu_type: str | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    cause: Cause
    reason: str


def why_waiting(
    state: JobState,
    gpus_needed: int,
    gpus: Gpus,
    plan: PlanView | None,
    tenant_at_limit: bool = False,
) -> Waiting:
    """The cause that keeps a job in ``state`` that needs ``gpus_needed`` GPUs from running.
    ``tenant_at_limit``: its gang would put its tenant (or one above it) over ``max_gpus``
    (:class:`shockwave.domain.tenancy.TenantUsage`), which the round engine does not allow."""
    if state.terminal:
        return Waiting(Cause.FINISHED, f"the job is {state.value}: nothing left to plan")
    if state is JobState.RUNNING:
        return Waiting(Cause.RUNNING, "running: it holds its GPUs this round")
    short = short_of_gpus(gpus_needed, gpus.ready, gpus.total)
    if short is not None:
        return short
    if tenant_at_limit:
        return Waiting(
            Cause.TENANT_AT_LIMIT,
            f"{AT_LIMIT}: its {gpus_needed} GPUs would put its tenant over its max_gpus; it "
            "starts when the tenant's running jobs free GPUs",
        )
    if plan is None:
        return Waiting(Cause.NO_PLAN, "no plan yet: the solver service has not planned this job")
    if plan.rounds:
        return Waiting(
            Cause.PLANNED,
            f"planned for {len(plan.rounds)} of the plan's rounds, from round {plan.rounds[0]} "
            f"(plan up to round {plan.last})",
        )
    return Waiting(
        Cause.WAITING_FOR_SHARE,
        f"waiting for its share: the plan (rounds {plan.first} to {plan.last}) gives the GPUs "
        "to jobs further behind their fair finish time",
    )


def short_of_gpus(
    gpus_needed: int, ready: Mapping[str, int], total: Mapping[str, int] | None = None
) -> Waiting | None:
    """The capacity rule, the one the round engine and "why am I waiting" both apply: a gang
    wider than every registered GPU together (``total``) can never run; with no READY GPU
    nothing runs; a gang wider than the READY GPUs (``ready``, by kind) waits for nodes to join.
    None when the READY GPUs can hold it. ``total`` None: only the READY nodes are known (the
    round engine's view)."""
    registered = sum(total.values()) if total is not None else 0
    available = sum(ready.values())
    if registered and registered < gpus_needed:
        return Waiting(
            Cause.UNSCHEDULABLE,
            f"unschedulable: it needs {gpus_needed} GPUs and the cluster has "
            f"{_kinds(total or {})} in all",
        )
    if available == 0:
        lost = f" ({registered} GPUs registered, none READY)" if registered else ""
        return Waiting(
            Cause.NO_READY_NODE,
            f"no node is READY{lost}: start a node agent (`shockwave agent`) or wait for one "
            "to heartbeat again",
        )
    if available < gpus_needed:
        return Waiting(
            Cause.NOT_ENOUGH_GPUS,
            f"not enough READY GPUs: it needs {gpus_needed}, the READY nodes have {_kinds(ready)}",
        )
    return None


def _kinds(by_kind: Mapping[str, int]) -> str:
    """``"4 (a100: 4)"``: the count, and per kind where the kinds are named."""
    total = sum(by_kind.values())
    named = {kind: n for kind, n in sorted(by_kind.items()) if n}
    if list(named) in ([], [""]):
        return str(total)
    listed = ", ".join(f"{kind or 'unnamed'}: {n}" for kind, n in named.items())
    return f"{total} ({listed})"
