"""What a job's client events say about it, folded one event at a time.

Training programs report epoch progress and batch-size changes as client events, each with the
client's per-job sequence number ``seq`` (the service stores each seq once). :func:`fold` adds
one event to a job's :class:`Observed` state with constant work (a scaling event also keeps
the job's few scaling events in order), and the result does not depend on the order the events
arrive in, so a late, older event never moves the state backwards:

- ``epochs_done``: the highest finished epoch of any progress event;
- ``batch_size``: that of the scaling event with the highest epoch (ties: the highest seq),
  else the job's initial batch size;
- ``attained_s``: the sum of the progress events' seconds;
- ``measured_epoch_seconds``: the mean seconds of the progress events at each batch size;
- ``observed_regimes``: the regimes the job has left behind, cut where its batch size changed
  (:func:`regimes_of`).

This is the one rule: the API folds each new event into the job's stored state, and the
planner's snapshot reads that stored state (:mod:`store.events`, :mod:`store.snapshot`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shockwave.domain.model import Regime
from shockwave.domain.snapshot import JobProgress

Scaling = tuple[int, int, int]
"""A scaling event as ``(epoch, seq, batch size)``."""


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """A client event: ``kind`` is ``progress`` (``payload``: ``epoch`` finished, its
    ``seconds``, the ``batch_size`` it ran at) or ``scaling`` (``payload``: the ``batch_size``
    from ``epoch`` on); ``payload`` is the event's body without ``seq`` and ``kind``."""

    seq: int
    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Observed:
    """A job's state as its client events tell it (module docstring). ``epoch_seconds``: per
    batch size, the total seconds and the number of the progress events measured at it.
    ``scalings``: the scaling events, sorted."""

    initial_batch_size: int
    epochs_done: int = 0
    attained_s: float = 0.0
    epoch_seconds: Mapping[int, tuple[float, int]] = field(default_factory=dict)
    scalings: tuple[Scaling, ...] = ()
    last_seq: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epoch_seconds", MappingProxyType(dict(self.epoch_seconds)))

    @property
    def batch_size(self) -> int:
        return self.scalings[-1][2] if self.scalings else self.initial_batch_size

    @property
    def measured_epoch_seconds(self) -> Mapping[int, float]:
        """Mean seconds of an epoch at each batch size measured, by batch size."""
        return {bs: total / count for bs, (total, count) in sorted(self.epoch_seconds.items())}

    @property
    def observed_regimes(self) -> tuple[Regime, ...]:
        return regimes_of(self.initial_batch_size, self.scalings)[0]

    def progress(self, gpus: tuple[int, ...] = ()) -> JobProgress:
        """The job's progress as a policy sees it (on ``gpus``, if it holds any)."""
        return JobProgress(
            batch_size=self.batch_size,
            epochs_done=float(self.epochs_done),
            observed_regimes=self.observed_regimes,
            measured_epoch_seconds=self.measured_epoch_seconds,
            attained_s=self.attained_s,
            gpus=gpus,
        )


def fold(state: Observed, event: ClientEvent) -> Observed:
    """``state`` with ``event`` added (each seq is folded once: the caller refuses
    duplicates). Events of other kinds only move ``last_seq``."""
    last_seq = max(state.last_seq, event.seq)
    if event.kind == "progress":
        batch_size = int(event.payload["batch_size"])
        seconds = float(event.payload["seconds"])
        total, count = state.epoch_seconds.get(batch_size, (0.0, 0))
        return Observed(
            initial_batch_size=state.initial_batch_size,
            epochs_done=max(state.epochs_done, int(event.payload["epoch"])),
            attained_s=state.attained_s + seconds,
            epoch_seconds={**state.epoch_seconds, batch_size: (total + seconds, count + 1)},
            scalings=state.scalings,
            last_seq=last_seq,
        )
    scalings = state.scalings
    if event.kind == "scaling":
        scaling = (int(event.payload["epoch"]), event.seq, int(event.payload["batch_size"]))
        ordered = list(scalings)
        bisect.insort(ordered, scaling)
        scalings = tuple(ordered)
    return Observed(
        initial_batch_size=state.initial_batch_size,
        epochs_done=state.epochs_done,
        attained_s=state.attained_s,
        epoch_seconds=state.epoch_seconds,
        scalings=scalings,
        last_seq=last_seq,
    )


def observe(initial_batch_size: int, events: Iterable[ClientEvent]) -> Observed:
    """The state of a job that started at ``initial_batch_size`` after ``events``, in any
    order: :func:`fold` over them."""
    state = Observed(initial_batch_size)
    for event in events:
        state = fold(state, event)
    return state


def regimes_of(
    initial_batch_size: int, scalings: Iterable[Scaling]
) -> tuple[tuple[Regime, ...], int]:
    """The finished regimes and the current batch size, from scaling events given as
    ``(epoch, seq, batch_size)``: a regime ends where the batch size changes; several changes
    at one epoch count as the last of them (highest seq)."""
    regimes: list[Regime] = []
    current, start = initial_batch_size, 0
    for epoch, _seq, batch_size in sorted(scalings):
        if batch_size == current:
            continue
        if epoch > start:
            regimes.append(Regime(current, epoch - start))
            start = epoch
        elif regimes and regimes[-1].batch_size == batch_size:
            start -= regimes.pop().epochs
        current = batch_size
    return tuple(regimes), current
