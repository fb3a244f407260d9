"""The backoff between failed contacts of an agent (the real one, ``agent/``, and the simulated
fleet, ``shockwave_fleet/``): exponential, with jitter, so that a thousand nodes an overloaded
server turned away do not all come back in the same instant, nor every second."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter between failed contacts: the n-th failure in a row
    waits a random time in [d/2, d], d = min(cap, base * 2**(n-1)); a success resets it."""

    def __init__(self, base_s: float, cap_s: float, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0
        self._rng = rng or random.Random()

    def failure(self) -> float:
        """Record one more failure; the delay before the next try."""
        self.failures += 1
        delay = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 32))
        return self._rng.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.failures = 0
