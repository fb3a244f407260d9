"""Gavel's round mechanism: when allocations are recomputed, how jobs are ranked and walked."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import pytest

from shockwave.domain.snapshot import ActiveJob
from shockwave.domain.stints import Stint
from shockwave.policies.gavel_family.gavel import MaxMinFairness, MaxMinFairnessParams
from shockwave.policies.gavel_family.time_fraction import (
    AllocationJob,
    PriorityState,
    TimeFractionParams,
    TimeFractionPolicy,
)
from shockwave.policies.policy import Decision
from tests.builders import active_job, snapshot

EPOCH_S = 100.0
"""Seconds of an epoch of a builder's job (100 steps at 1 step a second)."""


@dataclass(frozen=True, slots=True)
class FixedSharesParams:
    shares: Mapping[str, float] = field(default_factory=dict)
    mechanism: TimeFractionParams = field(default_factory=TimeFractionParams)


class FixedShares(TimeFractionPolicy):
    """An allocator that returns the shares it is given, to test the mechanism alone."""

    name: ClassVar[str] = "fixed-shares-test"
    Params: ClassVar[type[Any]] = FixedSharesParams

    def allocate(
        self,
        jobs: Sequence[AllocationJob],
        total_gpus: int,
        previous: Mapping[str, float],
        memory: Mapping[str, Any],
        params: Any,
    ) -> tuple[dict[str, float], Mapping[str, Any]]:
        return {j.job_id: params.shares[j.job_id] for j in jobs}, memory


def jobs_of(
    spec: str,
    *,
    done: Mapping[str, float] | None = None,
    arrivals: Mapping[str, float] | None = None,
) -> list[ActiveJob]:
    """``"a b:4 c"`` -> 1-GPU a, 4-GPU b, 1-GPU c, in that arrival order; ``done``: seconds of
    training each job has done so far (its finished epochs: an epoch takes 100 s here);
    ``arrivals``: a job's arrival time (default: its index in ``spec``, in seconds)."""
    work = done or {}
    arrived = arrivals or {}
    out = []
    for index, item in enumerate(spec.split()):
        job_id, _, width = item.partition(":")
        out.append(
            active_job(
                job_id,
                gpus=int(width or 1),
                arrival=arrived.get(job_id, float(index)),
                epochs_done=work.get(job_id, 0.0) / EPOCH_S,
            )
        )
    return out


def state_at(
    shares: Mapping[str, float],
    *,
    recomputed_at: float = 0.0,
    after_start: bool = False,
    deficit: Mapping[str, float] | None = None,
) -> PriorityState:
    """The mechanism's memory right after a recompute that gave ``shares``."""
    return PriorityState(
        allocation=MappingProxyType(dict(shares)),
        recomputed_at=recomputed_at,
        recomputed_after_start=after_start,
        job_set=frozenset(shares),
        received=MappingProxyType({k: 60.0 for k in shares}),
        deficit=MappingProxyType({k: 0.0 for k in shares} | dict(deficit or {})),
    )


def priority_state(decision: Decision) -> PriorityState:
    assert isinstance(decision.state, PriorityState)
    return decision.state


def gavel_params(**knobs: Any) -> MaxMinFairnessParams:
    return MaxMinFairnessParams(mechanism=TimeFractionParams(**knobs))


