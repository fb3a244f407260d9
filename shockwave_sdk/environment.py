"""The environment a node agent gives a training process (docs/sdk.md).

Read once, at the training program's entry point, into a frozen value that the rest of the SDK
takes as a parameter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class InvalidEnvironment(ValueError):
    """A SHOCKWAVE_* variable is present but unusable (say, a batch size that is not a number)."""


@dataclass(frozen=True, slots=True)
class JobEnvironment:
    """What the agent set for this attempt of the job.

    ``api_url``, ``token`` and ``job_id`` are all set when an agent started the process, all
    ``None`` when it runs on its own (a developer's laptop): :attr:`managed` tells which.
    ``checkpoint_dir`` is the same for every attempt of the job, relative paths resolved against
    the working directory the agent started the process in. ``batch_size`` is the job's current
    batch size as the service knows it (from its scaling events). ``world_size``: the GPUs
    this attempt runs on (``SHOCKWAVE_WORLD_SIZE``; an elastic job's may differ from its last
    attempt's, docs/elastic.md), else the count of ``CUDA_VISIBLE_DEVICES``, else None.
    """

    job_id: str | None = None
    api_url: str | None = None
    token: str | None = None
    checkpoint_dir: Path | None = None
    batch_size: int | None = None
    attempt_id: str | None = None
    visible_devices: str | None = None
    world_size: int | None = None

    @property
    def managed(self) -> bool:
        """True when the process can report to the Shockwave API."""
        return self.job_id is not None and self.api_url is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnvironment:
        """Parse ``environ`` (default: ``os.environ``); empty variables count as unset."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        checkpoint = get("SHOCKWAVE_CHECKPOINT_DIR")
        return cls(
            job_id=get("SHOCKWAVE_JOB_ID"),
            api_url=_strip_slash(get("SHOCKWAVE_API_URL")),
            token=get("SHOCKWAVE_TOKEN"),
            checkpoint_dir=Path(checkpoint).resolve() if checkpoint else None,
            batch_size=_positive_int("SHOCKWAVE_BATCH_SIZE", get("SHOCKWAVE_BATCH_SIZE")),
            attempt_id=get("SHOCKWAVE_ATTEMPT_ID"),
            visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
            world_size=_positive_int("SHOCKWAVE_WORLD_SIZE", get("SHOCKWAVE_WORLD_SIZE"))
            or _device_count(env.get("CUDA_VISIBLE_DEVICES")),
        )


def _device_count(devices: str | None) -> int | None:
    names = [d for d in (devices or "").split(",") if d.strip()]
    return len(names) or None


def _strip_slash(url: str | None) -> str | None:
    return url.rstrip("/") if url else url


def _positive_int(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError as error:
        raise InvalidEnvironment(f"{name} must be a positive integer, got {raw!r}") from error
    if value < 1:
        raise InvalidEnvironment(f"{name} must be a positive integer, got {raw!r}")
    return value
