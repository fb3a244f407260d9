""" "Why am I waiting": a job's predicted trajectory, remaining time and fairness, from the core.

The shell gathers the job's row, its client events and the cluster's load, builds the same
:class:`~shockwave.domain.snapshot.ActiveJob` a policy sees, and calls the core's predictor (the one
the Shockwave policy plans with: the paper's rule updated by the population prior learnt from the
job's tenant's jobs that succeeded, :mod:`store.population`; epoch times at unseen batch sizes
from the throughput model of the tenant's measured rates) and finish-time-fairness estimator
(paper appendix). Two simplifications, stated so nobody reads more into the numbers than there
is:

- the contention factor is today's (active jobs per READY GPU, at least 1), not its average over
  the job's life, which needs the round history the round driver will keep;
- ``planned_rounds`` are the rounds the freshest stored plan (highest state version, then
  newest) gives the job from the current round on; with no plan stored yet it is empty: this
  endpoint does not invent a schedule. ``cause`` and ``reason`` say why the job does not run
  now, by the core's one rule (:mod:`shockwave.domain.waiting`: no READY node comes before "no
  plan").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlmodel import Session

from api.schemas import PredictionPublic, QueueEntry, RegimePublic
from shockwave.domain.lifecycle import JobState
from shockwave.domain.population import PopulationPrior
from shockwave.domain.snapshot import ActiveJob
from shockwave.domain.tenancy import is_single_tenant
from shockwave.domain.waiting import Gpus, PlanView, why_waiting
from shockwave.market.estimators import finish_time_fairness
from shockwave.prediction.population_predictor import PopulationParams, apart_params
from shockwave.prediction.predictor import PredictorParams
from shockwave.prediction.regime_predictors import DEFAULT_REGIME_PREDICTOR, REGIME_PREDICTORS
from shockwave.prediction.throughput_model import ThroughputModel
from store import cluster, events, plans, population, tenants, views
from store.cluster_version import DEFAULT_CLUSTER
from store.principals import Principal
from store.snapshot import TenantHold, active_job_rows, at_limit, tenant_usage
from store.tables import ClusterRow, JobRow, PlanRow

Source = Literal["measured", "declared", "estimated"]


@dataclass(frozen=True, slots=True)
class Context:
    """What every job's prediction shares, read once: the contention factor, the GPUs by kind,
    the current round, the freshest plan and the GPUs each tenant holds against its
    ``max_gpus`` (None: no tenant has one); and each tenant's population prior, read when a job
    of the tenant first needs it (a job learns from its own tenant's jobs only). ``apart``:
    more than one tenant has active jobs (or limits), so that a tenant's prior leans on the
    paper's rule as the policy's does (:meth:`shockwave.domain.snapshot.Snapshot.learns_apart`)."""

    priors: dict[str, PopulationPrior]
    contention: float
    gpus: Gpus
    current: int
    plan: PlanRow | None
    usage: TenantHold | None = None
    apart: bool = False

    @classmethod
    def load(cls, session: Session) -> Context:
        cluster_row = session.get(ClusterRow, DEFAULT_CLUSTER)
        return cls(
            priors={},
            contention=cluster.contention(session),
            gpus=cluster.gpus_by_kind(session),
            current=cluster_row.current_round if cluster_row is not None else -1,
            plan=plans.newest_plan(session, DEFAULT_CLUSTER),
            usage=tenant_usage(session),
            apart=not is_single_tenant(
                tenants.core_tenants(session), {row.tenant for row in active_job_rows(session)}
            ),
        )

    def prior(self, session: Session, tenant: str) -> PopulationPrior:
        """``tenant``'s prior (read once per context)."""
        if tenant not in self.priors:
            self.priors[tenant] = population.load_prior(session, tenant)
        return self.priors[tenant]

    def plan_view(self, job_id: str) -> PlanView | None:
        """What the freshest plan gives ``job_id`` (its rounds from the current one on); None
        before any plan is stored."""
        plan = self.plan
        if plan is None:
            return None
        rounds = [
            plan.base_round + t
            for t, members in enumerate(plan.rounds)
            if job_id in members and plan.base_round + t >= self.current
        ]
        last = plan.base_round + len(plan.rounds) - 1
        kind = (plan.types or {}).get(job_id)
        return PlanView(rounds=rounds, first=plan.base_round, last=last, gpu_type=kind)


def explain(
    session: Session,
    row: JobRow,
    now: datetime,
    params: PredictorParams | None = None,
    context: Context | None = None,
) -> PredictionPublic:
    """The prediction for the job in ``row`` at time ``now`` (timezone-aware); ``context``:
    what it shares with other jobs' predictions (read here when not given)."""
    context = context or Context.load(session)
    job = events.active_job(row)
    prior = context.prior(session, row.tenant)
    rates = ThroughputModel.build(prior, [job])
    predictor = REGIME_PREDICTORS[DEFAULT_REGIME_PREDICTOR]
    knobs = PopulationParams()
    if context.apart:
        knobs = apart_params(knobs, prior.learnt)
    prediction = predictor(job, prior, rates, params or PredictorParams(), knobs)
    job_state = JobState(row.state)
    finished = job_state.terminal
    remaining = 0.0 if finished else prediction.remaining_seconds
    end = row.updated_at if finished else now
    age = max(0.0, (end - row.created_at).total_seconds())
    factor = context.contention
    plan = context.plan_view(row.id)
    why = why_waiting(job_state, row.gpus, context.gpus, plan, at_limit(context.usage, row))
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
        planned_rounds=[] if finished or plan is None else list(plan.rounds),
        planned_gpu_type=None if finished or plan is None else plan.gpu_type,
        cause=why.cause,
        reason=why.reason,
    )


def queue(session: Session, principal: Principal, now: datetime, limit: int) -> list[QueueEntry]:
    """The caller's active jobs, oldest first, each with its prediction and expected start and
    finish: a running job finishes its remaining time from now; a waiting one starts at its
    first planned round's start (round length times rounds ahead) and finishes its remaining
    time later, as if it then ran without a break (None while the plan does not name it)."""
    context = Context.load(session)
    timing = views.timing(session)
    entries: list[QueueEntry] = []
    for row in views.active_jobs(session, principal, limit):
        p = explain(session, row, now, context=context)
        start: datetime | None = None
        if p.state is JobState.RUNNING:
            start = now
        elif p.planned_rounds and timing.started_at is not None:
            ahead = max(0, p.planned_rounds[0] - timing.current)
            start = max(now, timing.started_at + timedelta(seconds=ahead * timing.round_seconds))
        remaining = _finite(p.remaining_seconds)
        finish = (
            None if start is None or remaining is None else start + timedelta(seconds=remaining)
        )
        entries.append(
            QueueEntry(
                job_id=row.id,
                name=row.name,
                tenant=row.tenant,
                state=p.state,
                gpus=row.gpus,
                batch_size=p.batch_size,
                epochs=row.epochs,
                epochs_done=p.epochs_done,
                ftf_estimate=_finite(p.ftf_estimate),
                remaining_seconds=remaining,
                predicted_start=start,
                predicted_finish=finish,
                cause=p.cause,
                reason=p.reason,
            )
        )
    return entries


def _finite(value: float) -> float | None:
    """``value``, or None where it is not a finite number (a job whose declared rates make its
    remaining time unbounded): JSON has no infinity."""
    return value if math.isfinite(value) else None


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
