"""Share-chain blocks (minimal format; later issues extend it).

A share-chain block records how much work each compute node contributed since the previous
block, counted in operations (weights per operation are applied later, in payouts):

    ShareBlock(prev_hash, height, committee_height, contributions)

- `prev_hash`: `sha256:<hex>` of the previous block (`GENESIS_PREV_HASH` for height 1).
- `height`: 1, 2, 3, … (the previous block's height + 1).
- `committee_height`: the committee-chain height the block builds on (no later than the
  committee block that includes it).
- `contributions`: `(node key hex, operation count)` pairs, node keys strictly ascending,
  counts ≥ 1.

Canonical encoding: `protocol.canonical.canonical_json(block.to_json())`; the block hash is
`sha256:<hex>` of those bytes. Pure and deterministic: integers and strings only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from protocol.canonical import canonical_json, sha256_hex
from protocol.errors import ProtocolError

GENESIS_PREV_HASH = "sha256:" + "0" * 64
MAX_CONTRIBUTIONS = 4096
MAX_OPERATIONS = (1 << 63) - 1

_HASH = re.compile(r"sha256:[0-9a-f]{64}\Z")
_NODE = re.compile(r"[0-9a-f]{64}\Z")


class ShareBlockError(ProtocolError):
    """A share-chain block is malformed; `reason` says which rule failed."""

    code = "share_block_malformed"

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed share block: {reason}")
        self.reason = reason


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ShareBlockError(f"{name}: expected an integer in [{lo}, {hi}]")
    return value


@dataclass(frozen=True, slots=True)
class ShareBlock:
    """One share-chain block (see the module docstring)."""

    prev_hash: str
    height: int
    committee_height: int
    contributions: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.prev_hash, str) or not _HASH.match(self.prev_hash):
            raise ShareBlockError("prev_hash: expected sha256:<64 hex>")
        _int(self.height, "height", 1, MAX_OPERATIONS)
        _int(self.committee_height, "committee_height", 0, MAX_OPERATIONS)
        if not isinstance(self.contributions, tuple) or len(self.contributions) > MAX_CONTRIBUTIONS:
            raise ShareBlockError(f"contributions: expected a tuple of ≤ {MAX_CONTRIBUTIONS} pairs")
        previous = ""
        for pair in self.contributions:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ShareBlockError("contributions: expected (node, operations) pairs")
            node, count = pair
            if not isinstance(node, str) or not _NODE.match(node):
                raise ShareBlockError(f"contributions: bad node key {node!r}"[:120])
            if node <= previous:
                raise ShareBlockError("contributions: node keys must be strictly ascending")
            previous = node
            _int(count, "operations", 1, MAX_OPERATIONS)

    def to_json(self) -> dict[str, Any]:
        return {
            "committee_height": self.committee_height,
            "contributions": [[node, count] for node, count in self.contributions],
            "height": self.height,
            "prev_hash": self.prev_hash,
        }

    def encode(self) -> bytes:
        """Canonical bytes of the block."""
        return canonical_json(self.to_json())

    def hash(self) -> str:
        """`sha256:<hex>` of the canonical bytes."""
        return sha256_hex(self.encode())

    def total_operations(self) -> int:
        return sum(count for _, count in self.contributions)

    @classmethod
    def from_json(cls, doc: Any) -> ShareBlock:
        keys = {"committee_height", "contributions", "height", "prev_hash"}
        if not isinstance(doc, dict) or set(doc) != keys:
            raise ShareBlockError(f"expected an object with keys {sorted(keys)}")
        raw = doc["contributions"]
        if not isinstance(raw, list):
            raise ShareBlockError("contributions: expected a list")
        pairs: list[tuple[str, int]] = []
        for item in raw:
            if not isinstance(item, list) or len(item) != 2:
                raise ShareBlockError("contributions: expected [node, operations] pairs")
            pairs.append((item[0], item[1]))
        return cls(
            prev_hash=doc["prev_hash"],
            height=doc["height"],
            committee_height=doc["committee_height"],
            contributions=tuple(pairs),
        )
