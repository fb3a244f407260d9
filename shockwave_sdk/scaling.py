"""When to change the batch size, decided from real gradients: Accordion and GNS.

The two adaptation modes the paper models (Shockwave section 5, "Leveraging domain knowledge"):

- **Accordion** (Agarwal et al., MLSys'21) alternates between a small and a large batch size.
  It watches the norm of the gradient accumulated over an interval (here an epoch) and compares
  it with the previous interval's: a relative change of at least ``threshold`` (0.5 in the
  paper's expert heuristic) marks a *critical regime*, trained at the small batch size; a slower
  change lets the job train at the large batch size.
- **GNS** (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018) estimates the
  simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2``, where ``G`` is the true gradient
  and ``Sigma`` the per-example gradient covariance. From squared gradient norms measured at
  two batch sizes ``b < B`` (per-example gradients against their mean, or micro-batches
  against the whole batch), their appendix A.1 gives unbiased estimates:

      |G|^2    ~ (B |G_B|^2 - b |G_b|^2) / (B - b)
      tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

  Each is smoothed with an exponential moving average before taking the ratio (a ratio of
  noisy estimates is biased). As the paper models it, the batch size doubles when the noise
  scale exceeds the current batch size by a relative threshold, up to a maximum, never down.

Gradients are NumPy arrays or PyTorch tensors, or a sequence of them (one per parameter).
Tensors stay on their device: norms are computed there and only a float comes back, so torch
is never imported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Gradient = Any
"""A NumPy array or torch tensor, or a list or tuple of them (the parameters' gradients)."""


def _parts(gradient: Gradient) -> list[Any]:
    return list(gradient) if isinstance(gradient, list | tuple) else [gradient]


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and not isinstance(value, np.ndarray)


def squared_norm(gradient: Gradient) -> float:
    """``|g|^2`` of a gradient (all its parts together), as a Python float."""
    total = 0.0
    for part in _parts(gradient):
        if _is_tensor(part):
            tensor = part.detach()
            try:
                tensor = tensor.double()
            except (RuntimeError, TypeError):
                tensor = tensor.float()
            total += float(tensor.pow(2).sum().item())
        else:
            array = np.asarray(part, dtype=np.float64).ravel()
            total += float(np.dot(array, array))
    return total


def _mean(gradients: Sequence[Gradient]) -> list[Any]:
    """The element-wise mean of gradients of one shape, part by part (on the tensors' device)."""
    count = len(gradients)
    columns = zip(*(_parts(g) for g in gradients), strict=True)
    means: list[Any] = []
    for column in columns:
        first = column[0].detach() if _is_tensor(column[0]) else np.asarray(column[0], np.float64)
        total = first
        for part in column[1:]:
            total = total + (part.detach() if _is_tensor(part) else np.asarray(part, np.float64))
        means.append(total / count)
    return means


@dataclass(frozen=True, slots=True)
class NoiseScaleSample:
    """One step's unbiased estimates of ``|G|^2`` (``gradient_sq``) and ``tr(Sigma)``
    (``trace``). Either may be negative by chance; only their averages are meaningful."""

    gradient_sq: float
    trace: float


def two_batch_sample(
    small_sq_norm: float, small_batch: int, big_sq_norm: float, big_batch: int
) -> NoiseScaleSample:
    """Estimates from ``|G_b|^2`` at batch size ``b`` and ``|G_B|^2`` at ``B > b`` (McCandlish
    et al., appendix A.1). ``small_sq_norm`` should be the mean over the small batches."""
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small_batch < big_batch, got {small_batch}, {big_batch}")
    b, B = float(small_batch), float(big_batch)
    return NoiseScaleSample(
        gradient_sq=(B * big_sq_norm - b * small_sq_norm) / (B - b),
        trace=(small_sq_norm - big_sq_norm) / (1.0 / b - 1.0 / B),
    )


def per_example_sample(per_example: Gradient) -> NoiseScaleSample:
    """Estimates from per-example gradients: an array ``(n, ...)`` (or a list of them, one per
    parameter) whose leading axis is the example. Compares ``b = 1`` with ``B = n``."""
    parts = _parts(per_example)
    count = int(parts[0].shape[0])
    if count < 2:
        raise ValueError("need the gradients of at least 2 examples")
    small = 0.0
    for part in parts:
        if _is_tensor(part):
            flat = part.detach().reshape(count, -1).double()
            small += float(flat.pow(2).sum().item())
        else:
            flat_array = np.asarray(part, np.float64).reshape(count, -1)
            small += float(np.einsum("ij,ij->", flat_array, flat_array))
    big = squared_norm([p.mean(0) if _is_tensor(p) else np.asarray(p).mean(0) for p in parts])
    return two_batch_sample(small / count, 1, big, count)


def micro_batch_sample(
    micro_gradients: Sequence[Gradient], micro_batch_size: int
) -> NoiseScaleSample:
    """Estimates from the gradients of ``k >= 2`` equal micro-batches of ``micro_batch_size``
    examples each (or of ``k`` data-parallel workers' local batches): ``b`` is the micro-batch,
    ``B = k * b`` the whole batch, whose gradient is the micro-gradients' mean."""
    count = len(micro_gradients)
    if count < 2:
        raise ValueError("need the gradients of at least 2 micro-batches")
    small = sum(squared_norm(g) for g in micro_gradients) / count
    big = squared_norm(_mean(micro_gradients))
    return two_batch_sample(small, micro_batch_size, big, count * micro_batch_size)


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """The batch size to train the next epoch at. ``changed``: it differs from the current one;
    ``statistic``: what the decision rested on (the noise scale for GNS, the relative change
    of the gradient norm for Accordion), ``None`` until there is enough to decide."""

    batch_size: int
    changed: bool
    reason: str
    statistic: float | None = None


def next_rung(batch_size: int, max_batch_size: int, ladder: Sequence[int] = ()) -> int:
    """The size a GNS doubling moves to: the smallest declared size at least twice the current
    one (``2 * batch_size`` when none is declared), never above ``max_batch_size``. Matches the
    predictor's ladder (``shockwave.prediction.predictor``)."""
    target = 2 * batch_size
    declared = sorted(b for b in ladder if target <= b <= max_batch_size)
    return min(declared[0] if declared else target, max_batch_size)


class GradientNoiseScale:
    """GNS scaling: doubles the batch size while the gradient noise scale outgrows it.

    Feed it one :class:`NoiseScaleSample` per step with :meth:`observe` and ask
    :meth:`decide` at the end of each epoch. The batch size moves to :func:`next_rung` when
    ``B_simple >= batch_size * (1 + threshold)`` (with the default 1.0: the noise scale is at
    least twice the batch size, so the doubled size is still within it). ``smoothing`` is the
    moving averages' decay per sample; ``min_samples`` the samples needed before any decision.
    """

    def __init__(
        self,
        max_batch_size: int,
        *,
        ladder: Sequence[int] = (),
        threshold: float = 1.0,
        smoothing: float = 0.95,
        min_samples: int = 10,
    ) -> None:
        if max_batch_size < 1 or threshold < 0 or not 0 <= smoothing < 1:
            raise ValueError("need max_batch_size >= 1, threshold >= 0, 0 <= smoothing < 1")
        self.max_batch_size = max_batch_size
        self.ladder = tuple(ladder)
        self.threshold = threshold
        self.smoothing = smoothing
        self.min_samples = min_samples
        self.samples = 0
        self._gradient_sq = 0.0
        self._trace = 0.0

    def observe(self, sample: NoiseScaleSample) -> None:
        if not (math.isfinite(sample.gradient_sq) and math.isfinite(sample.trace)):
            return
        decay = self.smoothing
        self._gradient_sq = decay * self._gradient_sq + (1 - decay) * sample.gradient_sq
        self._trace = decay * self._trace + (1 - decay) * sample.trace
        self.samples += 1

    @property
    def noise_scale(self) -> float | None:
        """The smoothed ``B_simple``, or ``None`` while ``|G|^2`` is not positive (no sample
        yet, or the true gradient drowned in noise) or the trace estimate is negative."""
        if self.samples == 0 or self._gradient_sq <= 0 or self._trace < 0:
            return None
        return self._trace / self._gradient_sq

    def decide(self, batch_size: int) -> ScalingDecision:
        scale = self.noise_scale
        if self.samples < self.min_samples or scale is None:
            return ScalingDecision(batch_size, False, "not enough gradient samples", scale)
        if batch_size >= self.max_batch_size:
            return ScalingDecision(batch_size, False, "at the maximum batch size", scale)
        if scale < batch_size * (1 + self.threshold):
            return ScalingDecision(batch_size, False, "noise scale within the batch size", scale)
        bigger = next_rung(batch_size, self.max_batch_size, self.ladder)
        return ScalingDecision(bigger, True, "noise scale outgrew the batch size", scale)

    def state_dict(self) -> dict[str, float]:
        """JSON-serializable state, to checkpoint and resume the moving averages."""
        return {"samples": self.samples, "gradient_sq": self._gradient_sq, "trace": self._trace}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.samples = int(state["samples"])
        self._gradient_sq = float(state["gradient_sq"])
        self._trace = float(state["trace"])


class GradientNormTracker:
    """The norm of the mean gradient over an interval (an epoch), Accordion's signal.

    :meth:`add` each step's gradient; :meth:`interval_norm` returns ``|mean of the step
    gradients|`` and starts a new interval. The mean, unlike the sum, does not shrink when a
    larger batch takes fewer steps per epoch, so a batch-size change alone does not look like a
    critical regime. The running sum stays on the tensors' device.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.total: list[Any] | None = None

    def add(self, gradient: Gradient) -> None:
        parts = [
            p.detach().clone() if _is_tensor(p) else np.array(p, np.float64)
            for p in _parts(gradient)
        ]
        if self.total is None:
            self.total = parts
        else:
            self.total = [t + p for t, p in zip(self.total, parts, strict=True)]
        self.steps += 1

    def interval_norm(self) -> float | None:
        """The interval's mean-gradient norm (``None`` when no step was added); resets."""
        if self.total is None or self.steps == 0:
            return None
        norm = math.sqrt(squared_norm(self.total)) / self.steps
        self.total, self.steps = None, 0
        return norm


class Accordion:
    """Accordion scaling between ``small_batch_size`` (critical regimes) and
    ``large_batch_size``.

    :meth:`observe` each interval's gradient norm (:class:`GradientNormTracker`), then
    :meth:`decide`. With the previous norm ``p`` and the current ``c``, ``|p - c| / p >=
    threshold`` is a critical regime. The first interval, with nothing to compare, is critical:
    training starts at the small batch size.
    """

    def __init__(self, small_batch_size: int, large_batch_size: int, *, threshold: float = 0.5):
        if not 0 < small_batch_size <= large_batch_size or threshold <= 0:
            raise ValueError("need 0 < small_batch_size <= large_batch_size and threshold > 0")
        self.small_batch_size = small_batch_size
        self.large_batch_size = large_batch_size
        self.threshold = threshold
        self.previous_norm: float | None = None
        self.current_norm: float | None = None

    def observe(self, norm: float) -> None:
        if not math.isfinite(norm) or norm < 0:
            raise ValueError(f"a gradient norm is finite and >= 0, got {norm}")
        self.previous_norm, self.current_norm = self.current_norm, norm

    @property
    def relative_change(self) -> float | None:
        """``|p - c| / p`` for the last two norms, ``None`` before the second one."""
        if self.previous_norm is None or self.current_norm is None:
            return None
        if self.previous_norm == 0:
            return 0.0 if self.current_norm == 0 else math.inf
        return abs(self.previous_norm - self.current_norm) / self.previous_norm

    @property
    def critical(self) -> bool:
        change = self.relative_change
        return change is None or change >= self.threshold

    def decide(self, batch_size: int) -> ScalingDecision:
        change = self.relative_change
        if change is None:
            target, reason = self.small_batch_size, "first interval: critical until compared"
        elif change >= self.threshold:
            target, reason = self.small_batch_size, "critical regime: the norm changes fast"
        else:
            target, reason = self.large_batch_size, "the gradient norm changes slowly"
        return ScalingDecision(target, target != batch_size, reason, change)

    def state_dict(self) -> dict[str, float | None]:
        return {"previous_norm": self.previous_norm, "current_norm": self.current_norm}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        previous, current = state.get("previous_norm"), state.get("current_norm")
        self.previous_norm = None if previous is None else float(previous)
        self.current_norm = None if current is None else float(current)
