"""Heterogeneous clusters: GPU types, a job's speed on each type, and the shared yardsticks.

A typed cluster (:class:`~shockwave.domain.model.Cluster` with ``node_types``) has nodes of named
GPU types (``v100``, ``p100``, ``k80``); a gang runs on GPUs of one type. A job's declared
``throughput`` is on the *reference* type (the throughput file's default); its
``type_throughput`` gives the other types, and a type it says nothing about runs at the
reference speed. What a policy uses is the job's **relative speed** on a type:

    s_j(T, b) = rate_j(T, b) / rate_j(ref, b)      (b: batch size; measured beats declared)

so one second on a GPU of type T does s_j(T) seconds of reference-type work. When a type's
rate at b is unknown, the mean ratio over the batch sizes both know stands in (1 with none).

The yardsticks every policy is judged by (docs/heterogeneity.md), defined here once:

- A job's **exclusive run time** on a typed cluster is its run time alone on the cluster's
  *average GPU*: one whose rate at every batch size is the capacity-weighted mean of the types'
  rates, sum_T (M_T / M) rate_j(T, b). It is what an equal 1/N share of every type gives a
  job, so finish-time fairness rho = JCT / (t_exclusive x max(1, N / G)) keeps its meaning:
  rho <= 1 is doing at least as well as an equal share of the whole cluster.
- The **makespan lower bound** counts every job at its fastest type.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shockwave.domain.model import Cluster, JobSpec, ThroughputProfile, ValidationError
from shockwave.domain.snapshot import ActiveJob, JobProgress, Snapshot
from shockwave.workloads.workload import SimJob, Workload


def parse_typed_gpus(text: str, gpus_per_node: int) -> Cluster:
    """``"v100:12,p100:12,k80:8"`` in nodes of ``gpus_per_node``: a typed cluster whose nodes
    are listed type by type in the order given."""
    sizes: list[int] = []
    kinds: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        kind, sep, count = part.partition(":")
        kind = kind.strip().lower()
        if not sep or not kind or not count.strip().isdigit():
            raise ValidationError("gpus", f"{part!r} is not TYPE:COUNT (e.g. v100:12), in {text!r}")
        gpus = int(count)
        if gpus <= 0 or gpus % gpus_per_node:
            raise ValidationError(
                "gpus", f"{part!r}: {gpus} GPUs do not divide into nodes of {gpus_per_node}"
            )
        if kind in kinds:
            raise ValidationError("gpus", f"GPU type {kind!r} is given twice in {text!r}")
        sizes += [gpus_per_node] * (gpus // gpus_per_node)
        kinds += [kind] * (gpus // gpus_per_node)
    return Cluster(tuple(sizes), tuple(kinds))


def parse_typed_nodes(text: str) -> Cluster:
    """A node list with types, ``COUNTxGPUS:TYPE`` comma-separated (``2x8:v100,3x4:k80``)."""
    sizes: list[int] = []
    kinds: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        shape, sep, kind = part.partition(":")
        if not sep or not kind.strip():
            raise ValidationError("nodes", f"{part!r} is not COUNTxGPUS:TYPE, in {text!r}")
        nodes = Cluster.parse(shape)
        sizes += nodes.node_gpus
        kinds += [kind.strip().lower()] * nodes.nodes
    return Cluster(tuple(sizes), tuple(kinds))


def untyped(cluster: Cluster) -> Cluster:
    """The same nodes with their types forgotten (what a heterogeneity-agnostic policy sees)."""
    return Cluster(cluster.node_gpus) if cluster.is_typed else cluster


def capacity_shares(cluster: Cluster) -> dict[str, float]:
    """M_T / M for each type of ``cluster`` (empty when untyped)."""
    total = cluster.total_gpus
    return {t: cluster.gpus_of_type(t) / total for t in cluster.gpu_types}


# ------------------------------------------------------------------------- a job's speed by type


def _ratio(type_rates: Mapping[int, float], ref_rates: Mapping[int, float], bs: int) -> float:
    if bs in type_rates and bs in ref_rates:
        return type_rates[bs] / ref_rates[bs]
    common = [b for b in type_rates if b in ref_rates]
    if not common:
        return 1.0
    return sum(type_rates[b] / ref_rates[b] for b in common) / len(common)


def type_speed(job: ActiveJob, gpu_type: str, batch_size: int | None = None) -> float:
    """s_j(T, b): the job's speed on ``gpu_type`` relative to the reference type (module
    docstring); a measurement on the type wins over the declared profile."""
    bs = job.progress.batch_size if batch_size is None else batch_size
    spe = job.spec.samples_per_epoch
    ref: dict[int, float] = {b: r for b, r in job.spec.throughput.samples_per_second.items()}
    ref.update({b: spe / s for b, s in job.progress.measured_epoch_seconds.items() if s > 0})
    declared = job.spec.type_throughput.get(gpu_type)
    measured = job.progress.measured_by_type.get(gpu_type, {})
    if declared is None and not measured:
        return 1.0
    rates: dict[int, float] = dict(declared.samples_per_second) if declared else {}
    rates.update({b: spe / s for b, s in measured.items() if s > 0})
    if not ref:
        return 1.0
    return max(1e-6, _ratio(rates, ref, bs))


def speeds(job: ActiveJob, cluster: Cluster) -> dict[str, float]:
    """s_j(T) at the job's current batch size for every type of ``cluster``."""
    return {t: type_speed(job, t) for t in cluster.gpu_types}


def mean_speed(job: ActiveJob, cluster: Cluster) -> float:
    """The job's speed on the cluster's average GPU: sum_T (M_T / M) s_j(T) (1 untyped)."""
    if not cluster.is_typed:
        return 1.0
    return sum(share * type_speed(job, t) for t, share in capacity_shares(cluster).items())


