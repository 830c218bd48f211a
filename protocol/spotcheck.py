"""Spot-check selection: which committed (node, session, block, shard) triples get checked.

After epoch e closes, the committee chain has fixed the seed of epoch e + 1 (`abci_app/epochs.py`:
the hash of block e·L, unknown while nodes commit during epoch e). Every party — the chain, the
nodes, the verifiers — derives the same selection from that seed and the commitments recorded
in epoch e, with integers only:

    d = sha256("planet/spot-check/v1" ‖ seed ‖ node key (32 B) ‖ session (32 B) ‖
               uint64_be(block) ‖ uint32_be(shard))
    selected  ⇔  uint64_be(d[0:8]) · 10^6 < rate_ppm · 2^64

Each triple is an independent draw with probability `rate_ppm` / 10^6 (default 50 000 = 5 %), so
a node that cheats on n committed blocks escapes every check with probability (1 − p)^n, and
no node can tell before the seed exists which of its blocks will be drawn.

**Serving little does not dodge checks**: a node's blocks of epoch e are drawn at

    rate(node) = max(rate_ppm, ⌈floor · 10^6 / n⌉) (at most 10^6)      (`node_rate_ppm`)

where n is the number of blocks the node committed in e (the chain's count, `/coverage`) and
`floor` the genesis `spot_check_floor` (default 1): every node is expected to get at least
`floor` checks per epoch however few blocks it committed (a node with n ≤ floor blocks has all
of them checked), and at least the rate p when it serves a lot. A node cannot shrink n below
the work gateways reported for it without being flagged (abci_app/coverage.py: no commitment,
no pay, no routing). The verifier that checks a selected triple is the registered verifier
with the smallest

    sha256("planet/spot-check-verifier/v1" ‖ seed ‖ triple bytes ‖ verifier key (32 B))

(rendezvous hashing: adding or removing one verifier moves only its own share of the checks).

A selection becomes a ticket request (`protocol.tickets`); its outcome a committee verdict
whose `evidenceHash` is `evidence_hash(selection, outcome)`: failed check → offence 3 (50 %),
no ticket in time → offence 4 (5 %).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from protocol.errors import ProtocolError

SCALE_PPM = 1_000_000
DEFAULT_RATE_PPM = 50_000  # 5 %, UNFED's "~5 % of layer batches"
# A node answers ticket requests under the seeds of the current epoch and the
# TICKET_LOOKBACK_EPOCHS before it (node/server/tickets.py); a verifier starts no check or
# re-judgement under an older seed than current − CHECK_LOOKBACK_EPOCHS
# (node/verifier/spotchecks.py): a verifier running late would otherwise ask for tickets the
# node may no longer give, and every refused ticket is a timeout accusation of an honest node.
# The gap (4 epochs) outlasts a ticket's 30 s deadline at the devnet's shortest epochs (~8 s).
TICKET_LOOKBACK_EPOCHS = 8
CHECK_LOOKBACK_EPOCHS = 4
_SELECT_DOMAIN = b"planet/spot-check/v1"
_VERIFIER_DOMAIN = b"planet/spot-check-verifier/v1"
_EVIDENCE_DOMAIN = b"planet/spot-check-evidence/v1"
_KEY_HEX = re.compile(r"[0-9a-f]{64}\Z")
_B32_HEX = re.compile(r"0x[0-9a-f]{64}\Z")
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

# Offence codes (contracts' enum Offence, protocol.eip712.OFFENCE_*).
OFFENCE_FAILED_VERIFICATION = 3
OFFENCE_TIMEOUT = 4


class SelectionError(ProtocolError):
    """A seed, triple or rate that breaks the selection's input rules."""

    code = "spot_check_input"

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad spot-check input: {reason}")
        self.reason = reason


def _seed(seed: bytes | str) -> bytes:
    if isinstance(seed, str):
        text = seed[2:] if seed.startswith("0x") else seed
        if not _KEY_HEX.match(text):
            raise SelectionError("seed must be 32 bytes (64 lowercase hex)")
        return bytes.fromhex(text)
    if not isinstance(seed, bytes) or len(seed) != 32:
        raise SelectionError("seed must be 32 bytes")
    return seed


