"""The identity memo: a value is reused only for the very same objects and an equal key."""

from __future__ import annotations

from collections.abc import Callable

from shockwave.domain.memo import IdentityMemo


class Box:
    """An object compared by identity (equal contents, different objects)."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_reuses_only_for_the_same_objects_and_an_equal_key() -> None:
    memo: IdentityMemo[int] = IdentityMemo()
    calls: list[int] = []

    def compute(value: int) -> int:
        calls.append(value)
        return value * 10

    a, b = Box(1), Box(1)
    assert memo.get((a,), ("k", 1), lambda: compute(1)) == 10
    assert memo.get((a,), ("k", 1), lambda: compute(2)) == 10  # hit: same object, equal key
    assert memo.get((b,), ("k", 1), lambda: compute(3)) == 30  # an equal but other object
    assert memo.get((a,), ("k", 2), lambda: compute(4)) == 40  # another key
    assert calls == [1, 3, 4]


def test_find_and_put_are_get_in_two_steps() -> None:
    memo: IdentityMemo[int] = IdentityMemo()
    a, b = Box(1), Box(1)
    assert memo.find((a,), "k") is None
    memo.put((a,), "k", 7)
    assert memo.find((a,), "k") == 7
    assert memo.find((b,), "k") is None  # an equal but other object
    assert memo.find((a,), "other") is None
    assert memo.get((a,), "k", lambda: -1) == 7  # what put stored, get reuses
    memo.get((b,), "k", lambda: 8)
    assert memo.find((b,), "k") == 8  # and what get stored, find sees


def test_is_bounded() -> None:
    memo: IdentityMemo[int] = IdentityMemo(limit=3)
    boxes = [Box(i) for i in range(10)]
    for i, box in enumerate(boxes):
        memo.get((box,), (), _constant(i))
    assert len(memo._entries) <= 3
    # a cleared entry is computed again
    assert memo.get((boxes[0],), (), lambda: -1) == -1


def _constant(value: int) -> Callable[[], int]:
    return lambda: value
