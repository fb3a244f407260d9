"""An MLP on synthetic data, trained with PyTorch under Shockwave (on a GPU when there is one).

The PyTorch counterpart of ``numpy_linear.py``: it reads its job from the API when an agent
started it, resumes from ``torch_mlp.pt`` in ``SHOCKWAVE_CHECKPOINT_DIR`` (model, optimizer,
position within the epoch, batch size, the scaling helper's state), reports every epoch, lets
GNS (micro-batch gradients) or Accordion (the epoch's mean gradient norm) decide from its real
gradients when to change its batch size, checkpoints on SIGTERM at the next step and exits 0,
and appends its loss curve to ``loss.jsonl`` in the checkpoint directory.

The labels come from a fixed random "teacher" network plus label noise, so the data is the
same on every attempt and the loss has a floor above zero. Needs torch; without it the program
says so and exits 2.

Run it alone: ``python examples/torch_mlp.py --checkpoint-dir /tmp/mlp --mode accordion``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shockwave_sdk import (
    Accordion,
    CheckpointStore,
    GracefulStop,
    GradientNoiseScale,
    GradientNormTracker,
    JobEnvironment,
    JobFinished,
    ShockwaveClient,
    atomic_write,
    micro_batch_sample,
    remembered_job,
)

try:
    import torch
    from torch import nn
except ImportError:
    HAVE_TORCH = False
else:
    HAVE_TORCH = True

CHECKPOINT = "torch_mlp.pt"
LOSS_LOG = "loss.jsonl"
MICRO_BATCHES = 4
STOP_FLUSH_S = 3.0
NO_TORCH = 2


@dataclass(frozen=True, slots=True)
class Config:
    epochs: int
    samples: int
    features: int
    hidden: int
    classes: int
    batch_size: int
    batch_sizes: tuple[int, ...]
    mode: str
    lr: float
    seed: int
    min_step_seconds: float


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8192, help="samples per epoch")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batch-sizes", default="32,64,128,256", help="the scaling ladder")
    parser.add_argument("--mode", choices=("gns", "accordion", "static"), default="accordion")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate at --batch-size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-step-seconds", type=float, default=0.0)
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
        hidden=args.hidden,
        classes=args.classes,
        batch_size=args.batch_size,
        batch_sizes=ladder or (args.batch_size,),
        mode=args.mode,
        lr=args.lr,
        seed=args.seed,
        min_step_seconds=args.min_step_seconds,
    )
    if client is None:
        return config
    job = remembered_job(client, store)
    if job is None:
        log("cannot read the job from the API: using the command line's settings")
        return config
    return replace(
        config,
        epochs=job.epochs,
        samples=job.samples_per_epoch,
        batch_size=job.initial_batch_size,
        batch_sizes=tuple(sorted({job.initial_batch_size, *job.batch_sizes})),
        mode=job.mode if job.mode in ("gns", "accordion") else "static",
    )


def log(message: str) -> None:
    print(f"[torch_mlp] {message}", flush=True)


class Trainer:
    """The model, its optimizer, the data and the scaling helper, on one device."""

    def __init__(self, config: Config, device: Any) -> None:
        self.config, self.device = config, device
        generator = torch.Generator().manual_seed(config.seed)
        self.x = torch.randn(config.samples, config.features, generator=generator)
        teacher = torch.randn(config.features, config.classes, generator=generator)
        logits = self.x @ teacher + 0.5 * torch.randn(
            config.samples, config.classes, generator=generator
        )
        self.x, self.y = self.x.to(device), logits.argmax(dim=1).to(device)
        torch.manual_seed(config.seed)
        self.model = nn.Sequential(
            nn.Linear(config.features, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.classes),
        ).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        largest = max(config.batch_sizes)
        self.gns = GradientNoiseScale(largest, ladder=config.batch_sizes)
        self.accordion = Accordion(min(*config.batch_sizes, config.batch_size), largest)
        self.tracker = GradientNormTracker()
        self.epoch, self.offset, self.epoch_seconds = 0, 0, 0.0
        self.batch_size = config.batch_size

    def parameters(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def step(self, batch: Any) -> None:
        """One SGD step on the examples ``batch`` (indices); feeds the scaling helper."""
        x, y = self.x[batch], self.y[batch]
        params = self.parameters()
        self.optimizer.zero_grad(set_to_none=True)
        chunks = MICRO_BATCHES if self.config.mode == "gns" else 1
        if chunks > 1 and len(batch) >= 2 * chunks and len(batch) % chunks == 0:
            micro_grads = []
            for xs, ys in zip(x.chunk(chunks), y.chunk(chunks), strict=True):
                grads = torch.autograd.grad(self.loss_fn(self.model(xs), ys), params)
                micro_grads.append([g.detach() for g in grads])
            self.gns.observe(micro_batch_sample(micro_grads, len(batch) // chunks))
            for param, *parts in zip(params, *micro_grads, strict=True):
                param.grad = torch.stack(parts).mean(dim=0)
        else:
            self.loss_fn(self.model(x), y).backward()
        if self.config.mode == "accordion":
            self.tracker.add([p.grad for p in params])
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr * self.batch_size / self.config.batch_size
        self.optimizer.step()

    def full_loss(self) -> float:
        with torch.no_grad():
            return float(self.loss_fn(self.model(self.x), self.y).item())

    def decide(self) -> tuple[int, str]:
        if self.config.mode == "gns":
            decision = self.gns.decide(self.batch_size)
        elif self.config.mode == "accordion":
            norm = self.tracker.interval_norm()
            if norm is not None:
                self.accordion.observe(norm)
            decision = self.accordion.decide(self.batch_size)
        else:
            return self.batch_size, "static"
        return decision.batch_size, decision.reason

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": [self.epoch, self.offset, self.epoch_seconds, self.batch_size],
            "gns": self.gns.state_dict(),
            "accordion": self.accordion.state_dict(),
            "tracker": [self.tracker.steps, self.tracker.total],
        }

    def load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        epoch, offset, seconds, batch_size = state["progress"]
        self.epoch, self.offset = int(epoch), int(offset)
        self.epoch_seconds, self.batch_size = float(seconds), int(batch_size)
        self.gns.load_state_dict(state["gns"])
        self.accordion.load_state_dict(state["accordion"])
        self.tracker.steps, self.tracker.total = state["tracker"]


def save(store: CheckpointStore, trainer: Trainer) -> None:
    with atomic_write(store.path(CHECKPOINT)) as handle:
        torch.save(trainer.state(), handle)


def restore(store: CheckpointStore, trainer: Trainer) -> bool:
    path = store.path(CHECKPOINT)
    if not path.is_file():
        return False
    trainer.load(torch.load(path, map_location=trainer.device, weights_only=True))
    return True


def train(
    config: Config,
    store: CheckpointStore,
    env: JobEnvironment,
    stop: GracefulStop,
    client: ShockwaveClient | None,
) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    trainer = Trainer(config, device)
    if not restore(store, trainer) and env.batch_size:
        trainer.batch_size = env.batch_size
    attempt = env.attempt_id or f"local-{int(time.time())}"

    def record(kind: str, **fields: Any) -> None:
        with store.path(LOSS_LOG).open("a") as handle:
            handle.write(json.dumps({"record": kind, "attempt": attempt, **fields}) + "\n")

    record(
        "start",
        epoch=trainer.epoch,
        offset=trainer.offset,
        loss=trainer.full_loss(),
        batch_size=trainer.batch_size,
        device=str(device),
    )
    log(
        f"on {device}: starting at epoch {trainer.epoch + 1}/{config.epochs}, "
        f"offset {trainer.offset}, batch size {trainer.batch_size}, mode {config.mode}"
    )
    while trainer.epoch < config.epochs:
        order = torch.randperm(
            config.samples,
            generator=torch.Generator().manual_seed(config.seed * 1009 + trainer.epoch),
        ).to(device)
        started = time.monotonic()
        while trainer.offset < config.samples and not stop.requested:
            step_started = time.monotonic()
            batch = order[trainer.offset : trainer.offset + trainer.batch_size]
            trainer.step(batch)
            trainer.offset += len(batch)
            pause = config.min_step_seconds - (time.monotonic() - step_started)
            if pause > 0:
                time.sleep(pause)
        if device.type == "cuda":
            torch.cuda.synchronize()
        trainer.epoch_seconds += time.monotonic() - started
        if stop.requested:
            save(store, trainer)
            record("stopped", epoch=trainer.epoch, offset=trainer.offset, loss=trainer.full_loss())
            log(f"stop requested: checkpointed at epoch {trainer.epoch}, offset {trainer.offset}")
            if client is not None:
                client.flush(STOP_FLUSH_S)
            return 0
        used, seconds = trainer.batch_size, trainer.epoch_seconds
        trainer.epoch, trainer.offset, trainer.epoch_seconds = trainer.epoch + 1, 0, 0.0
        target, reason = trainer.decide()
        if target != used and trainer.epoch < config.epochs:
            trainer.batch_size = target
        loss = trainer.full_loss()
        record(
            "epoch",
            epoch=trainer.epoch,
            loss=loss,
            batch_size=used,
            seconds=seconds,
            next_batch_size=trainer.batch_size,
        )
        log(
            f"epoch {trainer.epoch}/{config.epochs}: loss {loss:.4f} at batch size {used} "
            f"({seconds:.2f} s)"
            + (f"; next {trainer.batch_size}: {reason}" if trainer.batch_size != used else "")
        )
        try:
            if client is not None:
                client.report_epoch_end(trainer.epoch, config.samples, max(seconds, 1e-6), used)
                if trainer.batch_size != used:
                    client.request_batch_size(trainer.batch_size, trainer.epoch)
        except JobFinished:
            log("the job is already finished or cancelled: stopping")
            save(store, trainer)
            return 0
        save(store, trainer)
    if client is not None:
        client.flush()
    record("finished", epoch=trainer.epoch, loss=trainer.full_loss())
    log("finished")
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not HAVE_TORCH:
        print("torch_mlp: PyTorch is not installed (pip install torch)", file=sys.stderr)
        return NO_TORCH
    env = JobEnvironment.from_environ()
    directory = env.checkpoint_dir or args.checkpoint_dir or Path("checkpoints/torch_mlp")
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