def agnostic_view(snapshot: Snapshot) -> Snapshot:
    """The snapshot a heterogeneity-agnostic policy sees: no node types, no per-type
    knowledge; every GPU looks like the reference type."""
    jobs = tuple(
        ActiveJob(
            dataclasses.replace(job.spec, type_throughput={}),
            dataclasses.replace(job.progress, measured_by_type={}),
        )
        for job in snapshot.jobs
    )
    return dataclasses.replace(snapshot, cluster=untyped(snapshot.cluster), jobs=jobs)


# ------------------------------------------------------------------------ simulator ground truth


def true_epoch_seconds(sim: SimJob, gpu_type: str, batch_size: int) -> float:
    """Seconds per epoch of ``sim`` at ``batch_size`` on ``gpu_type`` (the reference's when
    the job has no figures for the type)."""
    by_type = sim.epoch_seconds_by_type.get(gpu_type)
    if by_type is None:
        return sim.epoch_seconds[batch_size]
    return by_type[batch_size]


def typed_job(sim: SimJob, profiles: Mapping[str, ThroughputProfile], reference: str) -> SimJob:
    """``sim`` with its throughput on each type of ``profiles`` (samples/s of its gang by batch
    size, as the throughput file gives them): declared in the spec, and true epoch times
    derived from its reference-type ones, e_T(b) = e_ref(b) / s(T, b), with the fallback of
    :func:`_ratio` where the type's table lacks b (the table measured nothing there, so the
    job is assumed to run there as fast as at its known sizes, on average)."""
    ref = dict(sim.spec.throughput.samples_per_second)
    declared = {t: p for t, p in profiles.items() if t != reference and p.samples_per_second}
    truth = {
        t: {
            bs: seconds / _ratio(dict(p.samples_per_second), ref, bs)
            for bs, seconds in sim.epoch_seconds.items()
        }
        for t, p in declared.items()
    }
    spec = dataclasses.replace(sim.spec, type_throughput=declared)
    return dataclasses.replace(sim, spec=spec, epoch_seconds_by_type=truth)


def t_exclusive_s(sim: SimJob, cluster: Cluster) -> float:
    """The job's exclusive run time on ``cluster`` (module docstring): on the average GPU of a
    typed cluster, on its own GPUs otherwise."""
    if not cluster.is_typed:
        return sim.t_exclusive_s
    shares = capacity_shares(cluster)
    total = 0.0
    for regime in sim.trajectory:
        rate = sum(
            share / true_epoch_seconds(sim, t, regime.batch_size) for t, share in shares.items()
        )
        total += regime.epochs / rate
    return total


def fastest_run_s(sim: SimJob, cluster: Cluster) -> float:
    """Run time alone at the fastest type of ``cluster`` for each regime."""
    if not cluster.is_typed:
        return sim.t_exclusive_s
    return sum(
        r.epochs * min(true_epoch_seconds(sim, t, r.batch_size) for t in cluster.gpu_types)
        for r in sim.trajectory
    )


def makespan_lower_bound(workload: Workload, cluster: Cluster) -> float:
    """max(GPU-seconds at each job's fastest type / GPUs, latest arrival + fastest run)."""
    if not cluster.is_typed:
        return workload.makespan_lower_bound(cluster.total_gpus)
    if not workload.jobs:
        return 0.0
    runs = [fastest_run_s(j, cluster) for j in workload.jobs]
    work = sum(r * j.spec.gpus for r, j in zip(runs, workload.jobs, strict=True))
    critical = max(j.spec.arrival_s + r for r, j in zip(runs, workload.jobs, strict=True))
    return max(work / cluster.total_gpus, critical)


def check_fits_typed(spec: JobSpec, cluster: Cluster) -> None:
    """Raise when no single type of ``cluster`` has GPUs enough for the job's gang."""
    if not cluster.is_typed:
        spec.check_fits(cluster)
        return
    widest = max(cluster.gpus_of_type(t) for t in cluster.gpu_types)
    if spec.gpus > widest:
        raise ValidationError(
            "gpus",
            f"job {spec.job_id} asks for {spec.gpus} GPUs but no GPU type has that many "
            f"(largest: {widest}); a gang runs on one type",
        )


def progress_with_measurement(
    progress: JobProgress, gpu_type: str, measured: Mapping[int, float]
) -> JobProgress:
    """``progress`` with epoch times measured on a non-reference ``gpu_type`` recorded."""
    by_type = {t: dict(m) for t, m in progress.measured_by_type.items()}
    by_type.setdefault(gpu_type, {}).update(measured)
    return dataclasses.replace(progress, measured_by_type=by_type)


def order_types(job_speeds: Sequence[Mapping[str, float]], types: Sequence[str]) -> list[str]:
    """Types fastest first by the jobs' mean speed there (ties in ``types`` order)."""

    def mean(t: str) -> float:
        return sum(s.get(t, 1.0) for s in job_speeds) / max(1, len(job_speeds))

    return sorted(types, key=lambda t: (-mean(t), types.index(t)))


def typed_workload(
    workload: Workload,
    profiles: Mapping[str, Mapping[tuple[str, int], ThroughputProfile]],
    reference: str,
) -> Workload:
    """``workload`` with each job's throughput on every type of ``profiles`` (type ->
    (model, GPUs) -> profile, as a throughput file gives them; :func:`typed_job`). A job whose
    model a type's table lacks runs there at the reference speed."""
    jobs = []
    for sim in workload.jobs:
        key = (sim.spec.model, sim.spec.gpus)
        mine = {t: table[key] for t, table in profiles.items() if key in table}
        jobs.append(typed_job(sim, mine, reference))
    return dataclasses.replace(workload, jobs=tuple(jobs))
