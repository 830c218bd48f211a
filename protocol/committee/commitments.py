"""Commit-reveal txs: `commit` (CommitBatch) and `reveal` (RevealBatch).

A compute node commits to each block of its outputs, `commitment = keccak256(abi.encode(session,
step, shard, output_hash, salt))` (`protocol.eip712.commitment_value`), and opens the
commitments later with their output hash and salt. The same bodies come from the compact binary
encoding (`protocol/commit_batch.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import HEX32_0X, MAX_BATCH, U32, U64, TxDecodeError, check

_COMMITMENT_KEYS = {"commitment": 0, "session": 0, "shard": 0, "step": 0}.keys()


@dataclass(frozen=True, slots=True)
class CommitmentRecord:
    """One commitment: `commitment = keccak256(abi.encode(session, step, shard, output_hash,
    salt))` (see `protocol.eip712.commitment_value`)."""

    session: str
    step: int
    shard: int
    commitment: str

    def to_json(self) -> dict[str, Any]:
        return {
            "commitment": self.commitment,
            "session": self.session,
            "shard": self.shard,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, item: Any) -> CommitmentRecord:
        # the hot path of the busiest tx type: plain type checks, one regex per hex field
        if type(item) is dict and item.keys() == _COMMITMENT_KEYS:
            session, step = item["session"], item["step"]
            shard, value = item["shard"], item["commitment"]
            if (
                type(session) is str
                and type(value) is str
                and type(step) is int
                and type(shard) is int
                and 0 <= step <= U64
                and 0 <= shard <= U32
                and HEX32_0X.match(session)
                and HEX32_0X.match(value)
            ):
                return cls(session, step, shard, value)
        b = check.exact_object(item, "commitment", set(_COMMITMENT_KEYS))
        return cls(  # one of these raises with the precise reason
            session=check.text(b["session"], "session", HEX32_0X),
            step=check.integer(b["step"], "step", 0, U64),
            shard=check.integer(b["shard"], "shard", 0, U32),
            commitment=check.text(b["commitment"], "commitment", HEX32_0X),
        )


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """Many commitments in one tx (no two for the same session/step/shard)."""

    commitments: tuple[CommitmentRecord, ...]

    TYPE: ClassVar[str] = "commit"

    def to_json(self) -> dict[str, Any]:
        return {"commitments": [c.to_json() for c in self.commitments]}

    @classmethod
    def from_json(cls, body: Any) -> CommitBatch:
        b = check.exact_object(body, "body", {"commitments"})
        items = tuple(
            CommitmentRecord.from_json(i)
            for i in check.items(b["commitments"], "commitments", MAX_BATCH)
        )
        if len({(c.session, c.step, c.shard) for c in items}) != len(items):
            raise TxDecodeError("body.commitments: duplicate (session, step, shard)")
        return cls(items)


@dataclass(frozen=True, slots=True)
class RevealRecord:
    """The opening of one commitment."""

    session: str
    step: int
    shard: int
    output_hash: str
    salt: str

    def to_json(self) -> dict[str, Any]:
        return {
            "output_hash": self.output_hash,
            "salt": self.salt,
            "session": self.session,
            "shard": self.shard,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, item: Any) -> RevealRecord:
        b = check.exact_object(item, "reveal", {"output_hash", "salt", "session", "shard", "step"})
        return cls(
            session=check.text(b["session"], "session", HEX32_0X),
            step=check.integer(b["step"], "step", 0, (1 << 64) - 1),
            shard=check.integer(b["shard"], "shard", 0, (1 << 32) - 1),
            output_hash=check.text(b["output_hash"], "output_hash", HEX32_0X),
            salt=check.text(b["salt"], "salt", HEX32_0X),
        )


@dataclass(frozen=True, slots=True)
class RevealBatch:
    """Many reveals in one tx; each must match a commitment by the same node."""

    reveals: tuple[RevealRecord, ...]

    TYPE: ClassVar[str] = "reveal"

    def to_json(self) -> dict[str, Any]:
        return {"reveals": [r.to_json() for r in self.reveals]}

    @classmethod
    def from_json(cls, body: Any) -> RevealBatch:
        b = check.exact_object(body, "body", {"reveals"})
        items = tuple(
            RevealRecord.from_json(i) for i in check.items(b["reveals"], "reveals", MAX_BATCH)
        )
        if len({(r.session, r.step, r.shard) for r in items}) != len(items):
            raise TxDecodeError("body.reveals: duplicate (session, step, shard)")
        return cls(items)
