"""Container image references: which strings a job may name as its ``image``, and whether an
operator's allow-list admits one.

The grammar is Docker's (``[host[:port]/]path[:tag][@digest]``, lower-case path components,
a tag of at most 128 word characters, dots and dashes): a reference can never begin with a
dash, hold a space, a ``=`` or a quote, so no reference is ever read as a ``docker run`` option
or splits into two arguments. :data:`IMAGE_PATTERN` is written for both Python's ``re`` and the
Rust regex engine the API's schema validation uses (no look-arounds, ASCII classes only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

IMAGE_MAX_LENGTH = 255

_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"

IMAGE_PATTERN = rf"^{_NAME}(?::{_TAG})?(?:@{_DIGEST})?$"
"""A whole Docker image reference, e.g. ``shockwave:latest``,
``registry.example.com:5000/team/trainer:v2`` or ``ubuntu@sha256:<64 hex digits>``."""

_IMAGE = re.compile(IMAGE_PATTERN)


def is_image_reference(text: str) -> bool:
    """Whether ``text`` is one Docker image reference (at most 255 characters)."""
    return len(text) <= IMAGE_MAX_LENGTH and _IMAGE.fullmatch(text) is not None


def repository(image: str) -> str:
    """``image`` without its tag and digest: ``host:5000/team/trainer:v2`` ->
    ``host:5000/team/trainer`` (a ``:`` before the last ``/`` is a registry's port)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def image_allowed(image: str, allowed: Iterable[str]) -> bool:
    """Whether the allow-list ``allowed`` admits ``image`` (a valid reference). An entry that
    ends with ``/`` admits every image under it (a registry, ``registry.example.com/``, or a
    namespace, ``registry.example.com/team/``); an entry with a tag or digest admits that exact
    reference; any other entry admits its repository with any tag or digest (``shockwave``
    admits ``shockwave:latest``). References are compared as written: ``ubuntu`` and
    ``docker.io/library/ubuntu`` are different entries."""
    if not is_image_reference(image):
        return False
    name = repository(image)
    for entry in allowed:
        if entry.endswith("/"):
            if image.startswith(entry):
                return True
        elif entry == image or (repository(entry) == entry and entry == name):
            return True
    return False
