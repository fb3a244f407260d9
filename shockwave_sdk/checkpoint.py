"""Checkpoints a preempted job resumes from, and the SIGTERM flag that tells it to write one.

The agent stops an attempt with SIGTERM, waits a grace period, then sends SIGKILL.
A training loop installs :class:`GracefulStop`, checks :attr:`GracefulStop.requested` at
every step, and when it is set saves a checkpoint and exits 0. Every write here is atomic: the
new content goes to a temporary file in the same directory, is flushed to disk, and replaces the
old file with one ``rename``, so a SIGKILL in the middle of a save leaves the previous
checkpoint intact, never a torn one.
"""

from __future__ import annotations

import io
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

import numpy as np
import numpy.typing as npt

TEMP_SUFFIX = ".partial"
FILE_MODE = 0o644
META_KEY = "__shockwave_meta__"


@contextmanager
def atomic_write(path: Path) -> Iterator[IO[bytes]]:
    """A binary file whose content replaces ``path`` when the block exits without an error.

    On an error (or a signal that raises) the temporary file is removed and ``path`` keeps its
    previous content. ``torch.save(state, f)`` and ``np.save(f, array)`` write into it directly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ArrayCheckpoint:
    """A checkpoint of NumPy arrays (the model and optimizer state) and JSON metadata (epoch,
    step, batch size, whatever the program needs to resume)."""

    arrays: Mapping[str, npt.NDArray[Any]]
    meta: Mapping[str, Any]


class CheckpointStore:
    """Files in a job's checkpoint directory (``SHOCKWAVE_CHECKPOINT_DIR``), written atomically.

    Names are plain file names inside the directory. Creating a store removes temporary files
    that a killed writer left behind.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(f".*{TEMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)

    def path(self, name: str) -> Path:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"a checkpoint name is a plain file name, got {name!r}")
        return self.directory / name

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def save_bytes(self, name: str, data: bytes) -> Path:
        target = self.path(name)
        with atomic_write(target) as handle:
            handle.write(data)
        return target

    def load_bytes(self, name: str) -> bytes | None:
        target = self.path(name)
        return target.read_bytes() if target.is_file() else None

    def save_json(self, name: str, value: Any) -> Path:
        return self.save_bytes(name, json.dumps(value, sort_keys=True).encode())

    def load_json(self, name: str) -> Any:
        """The stored value, or ``None`` when there is no such file."""
        data = self.load_bytes(name)
        return None if data is None else json.loads(data)

    def save_arrays(
        self,
        name: str,
        arrays: Mapping[str, npt.ArrayLike],
        meta: Mapping[str, Any] | None = None,
    ) -> Path:
        """Save ``arrays`` and JSON-serializable ``meta`` as one ``.npz`` file."""
        if META_KEY in arrays:
            raise ValueError(f"{META_KEY!r} is reserved for the metadata")
        encoded = np.frombuffer(json.dumps(dict(meta or {}), sort_keys=True).encode(), np.uint8)
        buffer = io.BytesIO()
        contents: dict[str, Any] = {key: np.asarray(value) for key, value in arrays.items()}
        contents[META_KEY] = encoded
        np.savez(buffer, **contents)
        return self.save_bytes(name, buffer.getvalue())

    def load_arrays(self, name: str) -> ArrayCheckpoint | None:
        """The checkpoint saved by :meth:`save_arrays`, or ``None`` when there is none."""
        data = self.load_bytes(name)
        if data is None:
            return None
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files if key != META_KEY}
            meta = json.loads(archive[META_KEY].tobytes()) if META_KEY in archive.files else {}
        return ArrayCheckpoint(arrays=arrays, meta=meta)


SignalHandler = Any
"""What ``signal.signal`` returns: a callable, ``SIG_DFL``, ``SIG_IGN`` or ``None``."""


class GracefulStop:
    """Turns SIGTERM (and by default SIGINT) into a flag the training loop polls.

    The first signal only sets :attr:`requested`; the loop then checkpoints at its next step and
    exits 0. A second signal of the same kind restores the previous handler and delivers the
    signal again, so a program stuck before its next step can still be stopped. Use it as a
    context manager, or call :meth:`install` and :meth:`restore`. Handlers can only be installed
    from the main thread.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)):
        self._signals = signals
        self._previous: dict[signal.Signals, SignalHandler] = {}
        self._received: signal.Signals | None = None
        self._requested_at: float | None = None

    @property
    def requested(self) -> bool:
        return self._received is not None

    @property
    def received_signal(self) -> signal.Signals | None:
        """The signal that asked the job to stop, if one did."""
        return self._received

    def seconds_since_request(self) -> float | None:
        """Time since the stop was requested (monotonic clock), to budget the grace period."""
        return None if self._requested_at is None else time.monotonic() - self._requested_at

    def request(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Set the flag as the signal would (for a job that decides to stop by itself)."""
        if self._received is None:
            self._received = signum
            self._requested_at = time.monotonic()

    def install(self) -> GracefulStop:
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        received = signal.Signals(signum)
        if self._received == received:
            previous = self._previous.pop(received, signal.SIG_DFL)
            signal.signal(received, previous if previous is not None else signal.SIG_DFL)
            signal.raise_signal(received)
            return
        self.request(received)

    def __enter__(self) -> GracefulStop:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.restore()
