"""Logistic regression on synthetic data, trained with minibatch SGD in NumPy, under Shockwave.

A small but real training program that uses the SDK the way a GPU job would:

- it reads its job (epochs, samples per epoch, batch sizes, mode) from the API when an agent
  started it, and from the command line otherwise;
- it resumes from the checkpoint in ``SHOCKWAVE_CHECKPOINT_DIR`` (weights, position within the
  epoch, batch size, the scaling helper's state), so a preempted job continues where it was;
- it reports every finished epoch, and lets GNS (per-example gradients) or Accordion (the norm
  of the epoch's mean gradient) decide from its real gradients when to change its batch size,
  which it then requests;
- on SIGTERM it checkpoints at the next step and exits 0;
- it runs on the GPU count its lease gives (``SHOCKWAVE_WORLD_SIZE``): an elastic job's may
  change between attempts, and it resumes from the same checkpoint on the new count;
- it appends its loss curve to ``loss.jsonl`` in the checkpoint directory (one JSON object a
  line: ``start``, ``epoch``, ``stopped`` and ``finished`` records, each with the attempt id).

Run it alone: ``python examples/numpy_linear.py --checkpoint-dir /tmp/lr --mode gns``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shockwave_sdk import (
    Accordion,
    CheckpointStore,
    GracefulStop,
    GradientNoiseScale,
    GradientNormTracker,
    JobEnvironment,
    JobFinished,
    ScalingDecision,
    ShockwaveClient,
    per_example_sample,
    remembered_job,
    world_size_change,
)

Array = npt.NDArray[np.float64]
CHECKPOINT = "numpy_linear.npz"
LOSS_LOG = "loss.jsonl"
STOP_FLUSH_S = 3.0


@dataclass(frozen=True, slots=True)
class Config:
    """What to train: ``batch_sizes`` is the ladder scaling moves along (its largest is the
    maximum); ``mode``: ``gns``, ``accordion`` or ``static``."""

    epochs: int
    samples: int
    features: int
    batch_size: int
    batch_sizes: tuple[int, ...]
    mode: str
    lr: float
    seed: int
    threshold: float | None
    min_step_seconds: float


@dataclass
class Progress:
    """Where training is: ``epoch`` epochs finished, ``offset`` samples into the next one,
    ``epoch_seconds`` spent on it so far (over attempts)."""

    weights: Array
    epoch: int = 0
    offset: int = 0
    batch_size: int = 1
    epoch_seconds: float = 0.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8192, help="samples per epoch")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batch-sizes", default="16,32,64,128", help="the scaling ladder")
    parser.add_argument("--mode", choices=("gns", "accordion", "static"), default="gns")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate at --batch-size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold", type=float, default=None, help="the helper's threshold")
    parser.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="pace each step to at least this long (stands in for a slower accelerator in demos)",
    )
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    return parser.parse_args(argv)


def configure(
    args: argparse.Namespace, client: ShockwaveClient | None, store: CheckpointStore
) -> Config:
    """The command line's settings, overridden by the job's own record when under Shockwave
    (from the API, or the copy an earlier attempt kept when the API cannot be reached)."""
    ladder = tuple(sorted({int(b) for b in str(args.batch_sizes).split(",") if b}))
    config = Config(
        epochs=args.epochs,
        samples=args.samples,
        features=args.features,
        batch_size=args.batch_size,
        batch_sizes=ladder or (args.batch_size,),
        mode=args.mode,
        lr=args.lr,
        seed=args.seed,
        threshold=args.threshold,
        min_step_seconds=args.min_step_seconds,
    )
    if client is None:
        return config
    job = remembered_job(client, store)
    if job is None:
        log("cannot read the job from the API: using the command line's settings")
        return config
    mode = job.mode if job.mode in ("gns", "accordion") else "static"
    return replace(
        config,
        epochs=job.epochs,
        samples=job.samples_per_epoch,
        batch_size=job.initial_batch_size,
        batch_sizes=tuple(sorted({job.initial_batch_size, *job.batch_sizes})),
        mode=mode,
    )


def make_data(config: Config) -> tuple[Array, Array]:
    """Features ``(n, d + 1)`` (the last column is the bias) and 0/1 labels drawn from a
    logistic model, so even the true weights leave gradient noise."""
    rng = np.random.default_rng(config.seed)
    x = rng.standard_normal((config.samples, config.features))
    true_w = rng.standard_normal(config.features) * (3.0 / math.sqrt(config.features))
    labels = (rng.random(config.samples) < sigmoid(x @ true_w + 0.5)).astype(np.float64)
    return np.hstack([x, np.ones((config.samples, 1))]), labels


def sigmoid(z: Array) -> Array:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))


def loss(weights: Array, x: Array, y: Array) -> float:
    p = np.clip(sigmoid(x @ weights), 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def per_example_gradients(weights: Array, x: Array, y: Array) -> Array:
    """Each example's gradient of its log loss: ``(p_i - y_i) x_i``, shape ``(batch, d + 1)``."""
    return (sigmoid(x @ weights) - y)[:, None] * x


