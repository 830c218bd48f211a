"""What a link does to the bytes that flow one way over it: delay, jitter, bandwidth."""

from __future__ import annotations

from dataclasses import dataclass

# CometBFT's e2e gives every link a jitter of 5 % of its delay (`netem delay L ms 0.05·L ms`).
JITTER_PERCENT = 5


@dataclass(frozen=True)
class Shape:
    """One direction of one link (A -> B: the bytes A sends to B)."""

    latency_ms: int = 0  # one-way delay added to every chunk, milliseconds
    jitter_ms: int = 0  # the delay varies uniformly within ± this, milliseconds (≤ latency_ms)
    kbytes_per_s: int | None = None  # per connection, in 1000 bytes/s; None: unlimited

    def __post_init__(self) -> None:
        for name in ("latency_ms", "jitter_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int, not {value!r}")
        if self.jitter_ms > self.latency_ms:
            raise ValueError(f"jitter {self.jitter_ms} ms exceeds latency {self.latency_ms} ms")
        rate = self.kbytes_per_s
        if rate is not None and (type(rate) is not int or rate < 1):
            raise ValueError(f"kbytes_per_s must be a positive int or None, not {rate!r}")

    @classmethod
    def from_latency(cls, latency_ms: int, *, kbytes_per_s: int | None = None) -> Shape:
        """A link with this one-way delay and a jitter of JITTER_PERCENT of it (rounded)."""
        return cls(latency_ms, (latency_ms * JITTER_PERCENT + 50) // 100, kbytes_per_s)


UNSHAPED = Shape()