# --- when the allocation is recomputed --------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "expected_recomputed_at"),
    [
        pytest.param(
            [(0, "a"), (120, "a b"), (240, "a b c"), (1200, "a b c")],
            [0, 120, 120, 1200],
            id="start-first-after-start-gate-then-open",
        ),
        pytest.param(
            [(0, "a"), (120, "a"), (1200, "a"), (2400, "a")],
            [0, 0, 0, 0],
            id="no-change-no-recompute",
        ),
        pytest.param(
            [(0, "a b"), (120, "a b"), (240, "a")],
            [0, 0, 240],
            id="first-change-after-start-passes-gate",
        ),
        pytest.param(
            [(0, "a"), (120, "a b"), (1119, "a"), (1120, "a")],
            [0, 120, 120, 1120],
            id="gate-is-1000s-inclusive",
        ),
        pytest.param(
            [(0, "a"), (120, "a b"), (1080, "a b c"), (1100, "a b c d"), (1200, "a b c d")],
            [0, 120, 120, 120, 1200],
            id="changes-wait-for-the-gate",
        ),
        pytest.param(
            [(0, ""), (240, "a"), (360, "a b")],
            [None, 240, 240],
            id="first-recompute-after-start-closes-gate",
        ),
    ],
)
def test_recompute_only_on_change_and_past_the_gate(
    steps: list[tuple[float, str]], expected_recomputed_at: list[float | None]
) -> None:
    policy, params = MaxMinFairness(), gavel_params()
    state: object | None = None
    got: list[float | None] = []
    arrivals: dict[str, float] = {}
    last = None
    for now, spec in steps:
        for job_id in spec.split():  # arrives after the decision before the first step it is in
            arrivals.setdefault(job_id, 0.0 if last is None else last + 1)
        last = now
        jobs = jobs_of(spec, arrivals=arrivals)
        decision = policy.decide(snapshot(jobs, gpus=4, now=now, state=state), params)
        state = priority_state(decision)
        got.append(state.recomputed_at)
        if state.recomputed_at == now:
            assert state.job_set == {j.job_id for j in jobs}
            assert set(decision.allocation) == {j.job_id for j in jobs}
    assert got == expected_recomputed_at


def test_the_once_more_recompute_counts_from_the_first_arrival_on_any_clock() -> None:
    """The reference recomputes once more at the first change after time 0, its first job's
    arrival. With every arrival and decision 1 s or 1e9 s later (a trace that starts at 1 s,
    the service's Unix clock), the recomputes fall at the same times, shifted."""
    policy, params = MaxMinFairness(), gavel_params()
    for shift in (0.0, 1.0, 1e9):
        state: object | None = None
        got = []
        for now, spec in [(0.0, "a"), (120.0, "a b"), (240.0, "a b c"), (1200.0, "a b c")]:
            jobs = [
                dataclasses.replace(
                    j, spec=dataclasses.replace(j.spec, arrival_s=j.spec.arrival_s + shift)
                )
                for j in jobs_of(spec, arrivals={"c": 200.0})
            ]
            decision = policy.decide(snapshot(jobs, now=now + shift, state=state), params)
            state = priority_state(decision)
            got.append(state.recomputed_at)
        assert got == [shift, shift + 120, shift + 120, shift + 1200], shift


def test_deciding_a_round_again_replaces_the_earlier_decision() -> None:
    """The service plans the next round at every change: a job that arrives between two plans
    of the same round is in the round's recompute, as in the reference's one decision at the
    round's start, and the deficits are folded once."""
    policy, params = MaxMinFairness(), gavel_params()
    first = policy.decide(snapshot(jobs_of("a"), gpus=1, now=0), params)
    done = {"a": 120.0}
    early = policy.decide(
        snapshot(jobs_of("a b", done=done), gpus=1, now=120, state=first.state), params
    )
    assert priority_state(early).recomputed_at == 120  # b's arrival: the once-more recompute
    assert "c" not in early.allocation
    again = policy.decide(
        snapshot(jobs_of("a b c", done=done), gpus=1, now=120, state=early.state), params
    )
    once = policy.decide(
        snapshot(jobs_of("a b c", done=done), gpus=1, now=120, state=first.state), params
    )
    state, reference = priority_state(again), priority_state(once)
    assert state.recomputed_at == 120 and "c" in again.allocation
    assert dict(state.deficit) == pytest.approx(dict(reference.deficit))
    assert dict(state.allocation) == pytest.approx(dict(reference.allocation))
    assert again.jobs == once.jobs
    # twice more for the same round: the same decision, the deficit not folded again
    thrice = policy.decide(
        snapshot(jobs_of("a b c", done=done), gpus=1, now=120, state=again.state), params
    )
    assert dict(priority_state(thrice).deficit) == pytest.approx(dict(reference.deficit))
    # the next round starts from the round's last decision
    later = priority_state(
        policy.decide(
            snapshot(jobs_of("a b c d", done=done), gpus=1, now=240, state=thrice.state),
            params,
        )
    )
    assert later.recomputed_at == 120 and later.before is not None
    assert later.before.recomputed_at == 120 and later.before.before is None


