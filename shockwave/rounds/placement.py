"""Placement: which GPUs each of a round's chosen jobs runs on.

The policy decides *which* jobs run in a round and how wide they are; placement turns that into
global GPU indices on a :class:`~shockwave.domain.model.Cluster`. It aims at three things, in order:

1. Keep a continuing job's lease. A job that ran last round at the same width keeps exactly its
   GPUs, so the round boundary is a lease extension rather than a checkpoint-restart.
2. Avoid fragmentation. New jobs go widest first; a job that fits on one node goes best fit
   (the fullest node that still has room), so small jobs fill holes and whole nodes stay free for
   wide gangs; a job wider than a node takes whole free nodes.
3. Never fail a set of jobs that fits by count. When no node (or no set of whole nodes) has room,
   the gang spreads over the fewest nodes possible, most-free nodes first.

The steps of :func:`place` read as a cycle: check the input, admit jobs by priority while the
GPU count allows, renew the leases that still hold, place everything else, report. "Does not fit"
is a value in :attr:`Placement.unplaced`, not an exception; only malformed input raises.

Pure: standard library only, no I/O, deterministic for a given input.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from shockwave.domain.model import Cluster, ValidationError

JobRequest = tuple[str, int]
"""``(job_id, gpus)``: one chosen job and the width of its gang."""


@dataclass(frozen=True, slots=True)
class Placement:
    """The outcome of one round's placement.

    ``assignment`` maps each placed job id to its sorted global GPU indices, in the priority
    order of the request; no GPU appears twice. ``unplaced`` maps each job that did not fit to a
    human-readable reason (``"needs 4 GPUs, 2 free"``). ``moved`` holds the placed jobs that held
    GPUs in ``previous`` but now run on a different set: the shell must checkpoint and restart
    them. A continuing job that is unplaced is preempted, not moved, and appears only in
    ``unplaced``.
    """

    assignment: Mapping[str, tuple[int, ...]]
    unplaced: Mapping[str, str]
    moved: frozenset[str]


def place(
    cluster: Cluster,
    jobs: Sequence[JobRequest],
    previous: Mapping[str, tuple[int, ...]],
    types: Mapping[str, str] | None = None,
) -> Placement:
    """Place the round's chosen ``jobs`` on ``cluster``, renewing ``previous`` leases if valid.

    ``jobs`` lists ``(job_id, gpus)`` in priority order, highest first. ``previous`` is last
    round's assignment (job id -> GPU indices); entries for jobs not in ``jobs`` are ignored
    (those jobs finished or were preempted). Priority decides who is left out when the jobs do
    not fit by count: jobs are admitted in priority order while enough GPUs remain, and a job
    that does not fit is skipped so that narrower, lower-priority jobs may still backfill. Every
    admitted job is then placed, whatever the fragmentation.

    Raises :class:`~shockwave.domain.model.ValidationError` (a ``ValueError``) naming the job when a
    width is not a positive integer or a job id appears twice.

    On a typed cluster each gang stays on one GPU type, ``types`` naming the type the policy
    planned a job on (:mod:`shockwave.rounds.typed_placement`).
    """
    _check_requests(jobs)
    if cluster.is_typed:
        from shockwave.rounds.typed_placement import place_typed

        return place_typed(cluster, jobs, previous, types or {})
    admitted, unplaced = _admit(cluster.total_gpus, jobs)
    free = _FreeGpus(cluster)
    assignment = _renew_leases(cluster, admitted, previous, free)
    pending = [job for job in admitted if job[0] not in assignment]
    for job_id, width in sorted(pending, key=lambda job: -job[1]):
        assignment[job_id] = free.take(_choose_gpus(free, width))
    moved = frozenset(
        job_id
        for job_id, gpus in assignment.items()
        if job_id in previous and set(gpus) != set(previous[job_id])
    )
    in_priority_order = {job_id: assignment[job_id] for job_id, _ in admitted}
    return Placement(
        assignment=MappingProxyType(in_priority_order),
        unplaced=MappingProxyType(unplaced),
        moved=moved,
    )


def place_into(
    cluster: Cluster,
    jobs: Sequence[JobRequest],
    busy: Iterable[int],
    types: Mapping[str, str] | None = None,
) -> Placement:
    """Place ``jobs`` on the GPUs of ``cluster`` that ``busy`` leaves free, moving nobody.

    The mid-round fill: jobs are taken in priority order while enough GPUs are free (a job that
    does not fit is skipped, so a narrower one behind it may still start), each placed as
    :func:`place` places a new gang. ``moved`` is always empty. Typed clusters: as :func:`place`.
    """
    _check_requests(jobs)
    if cluster.is_typed:
        from shockwave.rounds.typed_placement import place_into_typed

        return place_into_typed(cluster, jobs, busy, types or {})
    free = _FreeGpus(cluster, busy)
    admitted, unplaced = _admit(free.total(), jobs, cluster.total_gpus)
    assignment = {}
    for job_id, width in sorted(admitted, key=lambda job: -job[1]):
        assignment[job_id] = free.take(_choose_gpus(free, width))
    in_priority_order = {job_id: assignment[job_id] for job_id, _ in admitted}
    return Placement(
        assignment=MappingProxyType(in_priority_order),
        unplaced=MappingProxyType(unplaced),
        moved=frozenset(),
    )


def _check_requests(jobs: Sequence[JobRequest]) -> None:
    """Raise on a width that is not a positive integer or a repeated job id."""
    seen: set[str] = set()
    for i, (job_id, width) in enumerate(jobs):
        if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
            raise ValidationError(
                f"jobs[{i}].gpus",
                f"job {job_id!r} must ask for a positive number of GPUs, got {width!r}",
            )
        if job_id in seen:
            raise ValidationError(f"jobs[{i}].job_id", f"job {job_id!r} appears more than once")
        seen.add(job_id)


def _admit(
    free_gpus: int, jobs: Sequence[JobRequest], total_gpus: int | None = None
) -> tuple[list[JobRequest], dict[str, str]]:
    """Split ``jobs`` into those that fit by count, taken in priority order, and the rest.

    ``free_gpus`` are free to take, of the cluster's ``total_gpus`` (default: all free).
    Returns ``(admitted, unplaced)``: the admitted requests in priority order, and a reason for
    each job left out. The admitted widths sum to at most ``free_gpus``, which is what lets
    :func:`_choose_gpus` always succeed.
    """
    admitted: list[JobRequest] = []
    unplaced: dict[str, str] = {}
    remaining = free_gpus
    total_gpus = free_gpus if total_gpus is None else total_gpus
    for job_id, width in jobs:
        if width > total_gpus:
            unplaced[job_id] = f"needs {_count_gpus(width)}, cluster has {total_gpus}"
        elif width > remaining:
            unplaced[job_id] = f"needs {_count_gpus(width)}, {remaining} free"
        else:
            admitted.append((job_id, width))
            remaining -= width
    return admitted, unplaced


def _count_gpus(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def _renew_leases(
    cluster: Cluster,
    admitted: Sequence[JobRequest],
    previous: Mapping[str, tuple[int, ...]],
    free: _FreeGpus,
) -> dict[str, tuple[int, ...]]:
    """Give each continuing job whose lease still holds exactly its previous GPUs.

    A lease holds when the job keeps its width and its GPUs are distinct, exist in ``cluster``
    and were not already renewed for a higher-priority job. Returns job id -> sorted GPUs for the
    renewed jobs and takes those GPUs out of ``free``.
    """
    renewed: dict[str, tuple[int, ...]] = {}
    for job_id, width in admitted:
        gpus = previous.get(job_id)
        if gpus is not None and _lease_holds(cluster, gpus, width, free):
            renewed[job_id] = free.take(sorted(gpus))
    return renewed


def _lease_holds(cluster: Cluster, gpus: tuple[int, ...], width: int, free: _FreeGpus) -> bool:
    """Whether ``gpus`` are ``width`` distinct GPU indices of ``cluster``, all free."""
    if len(gpus) != width:
        return False
    if set(map(type, gpus)) != {int}:  # plain ints pass at C speed; anything else is checked
        valid = all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < cluster.total_gpus
            for g in gpus
        )
        if not valid:
            return False
    # free GPUs are in-range plain ints: all free implies each is a GPU of the cluster
    return len(set(gpus)) == width and free.all_free(gpus)


def _choose_gpus(free: _FreeGpus, width: int) -> list[int]:
    """Pick ``width`` free GPUs for a new gang; assumes ``free.count() >= width``.

    A gang that fits on one node goes best fit (the fullest node that still holds it, whatever
    the node's size); a gang wider than every node takes whole free nodes, largest first;
    otherwise the gang spreads over the fewest nodes (see :func:`_fewest_nodes`).
    """
    node = free.best_fit(width)
    if node is not None:
        return free.lowest(node, width)
    if width > free.largest:
        whole = sorted(
            (n for n in range(free.nodes) if free.count(n) == free.size(n)),
            key=lambda n: (-free.size(n), n),
        )
        chosen: list[int] = []
        for n in whole:
            if len(chosen) >= width:
                break
            chosen += free.lowest(n, min(free.size(n), width - len(chosen)))
        if len(chosen) == width:
            return sorted(chosen)
    return _fewest_nodes(free, width)


def _fewest_nodes(free: _FreeGpus, width: int) -> list[int]:
    """Spread ``width`` GPUs over as few nodes as possible; assumes ``free.count() >= width``.

    Nodes are drained most-free first (ties to the lowest index) until one of the remaining
    nodes can hold the rest; the rest then goes best fit among those. Taking most-free nodes
    first gives the fewest nodes; ending best fit leaves the larger holes open. When every node
    is nearly full this degenerates into spreading over any free GPUs, so it never fails.
    """
    order = sorted(range(free.nodes), key=lambda n: (-free.count(n), n))
    chosen: list[int] = []
    need = width
    for i, node in enumerate(order):
        if free.count(node) >= need:
            last = min(
                (n for n in order[i:] if free.count(n) >= need),
                key=lambda n: (free.count(n), n),
            )
            return sorted(chosen + free.lowest(last, need))
        chosen += free.lowest(node, free.count(node))
        need -= free.count(node)
    raise AssertionError(f"{width} GPUs requested but only {len(chosen)} free")


class _FreeGpus:
    """The free GPUs of a cluster, by node and in all, while one placement is being built."""

    __slots__ = ("_all", "_by_count", "_by_node", "_cluster", "largest", "nodes")

    def __init__(self, cluster: Cluster, busy: Iterable[int] = ()) -> None:
        self._cluster = cluster
        self.nodes = cluster.nodes
        self.largest = cluster.largest_node
        sets, every, counts = _fresh(cluster.node_gpus)
        self._by_node: list[set[int]] = [set(gpus) for gpus in sets]
        self._all: set[int] = set(every)
        node_of = cluster.node_of
        touched = False
        for g in busy:
            self._by_node[node_of(g)].discard(g)
            self._all.discard(g)
            touched = True
        self._by_count: list[set[int]]
        """The nodes by how many free GPUs each has (a best fit looks at few of them, not at
        every node: a boundary places hundreds of gangs on a thousand nodes)."""
        if not touched:
            self._by_count = [set(nodes) for nodes in counts]
            return
        self._by_count = [set() for _ in range(self.largest + 1)]
        for n, gpus in enumerate(self._by_node):
            self._by_count[len(gpus)].add(n)

    def size(self, node: int) -> int:
        return self._cluster.node_gpus[node]

    def count(self, node: int) -> int:
        return len(self._by_node[node])

    def total(self) -> int:
        return len(self._all)

    def lowest(self, node: int, k: int) -> list[int]:
        """The ``k`` lowest free GPU indices on ``node``."""
        return sorted(self._by_node[node])[:k]

    def best_fit(self, width: int) -> int | None:
        """The node with the fewest free GPUs that still holds ``width`` (lowest index on ties)."""
        for count in range(max(width, 0), self.largest + 1):
            if self._by_count[count]:
                return min(self._by_count[count])
        return None

    def all_free(self, gpus: Sequence[int]) -> bool:
        return self._all.issuperset(gpus)

    def take(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """Mark ``gpus`` as used and return them as a sorted tuple."""
        node_of, by_node, free = self._cluster.node_of, self._by_node, self._all
        # each node touched moves once, from its count before to its count after
        before: dict[int, int] = {}
        for g in gpus:
            node = node_of(g)
            held = by_node[node]
            if node not in before:
                before[node] = len(held)
            held.remove(g)
            free.remove(g)
        by_count = self._by_count
        for node, count in before.items():
            by_count[count].discard(node)
            by_count[len(by_node[node])].add(node)
        return tuple(sorted(gpus))


_NODE_SETS: dict[tuple[int, ...], tuple[frozenset[int], ...]] = {}
"""Each node's GPU indices by node sizes (a handful of clusters per process)."""


_Fresh = tuple[tuple[frozenset[int], ...], frozenset[int], tuple[frozenset[int], ...]]

_FRESH: dict[tuple[int, ...], _Fresh] = {}
"""A cluster's free GPUs with none busy, by node sizes (:func:`_fresh`)."""


def _fresh(node_gpus: tuple[int, ...]) -> _Fresh:
    """The free GPUs of a cluster of ``node_gpus`` with none busy, as :class:`_FreeGpus` holds
    them: each node's GPU indices, every GPU, and the nodes by free count (0 to the largest
    node), copied at each placement instead of built again."""
    fresh = _FRESH.get(node_gpus)
    if fresh is None:
        sets = _node_sets(node_gpus)
        counts: list[set[int]] = [set() for _ in range(max(node_gpus, default=0) + 1)]
        for n, gpus in enumerate(sets):
            counts[len(gpus)].add(n)
        fresh = (sets, frozenset(range(sum(node_gpus))), tuple(map(frozenset, counts)))
        if len(_FRESH) >= 64:
            _FRESH.clear()
        _FRESH[node_gpus] = fresh
    return fresh


def _node_sets(node_gpus: tuple[int, ...]) -> tuple[frozenset[int], ...]:
    """The GPU indices of each node of a cluster of ``node_gpus``, in order."""
    sets = _NODE_SETS.get(node_gpus)
    if sets is None:
        first = [0, *itertools.accumulate(node_gpus)]
        sets = tuple(frozenset(range(first[n], first[n + 1])) for n in range(len(node_gpus)))
        if len(_NODE_SETS) >= 64:
            _NODE_SETS.clear()
        _NODE_SETS[node_gpus] = sets
    return sets
