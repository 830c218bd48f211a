"""The credit lock tx: a compute node claims credits it was just paid with, before it serves
more than its bound on them (issue 42, attack 4; docs/credits.md "One credit pays one node").

    credit_lock{model, shard, locks}   `locks` is `[[spent id, credit epoch], ...]`: each
                                       credit's spent id (`protocol.credits.spent_id`: sha256 of
                                       its nonce, 64 lowercase hex) and the epoch of its keys;
                                       at most MAX_LOCKS, no spent id twice, ascending

The chain's rules: `abci_app/credit_locks.py`. A lock names no payer and carries no signature of
the credit: it is only the node's claim "this credit pays me", first come first served, and the
node proves it holds the credit when it redeems it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import NAME, U64, TxDecodeError, check

MAX_LOCKS = 256  # credits per lock tx (~80 bytes each: ~20 KiB, well under the 64 KiB limit)
SPENT_ID = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class CreditLock:
    """A compute node locks credits (spent id, credit epoch) for its work on (`model`, `shard`)."""

    model: str
    shard: int
    locks: tuple[tuple[str, int], ...]

    TYPE: ClassVar[str] = "credit_lock"

    def to_json(self) -> dict[str, Any]:
        return {
            "locks": [[identifier, epoch] for identifier, epoch in self.locks],
            "model": self.model,
            "shard": self.shard,
        }

    @classmethod
    def from_json(cls, body: Any) -> CreditLock:
        b = check.exact_object(body, "body", {"locks", "model", "shard"})
        rows = check.rows(b["locks"], "body.locks", 2, MAX_LOCKS)
        if not rows:
            raise TxDecodeError("body.locks: expected at least one credit")
        locks = tuple(
            (
                check.text(identifier, "body.locks[].id", SPENT_ID),
                check.integer(epoch, "body.locks[].epoch", 1, U64),
            )
            for identifier, epoch in rows
        )
        identifiers = [identifier for identifier, _ in locks]
        if identifiers != sorted(set(identifiers)):
            raise TxDecodeError("body.locks: spent ids must be strictly ascending (none twice)")
        return cls(
            model=check.text(b["model"], "body.model", NAME),
            shard=check.integer(b["shard"], "body.shard", 0, 65535),
            locks=locks,
        )
