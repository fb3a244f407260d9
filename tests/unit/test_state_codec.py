"""Policy state survives a trip through JSON: a worker that stores it between solves decides
exactly as a process that kept it in memory."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar

import pytest

from shockwave.domain.snapshot import Snapshot
from shockwave.domain.state_codec import StateCodecError, decode, encode
from shockwave.policies.policy import Decision, Policy, get_policy, make_params
from shockwave.simulation.simulator import simulate
from tests.builders import cluster, sim_job, workload


class ThroughJson:
    """Wraps a policy; hands it back its state only after encoding it to JSON text and back."""

    name: ClassVar[str] = "through-json"
    Params: ClassVar[type[Any]] = dict

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    def decide(self, snapshot: Snapshot, params: Any) -> Decision:
        decision = self.inner.decide(snapshot, params)
        stored = json.loads(json.dumps(encode(decision.state)))
        return replace(decision, state=decode(stored))


def mixed_workload() -> Any:
    return workload(
        *(
            sim_job(
                str(i),
                [(32, 2 + i % 3, 40.0 + 9 * i), (64, 1 + i % 2, 30.0)],
                gpus=(1, 2, 4)[i % 3],
                arrival=50.0 * i,
            )
            for i in range(10)
        )
    )


@pytest.mark.parametrize("name", ["shockwave", "gavel", "themis", "allox", "ossp", "fifo"])
def test_decisions_do_not_change_when_state_goes_through_json(name: str) -> None:
    policy = get_policy(name)
    params = make_params(policy)
    direct = simulate(mixed_workload(), cluster(8, 4), policy, params)
    stored = simulate(mixed_workload(), cluster(8, 4), ThroughJson(policy), params)
    rounds = [dict(r.assignment) for r in stored.rounds]
    assert rounds == [dict(r.assignment) for r in direct.rounds]
    assert stored.makespan_s == direct.makespan_s


@pytest.mark.parametrize(
    "data",
    [
        {"__t": "dc", "type": "os:system", "fields": {}},
        {"__t": "dc", "type": "shockwave.nope:Missing", "fields": {}},
        {"__t": "weird"},
        {"plain": "object"},
    ],
)
def test_stored_state_cannot_name_arbitrary_code(data: Any) -> None:
    with pytest.raises(StateCodecError):
        decode(data)


def test_unencodable_values_are_refused() -> None:
    with pytest.raises(StateCodecError, match="object"):
        encode(object())


def test_a_cluster_of_mixed_nodes_goes_through_json_and_rebuilds_its_numbering() -> None:
    from shockwave.domain.model import Cluster

    mixed = Cluster.parse("2x8,1x4,1x2")
    back = decode(json.loads(json.dumps(encode(mixed))))
    assert back == mixed and back.first_gpu(3) == 20 and back.node_of(19) == 2


@pytest.mark.parametrize("name", ["shockwave", "gavel"])
def test_typed_policy_state_goes_through_json(name: str) -> None:
    from shockwave.domain.model import Cluster, ThroughputProfile
    from shockwave.market.heterogeneity import typed_job
    from shockwave.workloads.workload import Workload

    typed = Cluster((4, 4), ("fast", "slow"))
    jobs = tuple(
        typed_job(
            job,
            {
                "slow": ThroughputProfile(
                    {
                        bs: r / (2 + int(job.spec.job_id) % 3)
                        for bs, r in job.spec.throughput.samples_per_second.items()
                    }
                )
            },
            "fast",
        )
        for job in mixed_workload().jobs
    )
    load = Workload(jobs, name="typed")
    policy = get_policy(name)
    params = make_params(policy)
    direct = simulate(load, typed, policy, params)
    stored = simulate(load, typed, ThroughJson(policy), params)
    assert [dict(r.assignment) for r in stored.rounds] == [
        dict(r.assignment) for r in direct.rounds
    ]
    assert stored.makespan_s == direct.makespan_s
    assert decode(json.loads(json.dumps(encode(typed)))) == typed
