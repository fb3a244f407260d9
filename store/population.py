"""Each tenant's population prior in the database: learnt online from its jobs that succeed.

The predictor the Shockwave policy plans with (:mod:`shockwave.prediction.population_predictor`)
starts each job from what the jobs that finished before it did. Here that knowledge lives in one
``population_priors`` row per cluster and tenant. Per tenant because a job's epochs are its own
process's reports (self-reported, unverified): a shared prior would tell one tenant another's
model names and speeds, and let a tenant skew another's predictions with made-up epochs. A
tenant's jobs learn from its own jobs only:

- :func:`learn_succeeded` adds a job that has just succeeded, in the transaction that records
  its success (so a job is learnt exactly once, and only if its success commits): its whole
  observed trajectory (the regimes its scaling events cut, the last one running to its last
  epoch) and the epoch times it measured. The row is locked while it is rewritten; successes are
  rare next to progress events, and the lock is taken before the cluster row (bumped at commit),
  as every writer of both takes them.
- :func:`load_prior` / :func:`load_priors` read them for the solver's snapshot and the
  prediction endpoint; a missing or unreadable row is the empty prior (the paper's rule),
  never an error.

Domain values only: no HTTP here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from shockwave.domain.model import Regime
from shockwave.domain.observed import Observed
from shockwave.domain.population import EMPTY_PRIOR, FinishedJob, PopulationPrior, PriorFormatError
from store import events
from store.cluster_version import DEFAULT_CLUSTER, ensure_cluster
from store.jobs import load_rest
from store.tables import JobRow, PopulationRow, utcnow

log = logging.getLogger(__name__)


def finished_job(row: JobRow, state: Observed) -> FinishedJob:
    """What the scheduler saw of a job that succeeded: its regimes, the last one running from
    its last batch-size change to its last epoch, and its measured epoch times."""
    regimes = list(state.observed_regimes)
    left = row.epochs - sum(r.epochs for r in regimes)
    if left > 0:
        regimes.append(Regime(state.batch_size, left))
    return FinishedJob(events.spec_of_row(row), tuple(regimes), dict(state.measured_epoch_seconds))


def learn_succeeded(session: Session, row: JobRow, cluster_id: str = DEFAULT_CLUSTER) -> None:
    """Learn the job in ``row``, which has just succeeded, into its tenant's prior (in the
    caller's transaction)."""
    load_rest(session, row)  # a poll reads only part of a job's row (store.jobs.POLLED)
    finished = finished_job(row, events.observed_of(row))
    _ensure_row(session, cluster_id, row.tenant)
    stored = session.get(
        PopulationRow, (cluster_id, row.tenant), with_for_update=True, populate_existing=True
    )
    assert stored is not None, f"population prior of {cluster_id}/{row.tenant} vanished"
    prior = _decoded(stored).learn(finished)
    stored.prior = prior.as_json()
    stored.learnt = prior.learnt
    stored.updated_at = utcnow()
    session.add(stored)


def load_prior(session: Session, tenant: str, cluster_id: str = DEFAULT_CLUSTER) -> PopulationPrior:
    """``tenant``'s prior; the empty prior when none has been learnt or it is unreadable."""
    stored = session.get(PopulationRow, (cluster_id, tenant))
    return EMPTY_PRIOR if stored is None else _decoded(stored)


def load_priors(
    session: Session, tenants: Iterable[str], cluster_id: str = DEFAULT_CLUSTER
) -> dict[str, PopulationPrior]:
    """The priors of ``tenants`` (each the empty prior when none has been learnt)."""
    wanted = sorted(set(tenants))
    priors = dict.fromkeys(wanted, EMPTY_PRIOR)
    if not wanted:
        return priors
    rows = session.exec(
        select(PopulationRow).where(
            PopulationRow.cluster_id == cluster_id, col(PopulationRow.tenant).in_(wanted)
        )
    ).all()
    for stored in rows:
        priors[stored.tenant] = _decoded(stored)
    return priors


def _decoded(stored: PopulationRow) -> PopulationPrior:
    if not stored.prior:
        return EMPTY_PRIOR
    try:
        return PopulationPrior.from_json(stored.prior)
    except PriorFormatError as error:
        log.warning(
            "cluster %s, tenant %s: discarding an unreadable population prior: %s",
            stored.cluster_id,
            stored.tenant,
            error,
        )
        return EMPTY_PRIOR


def _ensure_row(session: Session, cluster_id: str, tenant: str) -> None:
    """Create the tenant's (empty) prior row if it does not exist (safe under races)."""
    ensure_cluster(session, cluster_id)
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    values = PopulationRow(cluster_id=cluster_id, tenant=tenant, prior={}).model_dump()
    session.execute(insert(PopulationRow).values(**values).on_conflict_do_nothing())
