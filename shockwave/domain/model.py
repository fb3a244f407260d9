"""Domain model of the scheduling core: jobs, regimes, throughput knowledge, the cluster.

Everything here is a frozen value checked on construction. Impossible input raises
:class:`ValidationError`, which names the field at fault so the API and the trace reader can
report it as-is. Nothing in this module reads a clock, a file or the environment.

Units: time in seconds, throughput in samples per second of the whole gang (all of the job's
GPUs together, the job running alone), progress in epochs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

MAX_WIDTH = 1024
"""The widest gang a job may ask for."""

VALID_WIDTHS: tuple[int, ...] = tuple(2**k for k in range(MAX_WIDTH.bit_length()))
"""Gang sizes a job may ask for: every power of two from 1 to :data:`MAX_WIDTH` GPUs.

Data-parallel gangs split each batch evenly over their GPUs, and production job logs ask for
powers of two (every job of the Microsoft ITP traces: 1 to 64 GPUs). The paper's traces use
1, 2, 4 and 8; a gang wider than a node spans nodes (:mod:`shockwave.rounds.placement` keeps it on
as few as it can), and a job wider than its cluster can never run. Every layer checks a width with
:func:`is_valid_width`, so this is the one place the rule lives.
"""


def is_valid_width(gpus: object) -> bool:
    """Whether ``gpus`` is a gang size a job may ask for (one of :data:`VALID_WIDTHS`)."""
    return isinstance(gpus, int) and not isinstance(gpus, bool) and gpus in VALID_WIDTHS


def nearest_width(gpus: int, most: int | None = None) -> int:
    """The gang size closest to ``gpus`` by ratio (ties go to the wider), at most ``most``
    (and :data:`MAX_WIDTH`) when that is a width: how a job log's 3-, 6- or 12-GPU job runs
    (as 4, 8 and 16). ``gpus`` itself when it is a gang size within the bound. Raises
    ValueError for fewer than one GPU or a bound below one."""
    if gpus < 1:
        raise ValueError(f"a gang has at least one GPU, got {gpus}")
    bound = MAX_WIDTH if most is None else min(most, MAX_WIDTH)
    if bound < 1:
        raise ValueError(f"no gang size is at most {most}")
    widths = [w for w in VALID_WIDTHS if w <= bound]
    return min(widths, key=lambda w: (abs(math.log2(w / gpus)), -w))


def width_rule() -> str:
    """The width rule in words, for error messages."""
    return f"a power of two from 1 to {MAX_WIDTH}"


MIN_RATE = 1e-3
MAX_RATE = 1e9
"""Declared throughputs (samples per second of the gang) a real job can have: from one sample
in over 16 minutes to a billion a second. Outside them the numbers the planner derives (epoch
times, utilities) leave the range a float or a round count can hold: a rate of 1e-300 made
every plan fail with an overflow."""

MAX_TOTAL_SAMPLES = 10**12
"""Epochs x samples per epoch: a thousand times ImageNet-1k trained for a thousand epochs."""

MAX_RUN_SECONDS = 1e9
"""The longest exclusive run time (about 31 years) a job may declare at its slowest declared
rate: any longer and the planner's horizon (rounds of 120 s) is not a meaningful bound."""

MAX_BUDGET = 1e6
"""The largest market weight; the planner raises it to a power with the FTF estimate."""


DEFAULT_TENANT = ""
"""The tenant of a job that names none: the root of the tenant tree
(:mod:`shockwave.domain.tenancy`)."""

MAX_TENANT_PATH_LENGTH = 255
MAX_TENANT_DEPTH = 8
MAX_PRIORITY_NAME_LENGTH = 64


