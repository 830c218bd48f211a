"""What the circuit client, the gateway and the benches share: hops, the head, timings.

Hop      one node of a circuit: its base URL, the shard it serves there (a span's first, with
         `last` its last shard: one hop through shards shard … last), and its node key
         (64 hex: pinned on an https:// link, protocol/links.py); for a node behind NAT, its
         addresses at its other relays, dialled when `url` is not reached
Head     the client's part of the model (tokenizer, embeddings, final norm, LM head), numpy
         at this boundary; `node.model.head.ClientHead` is the one implementation
Timings  a generation's clocks and byte counts
Failover one recovery of a generation from a failed circuit (node/client/failover.py)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from protocol.errors import ConfigError
from protocol.spans import ShardSpan


@dataclass(frozen=True, slots=True)
class Hop:
    url: str
    shard: int
    key: str | None = None  # the node key its TLS handshake must prove (https://)
    # the node's addresses at its second and third relay (register_node `rendezvous`), tried
    # in order when `url` (its registered endpoint: the first relay's) is not reached
    alternates: tuple[str, ...] = ()
    # the last shard of a span this hop runs as one (protocol/spans.py); None: `shard` alone
    last: int | None = None

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.url, *self.alternates)

    @property
    def span(self) -> ShardSpan:
        return ShardSpan(self.shard, self.shard if self.last is None else self.last)


def payee(url: str, shard: int | None = None) -> str:
    """Whom a credit pays, as prices and parties are keyed (node/client/paying.py): a hop's
    URL, or for a span hop (paid per shard, node/server/span_payments.py) its URL and the
    shard, `URL#shard-K`."""
    return url if shard is None else f"{url}#shard-{shard}"


class Head(Protocol):
    """The client's part of the model as circuits and the gateway use it."""

    eos_token_ids: frozenset[int]
    vocab_size: int
    hidden_size: int
    context_length: int  # positions the model was trained for (prompt + answer)

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_text(self, token: int) -> str: ...

    def embed_np(self, ids: Sequence[int]) -> np.ndarray: ...  # [1, T, H] float32

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray: ...  # [H] -> [V] float32

    def logits_batch_np(self, hidden_last: np.ndarray) -> np.ndarray: ...  # [B, H] -> [B, V]


@dataclass(frozen=True, slots=True)
class Failover:
    """A circuit failed and the generation went on on a replacement: one per failed circuit."""

    code: str  # the failure's error code (unavailable, busy, session_expired, ...)
    hops: tuple[int, ...]  # indices of the hops replaced (empty: none was named; any circuit)
    served: int  # positions the failed circuit's session had answered
    replayed: int  # positions replayed into the replacement's session (0: it failed first)
    replay_ms: float  # replacement session opened + history replayed
    recovery_ms: float  # failure seen -> next token chosen (or -> the next failure)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "hops": list(self.hops),
            "served": self.served,
            "replayed": self.replayed,
            "replay_ms": self.replay_ms,
            "recovery_ms": self.recovery_ms,
        }


@dataclass
class Timings:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_ms: float = 0.0  # prompt in → first token chosen
    decode_ms: float = 0.0  # first token chosen → last token chosen
    decode_steps: int = 0  # tokens chosen in decode_ms (after the first; a pass may choose several)
    wire_bytes_sent: int = 0  # the client's own WebSocket bytes, framing included
    wire_bytes_received: int = 0
    failovers: list[Failover] = field(default_factory=list)  # recoveries, in order
    _started_s: float = field(default=0.0, repr=False)
    _first_s: float = field(default=0.0, repr=False)

    def begin(self, prompt_tokens: int) -> None:
        """A generation of `prompt_tokens` starts now (prompt in)."""
        if not prompt_tokens:
            raise ConfigError("empty prompt")
        self.prompt_tokens = prompt_tokens
        self._started_s = self._first_s = time.perf_counter()

    def chose(self, step: int) -> None:
        """Token `step` (1 = the first) was chosen now: prefill_ms / decode_ms up to here, and
        every token after the first counts a decode step."""
        now = time.perf_counter()
        if step == 1:
            self._first_s = now
            self.prefill_ms = (now - self._started_s) * 1000
        else:
            self.decode_ms = (now - self._first_s) * 1000
            self.decode_steps += 1

    @property
    def total_ms(self) -> float:
        """Prompt in → last token chosen."""
        return self.prefill_ms + self.decode_ms

    @property
    def decode_tok_s(self) -> float:
        steps = self.decode_steps
        return steps / (self.decode_ms / 1000) if steps > 0 and self.decode_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_ms": round(self.prefill_ms, 2),
            "decode_ms": round(self.decode_ms, 2),
            "decode_tok_s": round(self.decode_tok_s, 2),
            "wire_bytes_sent": self.wire_bytes_sent,
            "wire_bytes_received": self.wire_bytes_received,
            "failovers": [f.to_json() for f in self.failovers],
        }
