"""Validation of the domain model: impossible input names the field at fault."""

from __future__ import annotations

from typing import Any

import pytest

from shockwave.domain.model import (
    AdaptationMode,
    Cluster,
    JobSpec,
    Regime,
    ThroughputProfile,
    ValidationError,
)


def spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "job_id": "j",
        "gpus": 1,
        "epochs": 10,
        "samples_per_epoch": 1000,
        "initial_batch_size": 32,
    }
    fields.update(overrides)
    return JobSpec(**fields)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpus": 3}, "gpus"),
        ({"gpus": 12}, "gpus"),
        ({"gpus": 2048}, "gpus"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"epochs": 0}, "epochs"),
        ({"epochs": -5}, "epochs"),
        ({"epochs": 2.5}, "epochs"),
        ({"samples_per_epoch": 0}, "samples_per_epoch"),
        ({"initial_batch_size": -1}, "initial_batch_size"),
        ({"mode": "elastic"}, "mode"),
        ({"arrival_s": -1.0}, "arrival_s"),
        ({"arrival_s": float("nan")}, "arrival_s"),
        ({"budget": 0.0}, "budget"),
        ({"job_id": ""}, "job_id"),
        ({"mode": AdaptationMode.CUSTOM}, "batch_sizes"),
        ({"mode": AdaptationMode.CUSTOM, "batch_sizes": (64, 128)}, "batch_sizes"),
        ({"batch_sizes": (32, 0)}, "batch_sizes[1]"),
    ],
)
def test_impossible_job_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**overrides)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_nonpositive_throughput_names_the_batch_size() -> None:
    with pytest.raises(ValidationError) as caught:
        ThroughputProfile({32: 0.0})
    assert caught.value.field == "throughput[32]"


def test_mode_is_parsed_from_text() -> None:
    assert spec(mode="GNS").mode is AdaptationMode.GNS


def test_job_wider_than_cluster_is_rejected() -> None:
    with pytest.raises(ValidationError) as caught:
        spec(gpus=8).check_fits(Cluster.uniform(1, 4))
    assert caught.value.field == "gpus"
    spec(gpus=4).check_fits(Cluster.uniform(1, 4))


@pytest.mark.parametrize(
    ("total", "per_node", "field"),
    [(0, 4, "gpus"), (32, 0, "gpus_per_node"), (30, 4, "gpus")],
)
def test_impossible_cluster(total: int, per_node: int, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Cluster.of_gpus(total, per_node)
    assert caught.value.field == field


def test_cluster_numbers_gpus_globally() -> None:
    cluster = Cluster.of_gpus(32, 4)
    assert (cluster.nodes, cluster.total_gpus, cluster.node_of(5)) == (8, 32, 1)


@pytest.mark.parametrize(("bs", "epochs", "field"), [(0, 1, "batch_size"), (32, 0, "epochs")])
def test_impossible_regime(bs: int, epochs: int, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Regime(bs, epochs)
    assert caught.value.field == field


def test_throughput_profile_gives_epoch_time() -> None:
    profile = ThroughputProfile({64: 200.0, 32: 100.0})
    assert list(profile.samples_per_second) == [32, 64]
    assert profile.epoch_seconds(64, 1000) == pytest.approx(5.0)
    assert not profile.knows(128)
    assert spec(batch_sizes=(32, 256)).max_batch_size == 256
