"""GNS and Accordion from real gradient arrays: the noise scale of synthetic gradients whose
true noise scale is known, the doubling rule, and Accordion's critical regimes. The same on
torch tensors where torch is installed (explicitly skipped, with the reason, where it is not)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from shockwave_sdk import (
    Accordion,
    GradientNoiseScale,
    GradientNormTracker,
    NoiseScaleSample,
    micro_batch_sample,
    next_rung,
    per_example_sample,
    squared_norm,
    two_batch_sample,
)

TORCH_AVAILABLE = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(
    not TORCH_AVAILABLE, reason="torch is not installed: the tensor paths need it"
)
DIMENSIONS = 200


def noisy_gradients(rng: np.random.Generator, true_noise_scale: float, examples: int) -> np.ndarray:
    """Per-example gradients ``G + noise``, noise ``N(0, sigma^2 I)``, with ``|G| = 1`` and
    ``tr(Sigma) = d sigma^2 = true_noise_scale`` (so ``B_simple = true_noise_scale``)."""
    direction = np.ones(DIMENSIONS) / math.sqrt(DIMENSIONS)
    sigma = math.sqrt(true_noise_scale / DIMENSIONS)
    return direction + sigma * rng.standard_normal((examples, DIMENSIONS))


def test_two_batch_estimates_are_exact_on_expected_norms() -> None:
    gradient_sq, trace = 4.0, 300.0
    small, big = gradient_sq + trace / 8, gradient_sq + trace / 128
    sample = two_batch_sample(small, 8, big, 128)
    assert sample.gradient_sq == pytest.approx(gradient_sq)
    assert sample.trace == pytest.approx(trace)


@pytest.mark.parametrize("true_noise_scale", [8.0, 100.0, 1000.0])
def test_per_example_noise_scale_has_the_right_magnitude(true_noise_scale: float) -> None:
    rng = np.random.default_rng(1)
    gns = GradientNoiseScale(1024, smoothing=0.98)
    for _ in range(300):
        gns.observe(per_example_sample(noisy_gradients(rng, true_noise_scale, 32)))
    estimate = gns.noise_scale
    assert estimate is not None
    assert true_noise_scale / 2 <= estimate <= true_noise_scale * 2


@pytest.mark.parametrize("true_noise_scale", [16.0, 400.0])
def test_micro_batch_noise_scale_has_the_right_magnitude(true_noise_scale: float) -> None:
    rng = np.random.default_rng(2)
    gns = GradientNoiseScale(1024, smoothing=0.98)
    for _ in range(300):
        per_example = noisy_gradients(rng, true_noise_scale, 64)
        micro = [chunk.mean(axis=0) for chunk in np.split(per_example, 8)]
        gns.observe(micro_batch_sample(micro, 8))
    estimate = gns.noise_scale
    assert estimate is not None
    assert true_noise_scale / 2 <= estimate <= true_noise_scale * 2


def test_gradients_given_per_parameter_count_as_one_vector() -> None:
    rng = np.random.default_rng(3)
    whole = noisy_gradients(rng, 50.0, 16)
    split = [whole[:, :120].reshape(16, 12, 10), whole[:, 120:]]
    by_parameter, together = per_example_sample(split), per_example_sample(whole)
    assert by_parameter.trace == pytest.approx(together.trace)
    assert by_parameter.gradient_sq == pytest.approx(together.gradient_sq)
    assert squared_norm([whole[0, :120], whole[0, 120:]]) == pytest.approx(
        float(whole[0] @ whole[0])
    )


def settled(noise_scale: float, samples: int = 20) -> GradientNoiseScale:
    gns = GradientNoiseScale(256, ladder=(16, 32, 64, 128, 256), min_samples=10)
    for _ in range(samples):
        gns.observe(NoiseScaleSample(gradient_sq=1.0, trace=noise_scale))
    return gns


@pytest.mark.parametrize(
    ("noise_scale", "batch_size", "expected", "changed"),
    [
        (100.0, 16, 32, True),  # 100 >= 2 * 16: double
        (100.0, 32, 64, True),
        (100.0, 64, 64, False),  # 100 < 2 * 64: keep
        (5.0, 64, 64, False),  # far below: never down
        (1e6, 256, 256, False),  # at the maximum
        (1e6, 128, 256, True),
    ],
)
def test_gns_doubles_only_upward(
    noise_scale: float, batch_size: int, expected: int, changed: bool
) -> None:
    decision = settled(noise_scale).decide(batch_size)
    assert (decision.batch_size, decision.changed) == (expected, changed)
    assert decision.statistic == pytest.approx(noise_scale)


def test_gns_waits_for_enough_samples_and_a_positive_gradient() -> None:
    assert settled(1e6, samples=3).decide(16).changed is False
    drowned = GradientNoiseScale(256)
    for _ in range(20):
        drowned.observe(NoiseScaleSample(gradient_sq=-0.5, trace=10.0))
    decision = drowned.decide(16)
    assert (decision.changed, decision.statistic) == (False, None)


def test_gns_along_a_training_run_climbs_and_never_descends() -> None:
    """The noise scale grows as the true gradient shrinks; it falls back at the end."""
    rng = np.random.default_rng(4)
    gns = GradientNoiseScale(128, ladder=(16, 32, 64, 128), smoothing=0.9)
    batch_size, sizes = 16, []
    for true_noise_scale in [10, 20, 40, 80, 160, 320, 640, 640, 20, 10]:
        for _ in range(40):
            gns.observe(per_example_sample(noisy_gradients(rng, float(true_noise_scale), 32)))
        batch_size = gns.decide(batch_size).batch_size
        sizes.append(batch_size)
    assert sizes == sorted(sizes)
    assert sizes[0] == 16 and sizes[-1] == 128


@pytest.mark.parametrize(
    ("current", "maximum", "ladder", "expected"),
    [(16, 128, (), 32), (16, 128, (16, 48, 128), 48), (16, 20, (), 20), (32, 128, (64,), 64)],
)
def test_next_rung(current: int, maximum: int, ladder: tuple[int, ...], expected: int) -> None:
    assert next_rung(current, maximum, ladder) == expected


def test_accordion_flips_to_large_when_the_norm_settles_and_back_when_it_jumps() -> None:
    accordion = Accordion(32, 256, threshold=0.5)
    sizes, batch_size = [], 32
    for norm in [10.0, 3.0, 2.7, 2.6, 6.0, 5.8, 5.9]:
        accordion.observe(norm)
        batch_size = accordion.decide(batch_size).batch_size
        sizes.append(batch_size)
    # first: critical; 10 -> 3 (70%): critical; 3 -> 2.7 (10%): large; 2.6 (4%): large;
    # 2.6 -> 6 (131%): critical again; then settles.
    assert sizes == [32, 32, 256, 256, 32, 256, 256]


def test_accordion_reports_the_relative_change() -> None:
    accordion = Accordion(32, 256, threshold=0.5)
    accordion.observe(4.0)
    assert accordion.decide(32).statistic is None
    accordion.observe(3.0)
    decision = accordion.decide(32)
    assert decision.statistic == pytest.approx(0.25)
    assert (decision.batch_size, decision.changed) == (256, True)
    restored = Accordion(32, 256)
    restored.load_state_dict(accordion.state_dict())
    assert restored.relative_change == pytest.approx(0.25)


def test_the_tracked_norm_does_not_depend_on_the_batch_size() -> None:
    """An epoch at batch 128 takes 8x fewer steps than at 16; its mean-gradient norm is
    the same, so a batch-size change alone is not a critical regime."""
    rng = np.random.default_rng(5)
    norms = {}
    for batch_size in (16, 128):
        tracker = GradientNormTracker()
        for _ in range(4096 // batch_size):
            tracker.add(noisy_gradients(rng, 50.0, batch_size).mean(axis=0))
        norms[batch_size] = tracker.interval_norm()
        assert tracker.interval_norm() is None  # reset
    assert norms[16] == pytest.approx(norms[128], rel=0.1)


@needs_torch
def test_torch_tensors_give_the_numpy_results() -> None:
    import torch

    rng = np.random.default_rng(6)
    per_example = noisy_gradients(rng, 80.0, 16)
    tensors = torch.from_numpy(per_example)
    assert squared_norm(tensors[0]) == pytest.approx(squared_norm(per_example[0]))
    from_tensor, from_array = per_example_sample(tensors), per_example_sample(per_example)
    assert from_tensor.trace == pytest.approx(from_array.trace)
    assert from_tensor.gradient_sq == pytest.approx(from_array.gradient_sq)
    micro = [t.mean(dim=0) for t in tensors.chunk(4)]
    expected = micro_batch_sample([m.numpy() for m in micro], 4)
    assert micro_batch_sample(micro, 4).trace == pytest.approx(expected.trace)
    tracker = GradientNormTracker()
    for row in tensors:
        tracker.add([row[:100], row[100:]])
    assert tracker.interval_norm() == pytest.approx(float(np.linalg.norm(per_example.mean(0))))