def test_the_clock_is_the_start_of_the_round_decided() -> None:
    """A plan made ahead of its round (the service's) decides as of the round's start: the
    1000 s gate and the deficits count to it, not to when the plan was made."""
    policy, params = MaxMinFairness(), gavel_params()
    state: object | None = None
    for now, spec in [(0, "a"), (120, "a b")]:
        state = policy.decide(snapshot(jobs_of(spec), now=now, state=state), params).state
    ahead = dataclasses.replace(
        snapshot(jobs_of("a b c", arrivals={"c": 1000.0}), now=1100, state=state),
        round_index=10,
        round_start_s=1200,
    )
    assert ahead.round_start == 1200
    decided = priority_state(policy.decide(ahead, params))
    assert decided.recomputed_at == 1200 and decided.decided_round == 10
    too_early = dataclasses.replace(ahead, now=1100, round_index=9, round_start_s=1100)
    assert priority_state(policy.decide(too_early, params)).recomputed_at == 120


def test_a_plan_made_during_the_round_before_counts_a_running_job_served_to_its_end() -> None:
    """Planned 60 s before its round starts, a job running until then has 60 s of training
    still to come under its lease: the plan ranks it as served for them, as the reference's
    decision at the round's start does, so it does not keep its GPU for a second round where
    the reference rotates it out. A job not running gets nothing; deciding at the round's
    start (the simulator) adds nothing."""
    policy, params = MaxMinFairness(), gavel_params()
    first = policy.decide(snapshot(jobs_of("a b"), gpus=1, now=0), params)
    assert first.jobs == ("a",)

    def ran(done_a: float) -> list[ActiveJob]:
        a, b = jobs_of("a b", done={"a": done_a})
        return [dataclasses.replace(a, progress=dataclasses.replace(a.progress, gpus=(0,))), b]

    at_start = policy.decide(snapshot(ran(120.0), gpus=1, now=120, state=first.state), params)
    ahead = dataclasses.replace(
        snapshot(ran(60.0), gpus=1, now=60, state=first.state), round_index=1, round_start_s=120
    )
    planned = policy.decide(ahead, params)
    assert dict(priority_state(planned).received) == pytest.approx(
        dict(priority_state(at_start).received)
    )
    assert dict(priority_state(planned).received) == pytest.approx({"a": 180.0, "b": 60.0})
    assert planned.jobs == at_start.jobs == ("b",)


def test_a_job_the_shell_learnt_of_late_joins_the_recompute_it_arrived_before() -> None:
    """c arrives at 119 s, before the recompute at 120 s, but the shell decided round 120
    without it (the service plans a round ahead): the next decision makes that recompute again
    with c, at 120 s, as if c had been in it, without folding deficits twice or moving the
    gate, and later decisions see no change of jobs."""
    policy, params = MaxMinFairness(), gavel_params()
    arrivals = {"a": 0.0, "b": 60.0, "c": 119.0}
    state: object | None = None
    for now, spec in [(0, "a"), (120, "a b")]:
        state = policy.decide(
            snapshot(jobs_of(spec, arrivals=arrivals), now=now, state=state), params
        ).state
    known = priority_state(
        policy.decide(
            snapshot(
                jobs_of("a b c", arrivals=arrivals),
                now=120,
                state=policy.decide(snapshot(jobs_of("a", arrivals=arrivals), now=0), params).state,
            ),
            params,
        )
    )
    late = policy.decide(
        snapshot(jobs_of("a b c", arrivals=arrivals), now=240, state=state), params
    )
    again = priority_state(late)
    assert again.recomputed_at == 120
    assert dict(late.allocation) == pytest.approx(dict(known.allocation))
    assert dict(again.deficit) == pytest.approx(dict(known.deficit))
    assert again.job_set == {"a", "b", "c"}
    assert "c" in late.jobs
    later = policy.decide(
        snapshot(jobs_of("a b c", arrivals=arrivals), now=1200, state=again), params
    )
    assert priority_state(later).recomputed_at == 120  # no change of jobs: the gate stays shut


