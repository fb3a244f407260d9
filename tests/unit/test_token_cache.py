"""The API's token cache (api.token_cache): entries live for the cache's lifetime, or less when
the caller says so (a token that expires sooner is trusted only until it expires)."""

from __future__ import annotations

from api.token_cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_the_cache_lifetime_or_its_own_shorter_one() -> None:
    clock = Clock()
    cache: TtlCache[str] = TtlCache(ttl_s=10.0, clock=clock)
    cache.put("long", "a")
    cache.put("short", "b", ttl_s=2.0)
    cache.put("longer-than-the-cache", "c", ttl_s=60.0)
    cache.put("expired", "d", ttl_s=-1.0)

    clock.now += 3.0
    assert (cache.get("long"), cache.get("short"), cache.get("expired")) == ("a", None, None)
    clock.now += 7.0
    assert (cache.get("long"), cache.get("longer-than-the-cache")) == (None, None)
