"""The ring: a circuit's own decode loop, run by its first node (docs/overlay.md, *The ring*).

Two things travel that a client-driven circuit does not have:

**The ring spec**, the `ring` field of the first hop's `open` (protocol/stream.py), a JSON
object parsed here (`parse_ring_spec`) or refused `bad_control` by name:

    {"prompt": N, "max_new": M, "stop": [id, ...], "temperature": t, "top_p": p, "seed": s}

    prompt       positions the client sends as prefill frames (1 … 2^31 − 1): the first token
                 is sampled from the output at position N − 1
    max_new      tokens the loop chooses at most (1 … MAX_RING_TOKENS); it computes at most
                 N + M − 1 positions (the last token is never fed)
    stop         token ids after which the loop stops (at most MAX_STOP_IDS, each < 2^31)
    temperature  0 (greedy) … 10; top_p (0, 1]; seed null or 0 … 2^63 − 1: the sampler of
                 protocol/sampling.py, one Generator seeded with `seed`, one draw per token

**Ring tokens**, the first node's binary message to the client: protocol/ring_tokens.py. The
client recomputes each token from the hidden row that comes with it (`RingMismatchError` at the
first that differs).

This module imports neither numpy nor the frame codecs: protocol/stream.py parses an open's
`ring` with it, and light entry points import protocol/stream.py
(tests/unit/test_start_imports.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from protocol.frames.errors import FrameError

if TYPE_CHECKING:
    from protocol.sampling import SamplingConfig

MAX_RING_TOKENS: Final = 8192  # tokens one ring session chooses at most
MAX_STOP_IDS: Final = 64
MAX_TOKEN_ID: Final = 2**31 - 1
MAX_PROMPT: Final = 2**31 - 1  # protocol/frames/header.py MAX_POSITION (header imports numpy)
MAX_SEED: Final = 2**63 - 1
_FIELDS: Final = frozenset({"prompt", "max_new", "stop", "temperature", "top_p", "seed"})


class RingSpecError(FrameError):
    """An open's `ring` field is out of its grammar (the module docstring)."""

    code = "bad_control"


class RingUnavailableError(FrameError):
    """This node runs no ring: it has no client head (`client.safetensors` beside its
    manifest), or the open asked the ring of a hop that is not the circuit's first."""

    code = "ring_unavailable"
    http_status = 409


class RingMismatchError(FrameError):
    """A ring token is not what the client's own head and sampler choose from the hidden row
    that came with it: the first node lied (or computed another head); the session is stopped
    and nothing more is paid."""

    code = "ring_token_mismatch"
    http_status = 502


@dataclass(frozen=True, slots=True)
class RingSpec:
    prompt: int
    max_new: int
    stop: frozenset[int] = frozenset()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def sampling(self) -> SamplingConfig:
        from protocol.sampling import SamplingConfig  # numpy: only where a loop samples

        return SamplingConfig(self.temperature, self.top_p, self.seed)

    @property
    def last_position(self) -> int:
        """The last position the loop may compute (its last token is never fed)."""
        return self.prompt + self.max_new - 2

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "max_new": self.max_new,
            "stop": sorted(self.stop),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }


def _int(raw: dict[str, Any], name: str, low: int, high: int) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RingSpecError(f"ring.{name} must be an integer in {low}..{high}")
    return value


def _number(raw: dict[str, Any], name: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RingSpecError(f"ring.{name} must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise RingSpecError(f"ring.{name} must be finite")
    return value


def parse_ring_spec(raw: Any) -> RingSpec:
    """An open's `ring` value as a RingSpec, or RingSpecError naming the field."""
    if not isinstance(raw, dict) or set(raw) != _FIELDS:
        raise RingSpecError(f"ring must be an object with exactly the fields {sorted(_FIELDS)}")
    stop = raw["stop"]
    if not isinstance(stop, list) or len(stop) > MAX_STOP_IDS:
        raise RingSpecError(f"ring.stop must be a list of at most {MAX_STOP_IDS} token ids")
    for item in stop:
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= MAX_TOKEN_ID:
            raise RingSpecError(f"ring.stop entries must be integers in 0..{MAX_TOKEN_ID}")
    seed = raw["seed"]
    if seed is not None:
        seed = _int(raw, "seed", 0, MAX_SEED)
    temperature, top_p = _number(raw, "temperature"), _number(raw, "top_p")
    if not 0.0 <= temperature <= 10.0:
        raise RingSpecError("ring.temperature must be in [0, 10]")
    if not 0.0 < top_p <= 1.0:
        raise RingSpecError("ring.top_p must be in (0, 1]")
    return RingSpec(
        prompt=_int(raw, "prompt", 1, MAX_PROMPT),
        max_new=_int(raw, "max_new", 1, MAX_RING_TOKENS),
        stop=frozenset(stop),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )


__all__ = [
    "MAX_RING_TOKENS",
    "MAX_STOP_IDS",
    "MAX_TOKEN_ID",
    "RingMismatchError",
    "RingSpec",
    "RingSpecError",
    "RingUnavailableError",
    "parse_ring_spec",
]
