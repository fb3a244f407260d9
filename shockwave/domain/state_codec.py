"""Plain-JSON encoding of policy state, so a stateless worker can store it between solves.

Policies keep their memory in frozen dataclasses (``PriorityState``, ``ShockwaveState``, ...)
built from mappings, tuples and frozensets. :func:`encode` turns such a value into JSON-ready
data with type tags; :func:`decode` rebuilds it. Only dataclasses from the ``shockwave``
package are rebuilt (found by module and name), so stored data can never name arbitrary code.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any

_TAG = "__t"


class StateCodecError(ValueError):
    """Stored state that cannot be rebuilt (corrupt, or from an unknown type)."""


def encode(value: Any) -> Any:
    """JSON-ready data for ``value`` (dataclasses, mappings, tuples, frozensets, scalars)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Enum):
        return {_TAG: "enum", "type": _name(type(value)), "value": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {  # a field not set by __init__ is derived: __post_init__ rebuilds it
            f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
        return {_TAG: "dc", "type": _name(type(value)), "fields": fields}
    if isinstance(value, Mapping):
        return {_TAG: "map", "items": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, frozenset | set):
        return {_TAG: "set", "items": [encode(v) for v in sorted(value, key=repr)]}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    raise StateCodecError(f"cannot encode a {type(value).__name__}")


def decode(data: Any) -> Any:
    """The value :func:`encode` produced ``data`` from."""
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict) or _TAG not in data:
        raise StateCodecError("untagged object in stored state")
    tag = data[_TAG]
    if tag == "map":
        return MappingProxyType({decode(k): decode(v) for k, v in data["items"]})
    if tag == "set":
        return frozenset(decode(v) for v in data["items"])
    if tag == "tuple":
        return tuple(decode(v) for v in data["items"])
    if tag == "enum":
        return _resolve(data["type"])(data["value"])
    if tag == "dc":
        cls = _resolve(data["type"])
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise StateCodecError(f"{data['type']} is not a dataclass")
        fields = {k: decode(v) for k, v in data["fields"].items()}
        return cls(**fields)
    raise StateCodecError(f"unknown tag {tag!r}")


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(name: str) -> Any:
    module, _, qualname = name.partition(":")
    if not (module == "shockwave" or module.startswith("shockwave.")) or not qualname:
        raise StateCodecError(f"refusing to rebuild {name!r}: not a shockwave type")
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise StateCodecError(f"unknown type {name!r}") from error
    return target