class ValidationError(ValueError):
    """Input that cannot describe a real job or cluster.

    ``field`` is the dotted name of the offending field (``"gpus"``, ``"regimes[1].epochs"``) so
    that every shell can point at it without parsing the message.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class AdaptationMode(StrEnum):
    """How a job changes its batch size while it trains (paper section 2).

    ``static`` never changes; ``accordion`` alternates between a small and a large batch size
    around critical regimes; ``gns`` doubles the batch size as the gradient noise scale grows and
    never goes down; ``custom`` follows a declared list of batch sizes in order.
    """

    STATIC = "static"
    ACCORDION = "accordion"
    GNS = "gns"
    CUSTOM = "custom"

    @classmethod
    def parse(cls, value: str, field: str = "mode") -> AdaptationMode:
        try:
            return cls(value.strip().lower())
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValidationError(
                field, f"unknown adaptation mode {value!r} (one of {allowed})"
            ) from None


@dataclass(frozen=True, slots=True)
class Regime:
    """A stretch of training at one batch size: ``epochs`` epochs at ``batch_size``."""

    batch_size: int
    epochs: int

    def __post_init__(self) -> None:
        _require_positive_int("batch_size", self.batch_size)
        _require_positive_int("epochs", self.epochs)


@dataclass(frozen=True, slots=True)
class ThroughputProfile:
    """Samples per second of the whole gang, running alone, at each known batch size.

    This is knowledge a user may declare (or a profiler may measure) before the job runs; it is
    not the job's future trajectory, only how fast each batch size would go.
    """

    samples_per_second: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for bs, rate in self.samples_per_second.items():
            _require_positive_int(f"throughput[{bs}]", bs)
            if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
                raise ValidationError(
                    f"throughput[{bs}]", f"must be a positive number, got {rate!r}"
                )
            if not MIN_RATE <= rate <= MAX_RATE:
                raise ValidationError(
                    f"throughput[{bs}]",
                    f"must be between {MIN_RATE:g} and {MAX_RATE:g} samples/s, got {rate!r}",
                )
        object.__setattr__(
            self,
            "samples_per_second",
            MappingProxyType(dict(sorted(self.samples_per_second.items()))),
        )

    def knows(self, batch_size: int) -> bool:
        return batch_size in self.samples_per_second

    def epoch_seconds(self, batch_size: int, samples_per_epoch: int) -> float:
        """Seconds one epoch takes at ``batch_size``; KeyError when that size is unknown."""
        return samples_per_epoch / self.samples_per_second[batch_size]


ELASTIC_GUESS_EXPONENT = 0.8
"""Where an elastic job declares no throughput at a GPU count, its rate there is guessed as
(g / requested) ** 0.8 of its rate on the requested count: sublinear, as data-parallel
training is (the reference tables' median over models is about that from 1 to 8 GPUs)."""


@dataclass(frozen=True, slots=True)
class ElasticRange:
    """An elastic job's GPU counts: any of :data:`VALID_WIDTHS` from ``min_gpus`` to
    ``max_gpus``, the requested count among them.

    ``speedup[g][bs]``: throughput on g GPUs over throughput on the requested count at batch
    size bs (declared or measured: in the simulator, the throughput table's ratio). The job's
    requested count stays its reference: finish-time fairness and its declared profile are
    against it, for every policy (docs/elastic.md).
    """

    min_gpus: int
    max_gpus: int
    speedup: Mapping[int, Mapping[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("min_gpus", "max_gpus"):
            value = getattr(self, name)
            if not is_valid_width(value):
                raise ValidationError(f"elastic.{name}", f"must be {width_rule()}, got {value!r}")
        if self.min_gpus > self.max_gpus:
            raise ValidationError(
                "elastic.min_gpus", f"{self.min_gpus} is above max_gpus {self.max_gpus}"
            )
        frozen: dict[int, Mapping[int, float]] = {}
        for gpus, rates in self.speedup.items():
            if not is_valid_width(gpus):
                raise ValidationError(f"elastic.speedup[{gpus}]", f"not {width_rule()}")
            for bs, factor in rates.items():
                _require_positive_int(f"elastic.speedup[{gpus}][{bs}]", bs)
                if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
                    raise ValidationError(
                        f"elastic.speedup[{gpus}][{bs}]",
                        f"must be a positive number, got {factor!r}",
                    )
            frozen[gpus] = MappingProxyType(dict(rates))
        object.__setattr__(self, "speedup", MappingProxyType(frozen))

    @property
    def widths(self) -> tuple[int, ...]:
        """The GPU counts the job may run on, ascending."""
        return tuple(w for w in VALID_WIDTHS if self.min_gpus <= w <= self.max_gpus)

    def factor(self, gpus: int, requested: int, batch_size: int) -> float:
        """Throughput on ``gpus`` GPUs over throughput on ``requested`` at ``batch_size``: the
        declared ratio, else the geometric mean of those declared at ``gpus``, else the
        :data:`ELASTIC_GUESS_EXPONENT` guess."""
        if gpus == requested:
            return 1.0
        rates = self.speedup.get(gpus, {})
        if batch_size in rates:
            return float(rates[batch_size])
        if rates:
            return float(math.exp(sum(math.log(v) for v in rates.values()) / len(rates)))
        return float((gpus / requested) ** ELASTIC_GUESS_EXPONENT)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits: the job's shape, length, adaptation and knowledge.

    ``batch_sizes`` is the declared ladder of batch sizes: for ``custom`` the sizes in the order
    the job will use them (the first is the initial size), for ``accordion`` and ``gns`` the
    sizes the job may move between (the largest is its maximum). ``budget`` is the job's weight
    in the market (paper section 6.1, B_j) within its tenant; 1 unless raised. ``tenant``: the
    path of the tenant the job belongs to (:mod:`shockwave.domain.tenancy`; ``""``, the default
    tenant); ``priority``: the name of a priority class, whose multiplier (given to the policy
    with the tenants) moves the job only within its tenant's share; None: multiplier 1.
    ``type_throughput``: the gang's throughput on other GPU types, by type name
    (:mod:`shockwave.market.heterogeneity`); ``throughput`` is on the reference type, and a type
    absent here is taken to run at the reference speed.
    """

    job_id: str
    gpus: int
    epochs: int
    samples_per_epoch: int
    initial_batch_size: int
    mode: AdaptationMode = AdaptationMode.STATIC
    batch_sizes: tuple[int, ...] = ()
    throughput: ThroughputProfile = field(default_factory=ThroughputProfile)
    arrival_s: float = 0.0
    budget: float = 1.0
    model: str = ""
    type_throughput: Mapping[str, ThroughputProfile] = field(default_factory=dict)
    elastic: ElasticRange | None = None
    tenant: str = DEFAULT_TENANT
    priority: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise ValidationError("job_id", "must be a non-empty string")
        check_tenant_path(self.tenant)
        if self.priority is not None and not (
            isinstance(self.priority, str)
            and 0 < len(self.priority) <= MAX_PRIORITY_NAME_LENGTH
            and self.priority.isprintable()
        ):
            raise ValidationError(
                "priority",
                f"must be a priority class name of 1 to {MAX_PRIORITY_NAME_LENGTH} characters, "
                f"got {self.priority!r}",
            )
        if not is_valid_width(self.gpus):
            raise ValidationError("gpus", f"must be {width_rule()}, got {self.gpus!r}")
        _require_positive_int("epochs", self.epochs)
        _require_positive_int("samples_per_epoch", self.samples_per_epoch)
        _require_positive_int("initial_batch_size", self.initial_batch_size)
        if not isinstance(self.mode, AdaptationMode):
            object.__setattr__(self, "mode", AdaptationMode.parse(str(self.mode)))
        for i, bs in enumerate(self.batch_sizes):
            _require_positive_int(f"batch_sizes[{i}]", bs)
        if self.mode is AdaptationMode.CUSTOM:
            if not self.batch_sizes:
                raise ValidationError(
                    "batch_sizes", "custom mode needs the declared list of batch sizes"
                )
            if self.batch_sizes[0] != self.initial_batch_size:
                raise ValidationError(
                    "batch_sizes", "custom mode's list must start with the initial batch size"
                )
        if not (isinstance(self.arrival_s, int | float) and math.isfinite(self.arrival_s)):
            raise ValidationError("arrival_s", f"must be a finite number, got {self.arrival_s!r}")
        if self.arrival_s < 0:
            raise ValidationError("arrival_s", f"must be >= 0, got {self.arrival_s!r}")
        if not (
            isinstance(self.budget, int | float) and math.isfinite(self.budget) and self.budget > 0
        ):
            raise ValidationError("budget", f"must be a positive number, got {self.budget!r}")
        if self.budget > MAX_BUDGET:
            raise ValidationError("budget", f"must be at most {MAX_BUDGET:g}, got {self.budget!r}")
        for gpu_type, profile in self.type_throughput.items():
            if not isinstance(gpu_type, str) or not gpu_type:
                raise ValidationError("type_throughput", "GPU type names must be non-empty")
            if not isinstance(profile, ThroughputProfile):
                raise ValidationError(
                    f"type_throughput[{gpu_type}]", "must be a throughput profile"
                )
        object.__setattr__(
            self, "type_throughput", MappingProxyType(dict(sorted(self.type_throughput.items())))
        )
        self._check_physical()
        if self.elastic is not None and not self.elastic.min_gpus <= self.gpus:
            raise ValidationError(
                "elastic.min_gpus",
                f"must be at most the requested {self.gpus} GPUs, got {self.elastic.min_gpus}",
            )
        if self.elastic is not None and not self.gpus <= self.elastic.max_gpus:
            raise ValidationError(
                "elastic.max_gpus",
                f"must be at least the requested {self.gpus} GPUs, got {self.elastic.max_gpus}",
            )

    def _check_physical(self) -> None:
        """Refuse a job whose length no real training has: too many samples in all, or an
        exclusive run time at its slowest declared rate beyond :data:`MAX_RUN_SECONDS`."""
        total = self.epochs * self.samples_per_epoch
        if total > MAX_TOTAL_SAMPLES:
            raise ValidationError(
                "samples_per_epoch",
                f"epochs x samples_per_epoch must be at most {MAX_TOTAL_SAMPLES:.0e}, got {total}",
            )
        rates = self.throughput.samples_per_second
        if rates:
            slowest = min(rates, key=lambda bs: rates[bs])
            seconds = total / rates[slowest]
            if seconds > MAX_RUN_SECONDS:
                raise ValidationError(
                    f"throughput[{slowest}]",
                    f"{total} samples at {rates[slowest]:g} samples/s take {seconds:.3g} s, "
                    f"beyond the longest run time a job may have ({MAX_RUN_SECONDS:.0e} s)",
                )

    @property
    def max_batch_size(self) -> int:
        """Largest batch size the job may reach (its initial size when nothing else is declared)."""
        return max((self.initial_batch_size, *self.batch_sizes))

    def check_fits(self, cluster: Cluster) -> None:
        """Raise when this job can never run on ``cluster`` (wider than the whole cluster)."""
        if self.gpus > cluster.total_gpus:
            raise ValidationError(
                "gpus",
                f"job {self.job_id} asks for {self.gpus} GPUs but the cluster has "
                f"{cluster.total_gpus}",
            )


@dataclass(frozen=True, slots=True)
class Cluster:
    """The GPU nodes of a cluster, as a list of node sizes: ``node_gpus[n]`` GPUs on node ``n``.

    Nodes may differ in size (an 8-GPU server, a 4-GPU one, a 2-GPU box). GPUs are numbered
    globally in node order: node ``n`` holds GPUs ``first_gpu(n)`` to ``first_gpu(n) +
    node_gpus[n] - 1``. Build one with :meth:`uniform` (``nodes`` identical nodes),
    :meth:`of_gpus` (a GPU count in nodes of one size) or :meth:`parse` (``"2x8,3x4"``).
    """

    node_gpus: tuple[int, ...]
    node_types: tuple[str, ...] = ()
    _first: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _node_of: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = tuple(self.node_gpus)
        if not sizes:
            raise ValidationError("nodes", "a cluster needs at least one node")
        for i, size in enumerate(sizes):
            _require_positive_int(f"nodes[{i}].gpus", size)
        first, node_of, at = [], [], 0
        for n, size in enumerate(sizes):
            first.append(at)
            node_of.extend([n] * size)
            at += size
        kinds = tuple(self.node_types)
        if kinds and len(kinds) != len(sizes):
            raise ValidationError(
                "nodes", f"{len(kinds)} GPU types for {len(sizes)} nodes: give one per node"
            )
        for i, kind in enumerate(kinds):
            if not isinstance(kind, str) or not kind.strip():
                raise ValidationError(f"nodes[{i}].gpu_type", "must be a non-empty name")
        object.__setattr__(self, "node_types", kinds)
        object.__setattr__(self, "node_gpus", sizes)
        object.__setattr__(self, "_first", tuple(first))
        object.__setattr__(self, "_node_of", tuple(node_of))

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int) -> Cluster:
        """``nodes`` identical nodes of ``gpus_per_node`` GPUs each."""
        _require_positive_int("nodes", nodes)
        _require_positive_int("gpus_per_node", gpus_per_node)
        return cls((gpus_per_node,) * nodes)

    @classmethod
    def of_gpus(cls, total_gpus: int, gpus_per_node: int) -> Cluster:
        """The cluster with ``total_gpus`` GPUs in nodes of ``gpus_per_node``."""
        _require_positive_int("gpus", total_gpus)
        _require_positive_int("gpus_per_node", gpus_per_node)
        if total_gpus % gpus_per_node:
            raise ValidationError(
                "gpus", f"{total_gpus} GPUs do not divide into nodes of {gpus_per_node}"
            )
        return cls.uniform(total_gpus // gpus_per_node, gpus_per_node)

    @classmethod
    def parse(cls, text: str) -> Cluster:
        """A node list written ``COUNTxGPUS`` separated by commas: ``"2x8,3x4,2x2"`` is two
        8-GPU nodes, three 4-GPU nodes and two 2-GPU nodes (in that order)."""
        sizes: list[int] = []
        for part in (p.strip() for p in text.split(",")):
            count, sep, gpus = part.lower().partition("x")
            if not sep or not count.strip().isdigit() or not gpus.strip().isdigit():
                raise ValidationError(
                    "nodes", f"{part!r} is not COUNTxGPUS (for example 2x8,3x4), in {text!r}"
                )
            n, g = int(count), int(gpus)
            if n <= 0 or g <= 0:
                raise ValidationError("nodes", f"{part!r}: counts must be positive")
            sizes.extend([g] * n)
        return cls(tuple(sizes))

    @property
    def nodes(self) -> int:
        return len(self.node_gpus)

    @property
    def total_gpus(self) -> int:
        return len(self._node_of)

    @property
    def largest_node(self) -> int:
        return max(self.node_gpus)

    @property
    def is_uniform(self) -> bool:
        return len(set(self.node_gpus)) == 1

    def node_of(self, gpu: int) -> int:
        return self._node_of[gpu]

    @property
    def is_typed(self) -> bool:
        """Whether nodes carry GPU types (:mod:`shockwave.market.heterogeneity`)."""
        return bool(self.node_types)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types of the nodes, in order of first appearance (() when untyped)."""
        return tuple(dict.fromkeys(self.node_types))

    def type_of(self, gpu: int) -> str:
        """The GPU type of global GPU ``gpu`` ("" on an untyped cluster)."""
        return self.node_types[self._node_of[gpu]] if self.node_types else ""

    def gpus_of_type(self, gpu_type: str) -> int:
        return sum(g for g, t in zip(self.node_gpus, self.node_types, strict=True) if t == gpu_type)

    def first_gpu(self, node: int) -> int:
        """Global index of node ``node``'s GPU 0."""
        return self._first[node]

    def describe(self) -> str:
        """``"8 nodes x 4 GPUs"`` (``"1 node x 4 GPUs"``) or, mixed, ``"2x8 + 3x4 + 2x2"``
        (count x GPUs, in order); typed: ``"v100 3x4 + k80 2x4"``."""
        if self.is_typed:
            runs_t: list[list[object]] = []
            for size, kind in zip(self.node_gpus, self.node_types, strict=True):
                if runs_t and runs_t[-1][0] == kind and runs_t[-1][2] == size:
                    runs_t[-1][1] = int(str(runs_t[-1][1])) + 1
                else:
                    runs_t.append([kind, 1, size])
            return " + ".join(f"{k} {n}x{g}" for k, n, g in runs_t)
        if self.is_uniform:
            nodes = "1 node" if self.nodes == 1 else f"{self.nodes} nodes"
            return f"{nodes} x {self.node_gpus[0]} GPUs"
        runs: list[list[int]] = []
        for size in self.node_gpus:
            if runs and runs[-1][1] == size:
                runs[-1][0] += 1
            else:
                runs.append([1, size])
        return " + ".join(f"{n}x{g}" for n, g in runs)


def check_tenant_path(path: object) -> str:
    """``path`` when it names a tenant: ``""`` (the root) or names of ASCII letters, digits,
    ``_``, ``-`` and ``.`` joined by ``/`` (``"org/team"``); else :class:`ValidationError` on
    field ``tenant``."""
    if not isinstance(path, str):
        raise ValidationError("tenant", f"must be a string, got {path!r}")
    if path == DEFAULT_TENANT:
        return path
    if len(path) > MAX_TENANT_PATH_LENGTH:
        raise ValidationError(
            "tenant", f"at most {MAX_TENANT_PATH_LENGTH} characters, got {len(path)}"
        )
    parts = path.split("/")
    if len(parts) > MAX_TENANT_DEPTH:
        raise ValidationError("tenant", f"at most {MAX_TENANT_DEPTH} levels deep, got {path!r}")
    for part in parts:
        if part in (".", "..") or not part:
            raise ValidationError("tenant", f"{path!r}: empty, '.' or '..' tenant name")
        if not all(c.isascii() and (c.isalnum() or c in "_-.") for c in part):
            raise ValidationError(
                "tenant",
                f"{path!r} is not a tenant path (names of letters, digits, _ - . joined by /)",
            )
    return path


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(name, f"must be a positive integer, got {value!r}")
