"""Placement of a round's chosen jobs on GPUs: leases, best fit, whole nodes, fallbacks."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shockwave.domain.model import Cluster
from shockwave.rounds.placement import JobRequest, Placement, _FreeGpus, place

Lease = Mapping[str, tuple[int, ...]]


def cluster(nodes: int, gpus_per_node: int) -> Cluster:
    return Cluster.uniform(nodes, gpus_per_node)


def jobs(spec: str) -> list[JobRequest]:
    """``"a:1 b:4"`` -> ``[("a", 1), ("b", 4)]``, in priority order."""
    return [(job_id, int(width)) for job_id, width in (item.split(":") for item in spec.split())]


def gpus(first: int, stop: int) -> tuple[int, ...]:
    return tuple(range(first, stop))


def assert_well_formed(result: Placement, c: Cluster, requests: list[JobRequest]) -> None:
    widths = dict(requests)
    used = [g for placed in result.assignment.values() for g in placed]
    assert len(used) == len(set(used)), "a GPU was assigned twice"
    assert all(0 <= g < c.total_gpus for g in used)
    for job_id, placed in result.assignment.items():
        assert placed == tuple(sorted(placed))
        assert len(placed) == widths[job_id]
    assert set(result.assignment) | set(result.unplaced) == set(widths)
    assert not set(result.assignment) & set(result.unplaced)
    assert result.moved <= set(result.assignment)


@pytest.mark.parametrize(
    ("nodes", "per_node", "spec", "previous", "expected"),
    [
        pytest.param(2, 4, "a:1 b:1", {}, {"a": (0,), "b": (1,)}, id="ones-pack-one-node"),
        pytest.param(
            2, 4, "a:2 b:1 c:1", {}, {"a": (0, 1), "b": (2,), "c": (3,)}, id="fill-node-0"
        ),
        pytest.param(2, 4, "a:1 b:2", {}, {"a": (2,), "b": (0, 1)}, id="widest-first"),
        pytest.param(2, 4, "x:1 y:4", {}, {"x": (4,), "y": gpus(0, 4)}, id="1-then-4-both-fit"),
        pytest.param(4, 4, "a:1 b:8", {}, {"a": (8,), "b": gpus(0, 8)}, id="wide-on-whole-nodes"),
        pytest.param(3, 4, "a:6", {}, {"a": gpus(0, 6)}, id="wide-not-multiple-of-node"),
        pytest.param(
            4,
            4,
            "c:1 b:8",
            {"c": (0,)},
            {"c": (0,), "b": gpus(4, 12)},
            id="wide-skips-partly-used-node",
        ),
        pytest.param(
            2, 4, "b:1 c:4", {"a": (0,)}, {"b": (4,), "c": gpus(0, 4)}, id="ignores-stale-lease"
        ),
    ],
)
def test_packs_and_places_wide_jobs_on_whole_nodes(
    nodes: int,
    per_node: int,
    spec: str,
    previous: Lease,
    expected: Lease,
) -> None:
    c = cluster(nodes, per_node)
    result = place(c, jobs(spec), previous)
    assert dict(result.assignment) == expected
    assert not result.unplaced
    assert_well_formed(result, c, jobs(spec))


@pytest.mark.parametrize(
    ("nodes", "per_node", "spec", "previous", "expected"),
    [
        pytest.param(2, 4, "a:1 b:1", {"a": (0,)}, {"a": (0,), "b": (1,)}, id="fullest-node-first"),
        pytest.param(
            2, 4, "a:3 b:2 c:1", {"a": (0, 1, 2), "b": (4, 5)}, {"c": (3,)}, id="one-gpu-hole"
        ),
        pytest.param(
            2, 4, "a:3 b:2 c:2", {"a": (0, 1, 2), "b": (4, 5)}, {"c": (6, 7)}, id="two-gpu-hole"
        ),
        pytest.param(
            3, 4, "a:1 b:2 c:2", {"a": (0,), "b": (4, 5)}, {"c": (6, 7)}, id="keeps-node-2-whole"
        ),
        pytest.param(
            2, 4, "a:1 b:1 c:4", {"a": (0,)}, {"b": (1,), "c": gpus(4, 8)}, id="gang-still-fits"
        ),
    ],
)
def test_best_fit_avoids_fragmentation(
    nodes: int,
    per_node: int,
    spec: str,
    previous: Lease,
    expected: Lease,
) -> None:
    result = place(cluster(nodes, per_node), jobs(spec), previous)
    assert {job: result.assignment[job] for job in expected} == expected
    assert not result.unplaced


@pytest.mark.parametrize(
    ("nodes", "per_node", "spec", "previous", "expected"),
    [
        pytest.param(
            2,
            4,
            "a:2 b:2 c:4",
            {"a": (0, 1), "b": (4, 5)},
            (2, 3, 6, 7),
            id="narrow-gang-over-two-nodes",
        ),
        pytest.param(
            3,
            4,
            "a:1 b:1 c:8",
            {"a": (0,), "b": (4,)},
            (1, 2, 3, 5, 8, 9, 10, 11),
            id="wide-gang-one-whole-node-left",
        ),
        pytest.param(
            3,
            4,
            "a:3 b:1 c:2 d:4",
            {"a": (0, 1, 2), "b": (4,), "c": (8, 9)},
            (3, 5, 6, 7),
            id="most-free-node-then-best-fit-rest",
        ),
        pytest.param(
            4,
            2,
            "a:1 b:1 c:1 d:1 e:4",
            {"a": (0,), "b": (2,), "c": (4,), "d": (6,)},
            (1, 3, 5, 7),
            id="one-gpu-on-every-node",
        ),
    ],
)
def test_fallback_spreads_when_count_fits(
    nodes: int,
    per_node: int,
    spec: str,
    previous: Lease,
    expected: tuple[int, ...],
) -> None:
    c = cluster(nodes, per_node)
    requests = jobs(spec)
    result = place(c, requests, previous)
    last_job = requests[-1][0]
    assert result.assignment[last_job] == expected
    assert not result.unplaced
    assert not result.moved
    assert_well_formed(result, c, requests)


@pytest.mark.parametrize(
    ("nodes", "per_node", "spec", "previous", "expected_unplaced", "expected_placed"),
    [
        pytest.param(1, 4, "a:4 b:2", {}, {"b": "needs 2 GPUs, 0 free"}, {"a"}, id="full"),
        pytest.param(
            1, 4, "a:2 b:4", {"a": (0, 1)}, {"b": "needs 4 GPUs, 2 free"}, {"a"}, id="partly-full"
        ),
        pytest.param(
            1, 4, "a:8", {}, {"a": "needs 8 GPUs, cluster has 4"}, set(), id="wider-than-cluster"
        ),
        pytest.param(
            1, 4, "a:1 b:4", {}, {"b": "needs 4 GPUs, 3 free"}, {"a"}, id="priority-not-width"
        ),
        pytest.param(
            1, 4, "a:4 b:1", {"b": (0,)}, {"b": "needs 1 GPU, 0 free"}, {"a"}, id="preempted"
        ),
        pytest.param(
            2, 4, "a:2 b:8 c:4", {}, {"b": "needs 8 GPUs, 6 free"}, {"a", "c"}, id="backfill"
        ),
    ],
)
def test_jobs_that_do_not_fit_are_unplaced_with_a_reason(
    nodes: int,
    per_node: int,
    spec: str,
    previous: Lease,
    expected_unplaced: Mapping[str, str],
    expected_placed: set[str],
) -> None:
    c = cluster(nodes, per_node)
    result = place(c, jobs(spec), previous)
    assert dict(result.unplaced) == expected_unplaced
    assert set(result.assignment) == expected_placed
    assert not result.moved
    assert_well_formed(result, c, jobs(spec))


@pytest.mark.parametrize(
    ("nodes", "per_node", "spec", "previous", "expected", "expected_moved"),
    [
        pytest.param(
            2,
            4,
            "a:2 b:4",
            {"a": (5, 6)},
            {"a": (5, 6), "b": gpus(0, 4)},
            set(),
            id="keeps-lease-even-mid-node",
        ),
        pytest.param(
            1, 4, "a:2", {"a": (3, 2)}, {"a": (2, 3)}, set(), id="unsorted-lease-kept-sorted"
        ),
        pytest.param(1, 4, "a:2", {"a": (0,)}, {"a": (0, 1)}, {"a"}, id="width-changed"),
        pytest.param(1, 4, "a:2", {"a": (8, 9)}, {"a": (0, 1)}, {"a"}, id="gpu-gone-after-shrink"),
        pytest.param(1, 4, "a:2", {"a": (-1, 0)}, {"a": (0, 1)}, {"a"}, id="negative-gpu"),
        pytest.param(1, 4, "a:2", {"a": (1, 1)}, {"a": (0, 1)}, {"a"}, id="duplicate-gpu"),
        pytest.param(
            1,
            4,
            "a:2 b:2",
            {"a": (0, 1), "b": (1, 2)},
            {"a": (0, 1), "b": (2, 3)},
            {"b"},
            id="overlap-goes-to-priority",
        ),
        pytest.param(
            2,
            4,
            "a:4 b:1",
            {"b": (1,), "c": (4,)},
            {"a": gpus(4, 8), "b": (1,)},
            set(),
            id="finished-job-frees-gpus",
        ),
    ],
)
def test_continuing_jobs_keep_their_gpus_or_are_moved(
    nodes: int,
    per_node: int,
    spec: str,
    previous: Lease,
    expected: Lease,
    expected_moved: set[str],
) -> None:
    c = cluster(nodes, per_node)
    result = place(c, jobs(spec), previous)
    assert dict(result.assignment) == expected
    assert result.moved == expected_moved
    assert_well_formed(result, c, jobs(spec))


def test_assignment_follows_priority_order() -> None:
    result = place(cluster(2, 4), jobs("c:1 a:4 b:2"), {})
    assert list(result.assignment) == ["c", "a", "b"]


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        pytest.param([("a", 0)], "'a'", id="zero-width"),
        pytest.param([("a", 1), ("b", -2)], "'b'", id="negative-width"),
        pytest.param([("a", True)], "'a'", id="bool-width"),
        pytest.param([("a", 1), ("a", 2)], "'a' appears more than once", id="duplicate-id"),
    ],
)
def test_rejects_malformed_requests_naming_the_job(
    requests: list[JobRequest], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        place(cluster(1, 4), requests, {})


@st.composite
def fitting_rounds(draw: st.DrawFn) -> tuple[Cluster, list[JobRequest], dict[str, tuple[int, ...]]]:
    """A cluster (uniform or of mixed node sizes), a job set whose total width fits it, and a
    previous round to renew from.

    The previous round is itself a placement of a random job set (some of which continue, some
    at a new width), so leases are realistic; with some chance it is shifted off the cluster to
    mimic a shrink.
    """
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5))
    c = Cluster(tuple(sizes)) if draw(st.booleans()) else cluster(len(sizes), sizes[0])
    ids = [f"j{i}" for i in range(12)]

    def job_set() -> list[JobRequest]:
        chosen = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
        requests: list[JobRequest] = []
        free = c.total_gpus
        for job_id in chosen:
            width = draw(st.sampled_from([1, 2, 4, 8]))
            if width <= free:
                requests.append((job_id, width))
                free -= width
        return requests

    earlier = place(c, job_set(), {}).assignment
    shift = draw(st.sampled_from([0, 0, 0, 1, c.largest_node]))
    previous = {job: tuple(g + shift for g in held) for job, held in earlier.items()}
    return c, job_set(), previous


@settings(max_examples=300, deadline=None)
@given(fitting_rounds())
def test_every_fitting_job_set_is_placed_without_overlap(
    round_: tuple[Cluster, list[JobRequest], dict[str, tuple[int, ...]]],
) -> None:
    c, requests, previous = round_
    result = place(c, requests, previous)
    assert not result.unplaced
    assert_well_formed(result, c, requests)
    for job_id, placed in result.assignment.items():
        if job_id in previous and job_id not in result.moved:
            assert set(placed) == set(previous[job_id])
        if job_id in result.moved:
            assert set(placed) != set(previous[job_id])


@given(
    st.lists(st.integers(1, 8), min_size=1, max_size=12),
    st.lists(st.integers(0, 95), max_size=40),
    st.lists(st.integers(0, 9), min_size=1, max_size=12),
)
def test_best_fit_is_the_fullest_node_that_holds_the_gang(
    sizes: list[int], busy: list[int], widths: list[int]
) -> None:
    """The kept index of nodes by free count answers as the definition does, gang after gang:
    the node with the fewest free GPUs that holds the gang, the lowest index on ties."""
    cluster = Cluster(tuple(sizes))
    free = _FreeGpus(cluster, [g for g in busy if g < cluster.total_gpus])
    for width in widths:
        fits = [n for n in range(cluster.nodes) if free.count(n) >= width]
        expected = min(fits, key=lambda n: (free.count(n), n)) if fits else None
        assert free.best_fit(width) == expected
        if expected is not None:
            free.take(free.lowest(expected, width))