class Scaler:
    """The configured helper (GNS, Accordion or none) behind one small interface."""

    def __init__(self, config: Config) -> None:
        self.mode = config.mode
        largest, smallest = max(config.batch_sizes), min(config.batch_sizes)
        threshold = config.threshold
        self.gns = GradientNoiseScale(
            largest, ladder=config.batch_sizes, threshold=1.0 if threshold is None else threshold
        )
        self.accordion = Accordion(
            min(smallest, config.batch_size), largest, threshold=threshold or 0.5
        )
        self.tracker = GradientNormTracker()

    def step(self, per_example: Array, gradient: Array) -> None:
        if self.mode == "gns" and per_example.shape[0] >= 2:
            self.gns.observe(per_example_sample(per_example))
        elif self.mode == "accordion":
            self.tracker.add(gradient)

    def decide(self, batch_size: int) -> ScalingDecision | None:
        if self.mode == "gns":
            return self.gns.decide(batch_size)
        if self.mode == "accordion":
            norm = self.tracker.interval_norm()
            if norm is not None:
                self.accordion.observe(norm)
            return self.accordion.decide(batch_size)
        return None

    def state(self) -> dict[str, Any]:
        return {"gns": self.gns.state_dict(), "accordion": self.accordion.state_dict()}

    def load(self, state: dict[str, Any], tracker_sum: Array | None, tracker_steps: int) -> None:
        self.gns.load_state_dict(state["gns"])
        self.accordion.load_state_dict(state["accordion"])
        if tracker_sum is not None and tracker_steps > 0:
            self.tracker.total, self.tracker.steps = [tracker_sum], tracker_steps


def save(store: CheckpointStore, progress: Progress, scaler: Scaler) -> None:
    arrays: dict[str, Array] = {"weights": progress.weights}
    if scaler.tracker.total is not None:
        arrays["tracker_sum"] = np.asarray(scaler.tracker.total[0], np.float64)
    meta = {
        "epoch": progress.epoch,
        "offset": progress.offset,
        "batch_size": progress.batch_size,
        "epoch_seconds": progress.epoch_seconds,
        "scaler": scaler.state(),
        "tracker_steps": scaler.tracker.steps,
    }
    store.save_arrays(CHECKPOINT, arrays, meta)


def restore(store: CheckpointStore, scaler: Scaler) -> Progress | None:
    checkpoint = store.load_arrays(CHECKPOINT)
    if checkpoint is None:
        return None
    meta = checkpoint.meta
    scaler.load(
        meta["scaler"], checkpoint.arrays.get("tracker_sum"), int(meta.get("tracker_steps", 0))
    )
    return Progress(
        weights=np.asarray(checkpoint.arrays["weights"], np.float64),
        epoch=int(meta["epoch"]),
        offset=int(meta["offset"]),
        batch_size=int(meta["batch_size"]),
        epoch_seconds=float(meta["epoch_seconds"]),
    )


class LossLog:
    """Appends JSON lines to ``loss.jsonl``: the loss curve across attempts."""

    def __init__(self, path: Path, attempt: str) -> None:
        self.path, self.attempt = path, attempt

    def write(self, record: str, **fields: Any) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"record": record, "attempt": self.attempt, **fields}) + "\n")


def log(message: str) -> None:
    print(f"[numpy_linear] {message}", flush=True)