def check_rate(rate_ppm: int) -> int:
    if isinstance(rate_ppm, bool) or not isinstance(rate_ppm, int):
        raise SelectionError("rate_ppm must be an integer")
    if not 0 <= rate_ppm <= SCALE_PPM:
        raise SelectionError(f"rate_ppm {rate_ppm} outside 0…{SCALE_PPM}")
    return rate_ppm


@dataclass(frozen=True, slots=True, order=True)
class Triple:
    """One committed block: `node` 64 hex (ed25519 node key), `session` `0x` + 64 hex (the
    hop's public session tag as committed), `block` (positions [32·block, 32·block + 32)),
    `shard`. Ordering is by (node, session, block, shard)."""

    node: str
    session: str
    block: int
    shard: int

    def __post_init__(self) -> None:
        if not isinstance(self.node, str) or not _KEY_HEX.match(self.node):
            raise SelectionError("node must be 64 lowercase hex")
        if not isinstance(self.session, str) or not _B32_HEX.match(self.session):
            raise SelectionError("session must be 0x + 64 lowercase hex")
        for name, top in (("block", U64_MAX), ("shard", U32_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise SelectionError(f"{name} must be an integer in 0…{top}")

    def to_bytes(self) -> bytes:
        """node (32) ‖ session (32) ‖ uint64_be(block) ‖ uint32_be(shard): 76 bytes."""
        return (
            bytes.fromhex(self.node)
            + bytes.fromhex(self.session[2:])
            + struct.pack(">QI", self.block, self.shard)
        )


def draw(seed: bytes | str, triple: Triple) -> int:
    """The triple's 64-bit draw under `seed` (selected when draw · 10^6 < rate · 2^64)."""
    digest = hashlib.sha256(_SELECT_DOMAIN + _seed(seed) + triple.to_bytes()).digest()
    return int.from_bytes(digest[:8], "big")


def is_selected(seed: bytes | str, triple: Triple, rate_ppm: int = DEFAULT_RATE_PPM) -> bool:
    return draw(seed, triple) * SCALE_PPM < check_rate(rate_ppm) << 64


def node_rate_ppm(rate_ppm: int, floor: int, blocks: int) -> int:
    """The draw rate of one node's blocks of an epoch: max(rate_ppm, ⌈floor · 10^6 / blocks⌉),
    at most 10^6 (`rate_ppm` when `floor` or `blocks` is 0)."""
    check_rate(rate_ppm)
    for name, value in (("floor", floor), ("blocks", blocks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SelectionError(f"{name} must be a non-negative integer")
    if floor == 0 or blocks == 0:
        return rate_ppm
    return min(SCALE_PPM, max(rate_ppm, -(-floor * SCALE_PPM // blocks)))


def select(
    seed: bytes | str,
    triples: Iterable[Triple],
    rate_ppm: int = DEFAULT_RATE_PPM,
    *,
    floor: int = 0,
    blocks: Mapping[str, int] | None = None,
) -> list[Triple]:
    """The selected triples, sorted (duplicates counted once). With `floor`, a node's triples
    are drawn at `node_rate_ppm(rate_ppm, floor, blocks[node])` (`blocks`: the chain's count
    of the node's blocks in the epoch; a node missing from it counts its triples here)."""
    seed_bytes = _seed(seed)
    check_rate(rate_ppm)
    unique = set(triples)
    counts: dict[str, int] = {}
    for triple in unique:
        counts[triple.node] = counts.get(triple.node, 0) + 1
    if blocks is not None:
        counts.update({node: n for node, n in blocks.items() if node in counts})
    rates = {node: node_rate_ppm(rate_ppm, floor, n) for node, n in counts.items()}
    return sorted(t for t in unique if is_selected(seed_bytes, t, rates[t.node]))


def assign_verifier(seed: bytes | str, triple: Triple, verifiers: Sequence[str]) -> str:
    """The verifier key (64 hex) that checks `triple`: the smallest rendezvous hash."""
    seed_bytes = _seed(seed)
    keys = sorted(set(verifiers))
    if not keys:
        raise SelectionError("no verifier to assign")
    for key in keys:
        if not isinstance(key, str) or not _KEY_HEX.match(key):
            raise SelectionError("verifier keys must be 64 lowercase hex")
    prefix = _VERIFIER_DOMAIN + seed_bytes + triple.to_bytes()
    return min(keys, key=lambda k: hashlib.sha256(prefix + bytes.fromhex(k)).digest())


def epoch_of_height(height: int, epoch_length: int) -> int:
    """The epoch a committee block belongs to: epoch e covers heights (e−1)·L + 1 … e·L."""
    if height < 1 or epoch_length < 1:
        raise SelectionError("height and epoch length start at 1")
    return (height - 1) // epoch_length + 1


def triples_from_records(
    records: Iterable[object], *, epoch: int, epoch_length: int
) -> list[Triple]:
    """The triples committed in `epoch` from the chain's `/commitments` records
    (`{node, session, step, shard, height, …}`); malformed records are skipped (the chain's
    own records are well-formed; this is the verifier's boundary)."""
    out = []
    for record in records:
        if not isinstance(record, dict):
            continue
        height = record.get("height")
        if type(height) is not int or height < 1:
            continue
        if epoch_of_height(height, epoch_length) != epoch:
            continue
        try:
            out.append(
                Triple(
                    record.get("node"),
                    record.get("session"),
                    record.get("step"),
                    record.get("shard"),
                )  # type: ignore[arg-type]
            )
        except SelectionError:
            continue
    return sorted(set(out))


def checks_for(
    seed: bytes | str,
    triples: Iterable[Triple],
    verifiers: Sequence[str],
    me: str,
    rate_ppm: int = DEFAULT_RATE_PPM,
    *,
    floor: int = 0,
    blocks: Mapping[str, int] | None = None,
) -> list[Triple]:
    """The selected triples assigned to verifier `me` (what it requests tickets for)."""
    chosen = select(seed, triples, rate_ppm, floor=floor, blocks=blocks)
    return [t for t in chosen if assign_verifier(seed, t, verifiers) == me]


class Outcome(Enum):
    """What a spot check found. PASSED and SKIPPED need no verdict."""

    PASSED = "passed"
    FAILED = "failed"  # fingerprints differ beyond tolerance, or the ticket lies
    TIMEOUT = "timeout"  # no valid ticket within the deadline
    # the ticket opened the commitment, but the node announces other numerics than the
    # verifier's (protocol/numerics.py): its fingerprint is not comparable bitwise, not judged
    SKIPPED = "skipped"

    @property
    def offence(self) -> int | None:
        return {
            Outcome.PASSED: None,
            Outcome.SKIPPED: None,
            Outcome.FAILED: OFFENCE_FAILED_VERIFICATION,
            Outcome.TIMEOUT: OFFENCE_TIMEOUT,
        }[self]


def epoch_verifiers(record: object) -> tuple[str, list[str]] | None:
    """(`0x` + seed, sorted verifier keys) of one committee `/epochs` record (the epoch's seed
    and the spot-check verifiers it fixed, abci_app/epochs.py); None when malformed. A record
    without a valid `verifiers` list has no verifiers (nothing can be assigned under it)."""
    if not isinstance(record, dict):
        return None
    seed = record.get("seed")
    if not isinstance(seed, str) or not _KEY_HEX.match(seed):
        return None
    listed = record.get("verifiers")
    keys = listed if isinstance(listed, list) else []
    return "0x" + seed, sorted({k for k in keys if isinstance(k, str) and _KEY_HEX.match(k)})


def evidence_hash(seed: bytes | str, triple: Triple, outcome: Outcome) -> bytes:
    """The verdict's `evidenceHash` for a spot check:
    sha256("planet/spot-check-evidence/v1" ‖ seed ‖ triple bytes ‖ outcome name).
    Every verifier derives the same value for the same finding, so their votes add up."""
    if outcome.offence is None:
        raise SelectionError(f"a {outcome.value} check is no evidence")
    return hashlib.sha256(
        _EVIDENCE_DOMAIN + _seed(seed) + triple.to_bytes() + outcome.value.encode()
    ).digest()


def detection_probability_ppm(rate_ppm: int, blocks: int) -> int:
    """⌊10^6 · (1 − (1 − p)^n)⌋ for p = rate_ppm / 10^6, exactly (integers)."""
    check_rate(rate_ppm)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
        raise SelectionError("blocks must be a non-negative integer")
    miss_num = (SCALE_PPM - rate_ppm) ** blocks
    miss_den = SCALE_PPM**blocks
    return SCALE_PPM - -(-miss_num * SCALE_PPM // miss_den)
