"""Placement on a typed cluster: each gang on GPUs of one type.

:func:`shockwave.rounds.placement.place` and :func:`~shockwave.rounds.placement.place_into` hand a
typed cluster (:attr:`~shockwave.domain.model.Cluster.node_types`) here. Two steps:

1. Choose each job's type, in priority order, by GPU count: the type the policy planned it on
   (``types``) when that type still has room; else, for a continuing job, the type it holds;
   else the type with most free GPUs (a heterogeneity-agnostic choice: it spreads new gangs
   and never prefers a type for its speed). A job no type has room for is unplaced.
2. Place each type's jobs on that type's nodes with the untyped placement (leases kept,
   best fit), and number their GPUs globally again.

Pure, deterministic for a given input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from shockwave.domain.model import Cluster
from shockwave.rounds.placement import Placement, place, place_into


def _sub_clusters(cluster: Cluster) -> dict[str, tuple[Cluster, list[int]]]:
    """Type -> (its nodes as an untyped cluster, local GPU index -> global index)."""
    subs: dict[str, tuple[Cluster, list[int]]] = {}
    for kind in cluster.gpu_types:
        nodes = [n for n, t in enumerate(cluster.node_types) if t == kind]
        glob = [cluster.first_gpu(n) + i for n in nodes for i in range(cluster.node_gpus[n])]
        subs[kind] = (Cluster(tuple(cluster.node_gpus[n] for n in nodes)), glob)
    return subs


def _held_type(cluster: Cluster, gpus: Sequence[int] | None) -> str | None:
    if not gpus or not all(isinstance(g, int) and 0 <= g < cluster.total_gpus for g in gpus):
        return None
    kinds = {cluster.type_of(g) for g in gpus}
    return kinds.pop() if len(kinds) == 1 else None


def _choose_types(
    cluster: Cluster,
    jobs: Sequence[tuple[str, int]],
    held: Mapping[str, Sequence[int]],
    types: Mapping[str, str],
    free: dict[str, int],
) -> tuple[dict[str, str], dict[str, str]]:
    chosen: dict[str, str] = {}
    unplaced: dict[str, str] = {}
    kinds = cluster.gpu_types
    for job_id, width in jobs:
        first = [t for t in (types.get(job_id), _held_type(cluster, held.get(job_id))) if t]
        rest = sorted(kinds, key=lambda t: (-free[t], kinds.index(t)))
        for kind in dict.fromkeys([*first, *rest]):
            if kind in free and free[kind] >= width:
                chosen[job_id] = kind
                free[kind] -= width
                break
        else:
            most = max(free.values(), default=0)
            unplaced[job_id] = f"needs {width} GPUs of one type, at most {most} free on any type"
    return chosen, unplaced


def place_typed(
    cluster: Cluster,
    jobs: Sequence[tuple[str, int]],
    previous: Mapping[str, tuple[int, ...]],
    types: Mapping[str, str],
) -> Placement:
    """:func:`shockwave.rounds.placement.place` on a typed cluster (module docstring)."""
    free = {t: cluster.gpus_of_type(t) for t in cluster.gpu_types}
    chosen, unplaced = _choose_types(cluster, jobs, previous, types, free)
    assignment: dict[str, tuple[int, ...]] = {}
    for kind, (sub, glob) in _sub_clusters(cluster).items():
        local_of = {g: i for i, g in enumerate(glob)}
        mine = [(j, w) for j, w in jobs if chosen.get(j) == kind]
        prev = {
            j: tuple(local_of[g] for g in previous[j])
            for j, _ in mine
            if j in previous and all(g in local_of for g in previous[j])
        }
        placed = place(sub, mine, prev)
        for job_id, gpus in placed.assignment.items():
            assignment[job_id] = tuple(sorted(glob[g] for g in gpus))
        unplaced.update(placed.unplaced)
    ordered = {j: assignment[j] for j, _ in jobs if j in assignment}
    moved = frozenset(j for j, g in ordered.items() if j in previous and set(g) != set(previous[j]))
    return Placement(MappingProxyType(ordered), MappingProxyType(unplaced), moved)


def place_into_typed(
    cluster: Cluster,
    jobs: Sequence[tuple[str, int]],
    busy: Iterable[int],
    types: Mapping[str, str],
) -> Placement:
    """:func:`shockwave.rounds.placement.place_into` on a typed cluster (module docstring)."""
    taken = set(busy)
    free = {
        t: cluster.gpus_of_type(t) - sum(1 for g in taken if cluster.type_of(g) == t)
        for t in cluster.gpu_types
    }
    chosen, unplaced = _choose_types(cluster, jobs, {}, types, free)
    assignment: dict[str, tuple[int, ...]] = {}
    for kind, (sub, glob) in _sub_clusters(cluster).items():
        mine = [(j, w) for j, w in jobs if chosen.get(j) == kind]
        if not mine:
            continue
        local_busy = [i for i, g in enumerate(glob) if g in taken]
        placed = place_into(sub, mine, local_busy)
        for job_id, gpus in placed.assignment.items():
            assignment[job_id] = tuple(sorted(glob[g] for g in gpus))
        unplaced.update(placed.unplaced)
    ordered = {j: assignment[j] for j, _ in jobs if j in assignment}
    return Placement(MappingProxyType(ordered), MappingProxyType(unplaced), frozenset())
