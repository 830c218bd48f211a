"""The credit lock tx: a compute node claims credits it was just paid with, before it serves
more than its bound on them (issue 42, attack 4; docs/credits.md "One credit pays one node").

    credit_lock{model, shard, locks}   `locks` is one of two forms, every row alike:
        [[holder, credit epoch, assignment], ...]
                                       a holder-bound credit (committee/credit_holder.py): its
                                       holder key (its nonce, 64 lowercase hex), the epoch of its
                                       keys and its holder's assignment of it to this node on
                                       (model, shard) (128 lowercase hex); the spent id is
                                       sha256(holder)
        [[spent id, credit epoch], ...]
                                       a credit as before (`protocol.credits.spent_id`: sha256
                                       of its nonce), refused on a chain whose genesis binds
                                       credits to their holders (`credits.holder_bound`)
                                       at most MAX_LOCKS, no spent id twice, ascending by spent id

The chain's rules: `abci_app/credit_locks.py`. A lock names no payer and carries no signature of
the committee: the node proves it holds the credit when it redeems it; the assignment proves
that the credit's holder gave it to this node, so a lock copied by another node is refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.credit_holder import parse_assignment, parse_holder
from protocol.committee.grammar import NAME, U64, TxDecodeError, check

MAX_LOCKS = 256  # credits per lock tx (≤ ~210 bytes each: ~53 KiB, under the 64 KiB limit)
SPENT_ID = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class CreditLock:
    """A compute node locks credits (spent id, credit epoch) for its work on (`model`, `shard`);
    `assignments` is each credit's (holder key, assignment), in the order of `locks`, for
    holder-bound credits (empty for the form of before)."""

    model: str
    shard: int
    locks: tuple[tuple[str, int], ...]
    assignments: tuple[tuple[bytes, bytes], ...] = ()

    TYPE: ClassVar[str] = "credit_lock"

    def to_json(self) -> dict[str, Any]:
        rows: list[list[Any]] = [[identifier, epoch] for identifier, epoch in self.locks]
        if self.assignments:
            rows = [
                [holder.hex(), epoch, assignment.hex()]
                for (_, epoch), (holder, assignment) in zip(
                    self.locks, self.assignments, strict=True
                )
            ]
        return {
            "locks": rows,
            "model": self.model,
            "shard": self.shard,
        }

    @classmethod
    def from_json(cls, body: Any) -> CreditLock:
        b = check.exact_object(body, "body", {"locks", "model", "shard"})
        bound = isinstance(b["locks"], list) and bool(b["locks"]) and _width(b["locks"][0]) == 3
        rows = check.rows(b["locks"], "body.locks", 3 if bound else 2, MAX_LOCKS)
        if not rows:
            raise TxDecodeError("body.locks: expected at least one credit")
        assignments: tuple[tuple[bytes, bytes], ...] = ()
        if bound:
            assignments = tuple(
                (
                    parse_holder(row[0], "body.locks[].holder"),
                    parse_assignment(row[2], "body.locks[].assignment"),
                )
                for row in rows
            )
            locks = tuple(
                (
                    hashlib.sha256(holder).hexdigest(),
                    check.integer(row[1], "body.locks[].epoch", 1, U64),
                )
                for (holder, _), row in zip(assignments, rows, strict=True)
            )
        else:
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
            assignments=assignments,
        )


def _width(row: Any) -> int:
    return len(row) if isinstance(row, list) else 0
