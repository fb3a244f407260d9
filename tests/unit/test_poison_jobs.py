"""No poison job (issue 16, finding 2): a submission whose numbers break the planner is refused
by the core's physical bounds, and a job that still cannot be modelled (stored before the
bounds existed) is left out of the decision with a reason while the others are planned.
Hypothesis feeds every registered policy extreme but valid jobs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shockwave.domain.model import (
    MAX_RATE,
    MAX_RUN_SECONDS,
    MAX_TOTAL_SAMPLES,
    MIN_RATE,
    VALID_WIDTHS,
    AdaptationMode,
    JobSpec,
    ThroughputProfile,
    ValidationError,
)
from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.market.planner import PlannerParams
from shockwave.policies.policy import decide_isolating, get_policy, make_params, policy_names
from tests.builders import active_job, snapshot

FAST = {"shockwave": {"planner": PlannerParams(rounds=10, time_limit_s=1.0)}}
"""A short window and solver limit: the property is about the model, not the solve."""


def _spec(**overrides: object) -> JobSpec:
    fields: dict[str, object] = {
        "job_id": "tiny",
        "gpus": 1,
        "epochs": 1,
        "samples_per_epoch": 1000,
        "initial_batch_size": 32,
    }
    fields.update(overrides)
    return JobSpec(**fields)  # type: ignore[arg-type]


def test_the_reported_poison_submission_is_refused_naming_the_throughput() -> None:
    try:
        _spec(samples_per_epoch=2147483647, throughput=ThroughputProfile({32: 1e-300}))
    except ValidationError as error:
        assert error.field == "throughput[32]"
    else:
        raise AssertionError("a rate of 1e-300 samples/s was accepted")


def test_bounds_refuse_too_many_samples_and_too_long_a_run() -> None:
    for overrides, field in (
        ({"epochs": 2_000_000, "samples_per_epoch": 2_000_000}, "samples_per_epoch"),
        ({"throughput": {32: MAX_RATE * 10}}, "throughput[32]"),
        ({"samples_per_epoch": 10**9, "throughput": {32: 0.5}}, "throughput[32]"),
        ({"budget": 1e300}, "budget"),
    ):
        try:
            if "throughput" in overrides:
                overrides = {**overrides, "throughput": ThroughputProfile(overrides["throughput"])}  # type: ignore[arg-type]
            _spec(**overrides)
        except ValidationError as error:
            assert error.field == field, (overrides, error)
        else:
            raise AssertionError(f"{overrides} was accepted")


def _poisoned(job_id: str) -> ActiveJob:
    """A job stored before the bounds existed: the reported submission, its profile forced."""
    spec = _spec(job_id=job_id, samples_per_epoch=2147483647)
    object.__setattr__(spec.throughput, "samples_per_second", {32: 1e-300})
    return ActiveJob(spec=spec, progress=JobProgress(batch_size=32))


def test_a_job_that_cannot_be_modelled_is_left_out_and_the_rest_are_planned() -> None:
    policy = get_policy("shockwave")
    params = make_params(policy, FAST["shockwave"])
    jobs = [active_job("a"), _poisoned("poison"), active_job("b")]
    view = snapshot(jobs, gpus=4)
    try:
        policy.decide(view, params)
    except OverflowError:
        pass
    else:
        raise AssertionError("the poisoned job no longer breaks the policy: test needs a new one")

    decision = decide_isolating(policy, view, params)

    assert set(decision.jobs) == {"a", "b"}
    assert set(decision.excluded) == {"poison"}
    assert "cannot model" in decision.excluded["poison"]
    assert all("poison" not in column for column in decision.rounds)


@st.composite
def extreme_jobs(draw: st.DrawFn, job_id: str) -> ActiveJob:
    """A valid job at the edges of the bounds: huge or tiny epochs, samples and rates."""
    epochs = draw(st.sampled_from([1, 2, 1000, 2**31 - 1]))
    most = max(1, min(2**31 - 1, MAX_TOTAL_SAMPLES // epochs))
    samples = draw(st.sampled_from([1, 7, most]))
    batch = draw(st.sampled_from([1, 32, 2**31 - 1]))
    slowest = epochs * samples / MAX_RUN_SECONDS
    rate = draw(st.sampled_from([max(MIN_RATE, slowest), 1.0, MAX_RATE]))
    declared = draw(st.booleans())
    mode = draw(st.sampled_from([AdaptationMode.STATIC, AdaptationMode.GNS]))
    spec = JobSpec(
        job_id=job_id,
        gpus=draw(st.sampled_from([w for w in VALID_WIDTHS if w <= 8])),  # fits the cluster
        epochs=epochs,
        samples_per_epoch=samples,
        initial_batch_size=batch,
        mode=mode,
        throughput=ThroughputProfile({batch: max(rate, slowest)} if declared else {}),
        budget=draw(st.sampled_from([1e-6, 1.0, 1e6])),
        arrival_s=draw(st.sampled_from([0.0, 1e6])),
    )
    done = draw(st.sampled_from([0.0, epochs / 2, float(epochs)]))
    return ActiveJob(spec=spec, progress=JobProgress(batch_size=batch, epochs_done=done))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_policy_decides_validly_for_extreme_but_valid_jobs(data: st.DataObject) -> None:
    jobs = [data.draw(extreme_jobs(f"j{i}")) for i in range(3)] + [active_job("plain")]
    now = max(job.spec.arrival_s for job in jobs) + 120.0
    view: Snapshot = snapshot(jobs, gpus=8, per_node=4, now=now)
    for name in policy_names():
        policy = get_policy(name)
        decision = policy.decide(view, make_params(policy, FAST.get(name, {})))

        widths = {job.job_id: job.spec.gpus for job in jobs}
        assert set(decision.jobs) <= set(widths), name
        assert sum(widths[j] for j in decision.jobs) <= 8, name
        assert len(set(decision.jobs)) == len(decision.jobs), name
        assert not decision.excluded, name