def test_job_arriving_behind_the_gate_waits_without_a_share() -> None:
    policy, params = MaxMinFairness(), gavel_params()
    state: object | None = None
    for now, spec in [(0, "a"), (120, "a b")]:
        state = policy.decide(snapshot(jobs_of(spec), now=now, state=state), params).state
    late = jobs_of("a b c", arrivals={"c": 200.0})
    decision = policy.decide(snapshot(late, now=240, state=state), params)
    assert "c" not in decision.allocation
    assert decision.jobs == ("a", "b")
    assert "arrived after the last allocation" in decision.reasons["c"]


def test_recompute_folds_service_into_deficit_and_resets_credit() -> None:
    policy, params = MaxMinFairness(), gavel_params()
    first = policy.decide(snapshot(jobs_of("a b"), gpus=1, now=0), params)
    assert dict(first.allocation) == {"a": 0.5, "b": 0.5}
    # a ran the whole round; c's arrival at 120 triggers the first recompute after the start.
    jobs = jobs_of("a b c", done={"a": 120.0})
    state = priority_state(
        policy.decide(snapshot(jobs, gpus=1, now=120, state=first.state), params)
    )
    assert state.recomputed_at == 120
    # deficit_j += x_j * 120 - (T_j - 60): a got 120 s against 60 owed, b nothing.
    assert dict(state.deficit) == pytest.approx({"a": -60.0, "b": 60.0, "c": 0.0})
    assert dict(state.received) == {"a": 60.0, "b": 60.0, "c": 60.0}
    assert dict(state.work_base) == pytest.approx({"a": 120.0, "b": 0.0, "c": 0.0})


def test_received_accumulates_between_recomputes() -> None:
    policy, params = MaxMinFairness(), gavel_params()
    state = policy.decide(snapshot(jobs_of("a b"), now=0), params).state
    for now in (120, 240):
        rounds = now // 120  # a trains 120 s a round, b 30 s
        jobs = jobs_of("a b", done={"a": 120.0 * rounds, "b": 30.0 * rounds})
        state = policy.decide(snapshot(jobs, now=now, state=state), params).state
    assert isinstance(state, PriorityState)
    assert dict(state.received) == pytest.approx({"a": 300.0, "b": 120.0})


def test_deciding_again_on_the_same_progress_counts_nothing_twice() -> None:
    """A shell may decide several times a round (the service plans on every change): the
    service a job received is read from its progress, so a repeat decision adds nothing."""
    policy, params = MaxMinFairness(), gavel_params()
    state = policy.decide(snapshot(jobs_of("a b"), now=0), params).state
    jobs = jobs_of("a b", done={"a": 120.0})
    for now in (120, 150, 180):
        state = policy.decide(snapshot(jobs, now=now, state=state), params).state
    assert isinstance(state, PriorityState)
    assert dict(state.received) == pytest.approx({"a": 180.0, "b": 60.0})


