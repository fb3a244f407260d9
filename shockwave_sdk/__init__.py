"""The Shockwave SDK for training programs (docs/sdk.md).

A program started by a node agent reads :class:`JobEnvironment` once, reports each finished
epoch and each batch-size change through :class:`ShockwaveClient`, saves and resumes from a
:class:`CheckpointStore` in ``SHOCKWAVE_CHECKPOINT_DIR``, stops cleanly on SIGTERM with
:class:`GracefulStop`, and lets :class:`Accordion` or :class:`GradientNoiseScale` decide from its
own gradients when to change its batch size. Needs only NumPy and httpx; PyTorch tensors are
accepted wherever gradients are, when torch is installed.
"""

from shockwave_sdk.checkpoint import ArrayCheckpoint, CheckpointStore, GracefulStop, atomic_write
from shockwave_sdk.client import (
    FENCED_EXIT_CODE,
    ApiUnavailable,
    AttemptFenced,
    Delivery,
    EventRejected,
    JobFinished,
    JobRecord,
    RetryPolicy,
    ShockwaveClient,
    exit_fenced,
    remembered_job,
)
from shockwave_sdk.elastic import WorldSizeChange, world_size_change
from shockwave_sdk.environment import InvalidEnvironment, JobEnvironment
from shockwave_sdk.outbox import EventOutbox, OutboxTaken
from shockwave_sdk.scaling import (
    Accordion,
    GradientNoiseScale,
    GradientNormTracker,
    NoiseScaleSample,
    ScalingDecision,
    micro_batch_sample,
    next_rung,
    per_example_sample,
    squared_norm,
    two_batch_sample,
)

__all__ = [
    "FENCED_EXIT_CODE",
    "Accordion",
    "ApiUnavailable",
    "ArrayCheckpoint",
    "AttemptFenced",
    "CheckpointStore",
    "Delivery",
    "EventOutbox",
    "EventRejected",
    "GracefulStop",
    "GradientNoiseScale",
    "GradientNormTracker",
    "InvalidEnvironment",
    "JobEnvironment",
    "JobFinished",
    "JobRecord",
    "NoiseScaleSample",
    "OutboxTaken",
    "RetryPolicy",
    "ScalingDecision",
    "ShockwaveClient",
    "WorldSizeChange",
    "atomic_write",
    "exit_fenced",
    "micro_batch_sample",
    "next_rung",
    "per_example_sample",
    "remembered_job",
    "squared_norm",
    "two_batch_sample",
    "world_size_change",
]
