""" "Why am I waiting": a job's predicted trajectory, remaining time and fairness, from the core.

The shell gathers the job's row, its client events and the cluster's load, builds the same
:class:`~shockwave.snapshot.ActiveJob` a policy sees, and calls the core's predictor (the one the
Shockwave policy plans with: the paper's rule updated by the population prior learnt from the
jobs that succeeded, :mod:`store.population`; epoch times at unseen batch sizes from the throughput
model of the measured rates) and finish-time-fairness estimator (paper appendix). Two
simplifications, stated so nobody reads more into the numbers than there is:

- the contention factor is today's (active jobs per READY GPU, at least 1), not its average over
  the job's life, which needs the round history the round driver will keep;
- ``planned_rounds`` are the rounds the freshest stored plan (highest state version, then
  newest) gives the job from the current round on; with no plan stored yet it is empty and
  ``reason`` says so: this endpoint does not invent a schedule.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sqlmodel import Session

from api.schemas import PredictionPublic, RegimePublic
from shockwave.estimators import finish_time_fairness
from shockwave.lifecycle import JobState
from shockwave.population_predictor import PopulationParams
from shockwave.predictor import PredictorParams
from shockwave.regime_predictors import DEFAULT_REGIME_PREDICTOR, REGIME_PREDICTORS
from shockwave.snapshot import ActiveJob
from shockwave.throughput_model import ThroughputModel
from store import cluster, events, plans, population
from store.cluster_version import DEFAULT_CLUSTER
from store.snapshot import waiting_reason
from store.tables import ClusterRow, JobRow

NO_PLAN_REASON = "no plan yet: the solver service has not planned this job"

Source = Literal["measured", "declared", "estimated"]


def explain(
    session: Session, row: JobRow, now: datetime, params: PredictorParams | None = None
) -> PredictionPublic:
    """The prediction for the job in ``row`` at time ``now`` (timezone-aware)."""
    job = events.active_job(row)
    prior = population.load_prior(session)
    rates = ThroughputModel.build(prior, [job])
    predictor = REGIME_PREDICTORS[DEFAULT_REGIME_PREDICTOR]
    prediction = predictor(job, prior, rates, params or PredictorParams(), PopulationParams())
    job_state = JobState(row.state)
    finished = job_state.terminal
    remaining = 0.0 if finished else prediction.remaining_seconds
    end = row.updated_at if finished else now
    age = max(0.0, (end - row.created_at).total_seconds())
    factor = cluster.contention(session)
    planned, why = planned_rounds(session, row.id)
    why = waiting_reason(session, row) or why
    regimes = [
        RegimePublic(
            batch_size=r.batch_size,
            epochs=r.epochs,
            epoch_seconds=r.epoch_seconds,
            phase=_phase(i, prediction.current),
            epoch_seconds_source=_source(rates, job, r.batch_size),
        )
        for i, r in enumerate(prediction.regimes)
    ]
    return PredictionPublic(
        job_id=row.id,
        state=job_state,
        epochs=row.epochs,
        epochs_done=prediction.epochs_done,
        batch_size=job.progress.batch_size,
        regimes=regimes,
        remaining_seconds=remaining,
        total_seconds=prediction.total_seconds,
        attained_s=job.progress.attained_s,
        age_s=age,
        ftf_estimate=finish_time_fairness(age, remaining, prediction.total_seconds, factor),
        contention=factor,
        planned_rounds=[] if finished else planned,
        reason=f"the job is {job_state.value}: nothing left to plan" if finished else why,
    )


def planned_rounds(session: Session, job_id: str) -> tuple[list[int], str]:
    """The round indices the freshest plan gives ``job_id`` (current round on), and why."""
    cluster_row = session.get(ClusterRow, DEFAULT_CLUSTER)
    plan = plans.newest_plan(session, DEFAULT_CLUSTER)
    if plan is None:
        return [], NO_PLAN_REASON
    current = cluster_row.current_round if cluster_row is not None else -1
    rounds = [
        plan.base_round + t
        for t, members in enumerate(plan.rounds)
        if job_id in members and plan.base_round + t >= current
    ]
    last = plan.base_round + len(plan.rounds) - 1
    if rounds:
        return rounds, f"planned for {len(rounds)} of the plan's rounds up to round {last}"
    return [], f"not planned in the current plan (rounds {plan.base_round} to {last})"


def _phase(index: int, current: int) -> Literal["past", "current", "future"]:
    if index < current:
        return "past"
    return "current" if index == current else "future"


def _source(rates: ThroughputModel, job: ActiveJob, batch_size: int) -> Source:
    """Where the epoch time comes from: the job's own measurement, its declaration, or an
    estimate (other jobs' measurements, a scaling law, or the default guess)."""
    estimate = rates.epoch_time(job, batch_size)
    if estimate is not None and estimate.source in ("measured", "declared"):
        return estimate.source
    return "estimated"