# --- ranking by x / T -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shares", "deficit", "done", "expected_order"),
    [
        pytest.param({"a": 0.5, "b": 0.5}, {}, {}, ("a", "b"), id="ties-in-arrival-order"),
        pytest.param(
            {"a": 0.5, "b": 0.5}, {}, {"a": 120.0}, ("b", "a"), id="ran-last-round-ranks-below"
        ),
        pytest.param({"a": 0.25, "b": 0.5}, {}, {}, ("b", "a"), id="larger-share-first"),
        pytest.param(
            {"a": 1.0, "b": 0.5}, {}, {"a": 120.0}, ("b", "a"), id="share-over-time-received"
        ),
        pytest.param(
            {"a": 0.5, "b": 0.5},
            {"a": -10.0, "b": 5.0},
            {},
            ("b", "a"),
            id="deficit-breaks-tie",
        ),
        pytest.param({"a": 0.5, "b": 1.0}, {}, {"b": 60.0}, ("b", "a"), id="share-breaks-tie"),
        pytest.param({"a": 0.0, "b": 0.1}, {}, {}, ("b", "a"), id="zero-share-ranks-last"),
        pytest.param(
            {"a": 0.0, "b": 0.0}, {"a": -60.0}, {}, ("b", "a"), id="zero-shares-by-deficit"
        ),
    ],
)
def test_jobs_rank_by_share_over_time_received(
    shares: dict[str, float],
    deficit: dict[str, float],
    done: dict[str, float],
    expected_order: tuple[str, ...],
) -> None:
    state = state_at(shares, deficit=deficit)
    snap = snapshot(jobs_of("a b", done=done), gpus=4, now=120, state=state)
    decision = FixedShares().decide(snap, FixedSharesParams(shares=shares))
    assert priority_state(decision).recomputed_at == 0, "the test meant no recompute"
    assert decision.jobs == expected_order


def with_stints(job: ActiveJob, *stints: Stint) -> ActiveJob:
    return dataclasses.replace(job, progress=dataclasses.replace(job.progress, stints=stints))


@pytest.mark.parametrize("given_stints", [False, True], ids=["from-progress", "from-stints"])
def test_received_service_counts_from_stints_where_the_shell_gives_them(
    given_stints: bool,
) -> None:
    """``a``'s reports say 150 s of training, ``b``'s none; the leases say ``b`` held the
    round just out (a start: 120 s less the 20 s restore) and ``a`` nothing. From progress
    ``b`` runs; from the stints ``a`` does, and the restore is taken off ``b``'s."""
    shares = {"a": 0.5, "b": 0.5}
    a, b = jobs_of("a b", done={"a": 150.0})
    if given_stints:
        a, b = with_stints(a), with_stints(b, Stint(0.0, 120.0, 120.0))
    snap = snapshot([a, b], gpus=1, now=120, state=state_at(shares))
    decision = FixedShares().decide(snap, FixedSharesParams(shares=shares))
    assert decision.jobs == (("a",) if given_stints else ("b",))
    received = priority_state(decision).received
    credit = TimeFractionParams().initial_credit_s
    expected = {"a": 0.0, "b": 100.0} if given_stints else {"a": 150.0, "b": 0.0}
    assert dict(received) == pytest.approx({j: credit + v for j, v in expected.items()})


@pytest.mark.parametrize("ran_first_round", [True, False], ids=["ran-first", "fresh"])
def test_a_first_decision_after_a_first_in_first_out_round_makes_the_reference_recompute_at_0(
    ran_first_round: bool,
) -> None:
    """The service's first round went first in, first out (no plan back yet): ``a`` held it
    (a start: 100 useful seconds), ``b`` arrived at 12 s. The reference recomputed at 0 with
    ``a`` alone (share 1) and again at 120 s, folding ``a``'s first round into its deficit:
    1 x 120 - 100 = 20. Where nobody ran yet, the first decision is the first recompute."""
    shares = {"a": 1.0, "b": 1.0}
    a, b = jobs_of("a b", arrivals={"a": 0.0, "b": 12.0})
    a = with_stints(a, *([Stint(0.0, 120.0, 120.0)] if ran_first_round else []))
    snap = snapshot([a, with_stints(b)], gpus=1, now=120)
    state = priority_state(FixedShares().decide(snap, FixedSharesParams(shares=shares)))
    assert state.recomputed_at == 120.0
    assert dict(state.deficit) == (
        {"a": 20.0, "b": 0.0} if ran_first_round else {"a": 0.0, "b": 0.0}
    )
    assert state.origin_s == 0.0