def train(
    config: Config,
    store: CheckpointStore,
    env: JobEnvironment,
    stop: GracefulStop,
    client: ShockwaveClient | None,
) -> int:
    """Train to the last epoch or until asked to stop; the process's exit code."""
    x, y = make_data(config)
    scaler = Scaler(config)
    progress = restore(store, scaler) or Progress(
        weights=np.zeros(x.shape[1]), batch_size=env.batch_size or config.batch_size
    )
    losses = LossLog(store.path(LOSS_LOG), env.attempt_id or f"local-{int(time.time())}")
    world = world_size_change(env, store)
    losses.write(
        "start",
        epoch=progress.epoch,
        offset=progress.offset,
        batch_size=progress.batch_size,
        loss=loss(progress.weights, x, y),
        world_size=world.current,
        previous_world_size=world.previous,
    )
    if world.changed:
        # Data parallel: the global batch size stays; each worker's share is what changes.
        share = max(1, progress.batch_size // world.current)
        log(f"{world.describe()}: resumed from the checkpoint, {share} samples a worker a step")
    log(
        f"starting at epoch {progress.epoch + 1}/{config.epochs}, offset {progress.offset}, "
        f"batch size {progress.batch_size}, mode {config.mode}"
    )
    while progress.epoch < config.epochs:
        if not run_epoch(config, progress, scaler, x, y, stop):
            save(store, progress, scaler)
            losses.write(
                "stopped",
                epoch=progress.epoch,
                offset=progress.offset,
                loss=loss(progress.weights, x, y),
            )
            log(f"stop requested: checkpointed at epoch {progress.epoch}, offset {progress.offset}")
            if client is not None:
                client.flush(STOP_FLUSH_S)
            return 0
        if not finish_epoch(config, progress, scaler, store, losses, x, y, client):
            return 0
    if client is not None:
        client.flush()
    losses.write("finished", epoch=progress.epoch, loss=loss(progress.weights, x, y))
    log("finished")
    return 0


def run_epoch(
    config: Config, progress: Progress, scaler: Scaler, x: Array, y: Array, stop: GracefulStop
) -> bool:
    """Train the rest of the current epoch; False when stopped part-way (``progress`` then
    says where)."""
    order = np.random.default_rng([config.seed, progress.epoch]).permutation(config.samples)
    lr = config.lr * progress.batch_size / config.batch_size
    started = time.monotonic()
    try:
        while progress.offset < config.samples:
            if stop.requested:
                return False
            step_started = time.monotonic()
            batch = order[progress.offset : progress.offset + progress.batch_size]
            per_example = per_example_gradients(progress.weights, x[batch], y[batch])
            gradient = per_example.mean(axis=0)
            scaler.step(per_example, gradient)
            progress.weights = progress.weights - lr * gradient
            progress.offset += len(batch)
            pause = config.min_step_seconds - (time.monotonic() - step_started)
            if pause > 0:
                time.sleep(pause)
        return True
    finally:
        progress.epoch_seconds += time.monotonic() - started


def finish_epoch(
    config: Config,
    progress: Progress,
    scaler: Scaler,
    store: CheckpointStore,
    losses: LossLog,
    x: Array,
    y: Array,
    client: ShockwaveClient | None,
) -> bool:
    """Log, report, decide the next batch size and checkpoint; False when the job turns out
    to be finished already (cancelled)."""
    epoch, used, seconds = progress.epoch + 1, progress.batch_size, progress.epoch_seconds
    current = loss(progress.weights, x, y)
    decision = scaler.decide(used)
    progress.epoch, progress.offset, progress.epoch_seconds = epoch, 0, 0.0
    if decision is not None and decision.changed and epoch < config.epochs:
        progress.batch_size = decision.batch_size
    losses.write(
        "epoch",
        epoch=epoch,
        loss=current,
        batch_size=used,
        seconds=seconds,
        next_batch_size=progress.batch_size,
        statistic=None if decision is None else decision.statistic,
    )
    log(
        f"epoch {epoch}/{config.epochs}: loss {current:.4f} at batch size {used} "
        f"({seconds:.2f} s)"
        + (
            f"; next {progress.batch_size}: {decision.reason}"
            if decision is not None and progress.batch_size != used
            else ""
        )
    )
    try:
        if client is not None:
            client.report_epoch_end(epoch, config.samples, max(seconds, 1e-6), used)
            if progress.batch_size != used:
                client.request_batch_size(progress.batch_size, epoch)
    except JobFinished:
        log("the job is already finished or cancelled: stopping")
        save(store, progress, scaler)
        return False
    save(store, progress, scaler)
    return True


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    env = JobEnvironment.from_environ()
    directory = env.checkpoint_dir or args.checkpoint_dir or Path("checkpoints/numpy_linear")
    store = CheckpointStore(directory)
    with GracefulStop() as stop:
        client = None
        if env.managed:
            client = ShockwaveClient.from_environment(
                replace(env, checkpoint_dir=store.directory),
                should_give_up=lambda: stop.requested,
            )
        try:
            return train(configure(args, client, store), store, env, stop, client)
        finally:
            if client is not None:
                client.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