@pytest.mark.parametrize(
    ("ran_last_round", "expected"),
    [
        pytest.param({}, ("a",), id="fresh-tie-arrival-order"),
        pytest.param({"a": 120.0}, ("b",), id="a-ran-so-b-runs"),
        pytest.param({"b": 120.0}, ("a",), id="b-ran-so-a-runs"),
    ],
)
def test_gavel_alternates_equal_shares_on_one_gpu(
    ran_last_round: dict[str, float], expected: tuple[str, ...]
) -> None:
    policy, params = MaxMinFairness(), gavel_params()
    first = policy.decide(snapshot(jobs_of("a b"), gpus=1, now=0), params)
    assert first.jobs == ("a",)
    jobs = jobs_of("a b", done=ran_last_round)
    decision = policy.decide(snapshot(jobs, gpus=1, now=120, state=first.state), params)
    assert decision.jobs == expected
    assert set(decision.reasons) == {"a", "b"} - set(expected)


# --- the greedy walk --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "shares", "expected", "waiting"),
    [
        pytest.param(
            "a w:4 n",
            {"a": 1.0, "w": 1.0, "n": 0.5},
            ("a", "n"),
            {"w": "needs 4 GPUs, 3 left"},
            id="wide-skipped-narrow-backfills",
        ),
        pytest.param(
            "a w:4 n",
            {"a": 0.5, "w": 1.0, "n": 0.25},
            ("w",),
            {"a": "needs 1 GPUs, 0 left", "n": "needs 1 GPUs, 0 left"},
            id="wide-first-takes-all",
        ),
        pytest.param(
            "a:2 b:4 c:2 d",
            {"a": 1.0, "b": 0.9, "c": 0.8, "d": 0.7},
            ("a", "c"),
            {"b": "needs 4 GPUs, 2 left", "d": "needs 1 GPUs, 0 left"},
            id="two-wide-fill-cluster",
        ),
    ],
)
def test_greedy_walk_skips_gangs_that_do_not_fit(
    spec: str, shares: dict[str, float], expected: tuple[str, ...], waiting: dict[str, str]
) -> None:
    decision = FixedShares().decide(snapshot(jobs_of(spec), gpus=4), FixedSharesParams(shares))
    assert decision.jobs == expected
    assert set(decision.reasons) == set(waiting)
    for job_id, reason in waiting.items():
        assert reason in decision.reasons[job_id]


@pytest.mark.parametrize(
    ("hold", "expected"),
    [
        pytest.param(True, ("a",), id="absent-job-holds-its-gpu"),
        pytest.param(False, ("a", "b"), id="absent-job-gpu-goes-to-others"),
    ],
)
def test_absent_job_is_never_chosen(hold: bool, expected: tuple[str, ...]) -> None:
    # b has no share and ran more than owed (negative deficit), so c, new since the last
    # recompute at 120 and behind the gate, ranks above it.
    state = state_at({"a": 1.0, "b": 0.0}, recomputed_at=120, after_start=True, deficit={"b": -60})
    snap = snapshot(jobs_of("a b c", arrivals={"c": 200.0}), gpus=2, now=240, state=state)
    params = FixedSharesParams(
        shares={"a": 1.0, "b": 0.0, "c": 1.0},
        mechanism=TimeFractionParams(absent_jobs_hold_gpus=hold),
    )
    decision = FixedShares().decide(snap, params)
    assert priority_state(decision).recomputed_at == 120
    assert decision.jobs == expected
    assert "c" not in decision.jobs
    assert "arrived after the last allocation" in decision.reasons["c"]
    assert set(decision.reasons) == {"a", "b", "c"} - set(expected)
