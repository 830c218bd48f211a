"""Vote extensions carrying each validator's locally computed reputation scores (pure).

Flow (ABCI 2.0, CometBFT v0.38):

1. ExtendVote at height h: when h closes epoch e (h % epoch_length == 0) the validator attaches
   `canonical_json({"epoch": e, "invalid": [node key hex, ...], "scores": {node key hex: C at
   10**6}[, "speeds": {node key hex: tokens/s}]})` read from `<home>/reputation_scores.json`
   (written by its verifier): `scores` are its credibility values, `invalid` the nodes whose
   challenge response was missing or wrongly signed (a node is in at most one of the two),
   `speeds` (present only when not empty) the decode speed it measured on its clean sampled
   challenges of nodes it also scores in this report (protocol/speeds.py: an integer in
   [1, 100 000]; a speed for a node the report does not score is refused: a verifier reports
   only the nodes it challenged). At other heights the extension is empty.
   VerifyVoteExtension checks only this format.
2. PrepareProposal at h+1: the proposer injects the extended commit it received as the special
   first tx `VX_PREFIX + canonical_json({"height", "round", "votes": [...]})`.
3. ProcessProposal at h+1 (every validator): the tx must be present exactly when required, each
   vote's ed25519 signature must verify over CometBFT's vote-extension sign bytes
   (`CanonicalVoteExtension{extension=1 bytes, height=2 sfixed64, round=3 sfixed64,
   chain_id=4 string}`, uvarint length-delimited — `types.VoteExtensionSignBytes`) under the
   validator's key, and the signed votes must carry ≥ 2/3 of the voting power.
4. FinalizeBlock at h+1 applies, per node: C = 0 when validators with more than 1/3 of the
   power reported it invalid (PlanetServe: one leader's report alone never lowers a node);
   otherwise the power-weighted lower median of the reported scores, when validators with
   ≥ 2/3 of the power reported a score for it; otherwise nothing. The reports of validators
   benched for a false accusation are dropped first (machine.py; abci_app/verdicts.py), the
   thresholds stay fractions of the whole power. The counted reports' speeds update each
   node's measured speed: the lower median of the latest reports of distinct verifiers
   (abci_app/speeds.py).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from abci_app.encoding import encode_uvarint
from protocol.canonical import JsonInputError, canonical_json, canonical_text, parse_json
from protocol.errors import ProtocolError
from protocol.fields import Fields, is_int
from protocol.reputation import SCALE
from protocol.speeds import MAX_SPEED, MIN_SPEED, is_speed

VX_PREFIX = b"\x00planet-vx/v1\n"
MAX_SCORES = 10_000
# a full report: 10 000 scores (~78 bytes each) + 10 000 invalid keys (~67 bytes each) + a
# speed for each scored node (~76 bytes each)
MAX_EXTENSION_BYTES = 3 * 1024 * 1024
MAX_VOTES = 1_000  # validators in one extended commit (the devnet has 4; CometBFT caps sets)
MAX_VX_BYTES = MAX_VOTES * (2 * MAX_EXTENSION_BYTES + 512)
BLOCK_ID_FLAG_ABSENT = 1
BLOCK_ID_FLAG_COMMIT = 2
MAX_INT64 = (1 << 63) - 1
MAX_ROUND = (1 << 31) - 1  # CometBFT rounds are int32
_NODE = re.compile(r"[0-9a-f]{64}\Z")
_ADDRESS = re.compile(r"[0-9A-F]{40}\Z")
_HEX = re.compile(r"(?:[0-9a-f]{2})*\Z")
_SIGNATURE_HEX = re.compile(r"(?:[0-9a-f]{128})?\Z")


class VoteExtensionError(ProtocolError):
    """A vote extension or the injected extended-commit tx is invalid."""

    code = "bad_vote_extension"


_check = Fields(VoteExtensionError)


def _sfixed64(value: int) -> bytes:
    return struct.pack("<q", value)


def vote_extension_sign_bytes(chain_id: str, height: int, round_: int, extension: bytes) -> bytes:
    """CometBFT v0.38 `VoteExtensionSignBytes`: the length-delimited protobuf encoding of
    `CanonicalVoteExtension` (proto3: zero/empty fields are omitted)."""
    body = bytearray()
    if extension:
        body += b"\x0a" + encode_uvarint(len(extension)) + extension
    if height:
        body += b"\x11" + _sfixed64(height)
    if round_:
        body += b"\x19" + _sfixed64(round_)
    chain = chain_id.encode()
    if chain:
        body += b"\x22" + encode_uvarint(len(chain)) + chain
    return encode_uvarint(len(body)) + bytes(body)


# --- the extension itself -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    """One validator's view of an epoch: credibility per node, and nodes that did not answer
    (or answered with a bad signature)."""

    scores: dict[str, int]
    invalid: tuple[str, ...] = ()
    speeds: dict[str, int] = field(default_factory=dict)  # tokens/s, of scored nodes only


EMPTY_REPORT = Report({}, ())
EXTENSION_KEYS = {"epoch", "invalid", "scores"}  # and "speeds" when the report has any


def encode_extension(
    epoch: int,
    scores: dict[str, int],
    invalid: tuple[str, ...] = (),
    speeds: dict[str, int] | None = None,
) -> bytes:
    doc: dict[str, Any] = {
        "epoch": epoch,
        "invalid": sorted(set(invalid)),
        "scores": dict(sorted(scores.items())),
    }
    if speeds:
        doc["speeds"] = dict(sorted(speeds.items()))
    return canonical_json(doc)


def parse_report(scores: Any, invalid: Any, speeds: Any = None) -> Report:
    """Validate a report's `scores` mapping, `invalid` list (sorted, unique, disjoint) and
    `speeds` mapping (None: none)."""
    checked = parse_scores(scores)
    if not isinstance(invalid, list) or len(invalid) > MAX_SCORES:
        raise VoteExtensionError(f"invalid: expected a list of ≤ {MAX_SCORES} node keys")
    for node in invalid:
        if not isinstance(node, str) or not _NODE.match(node):
            raise VoteExtensionError(f"invalid: bad node key {ascii(node)[:80]}")
    if invalid != sorted(set(invalid)):
        raise VoteExtensionError("invalid: node keys must be sorted and unique")
    if set(invalid) & set(checked):
        raise VoteExtensionError("a node is both scored and reported invalid")
    measured = {} if speeds is None else parse_speeds(speeds, checked)
    return Report(checked, tuple(invalid), measured)


def parse_speeds(doc: Any, scores: dict[str, int]) -> dict[str, int]:
    """Validate a `{node key hex: tokens/s}` mapping: each node scored in the same report (a
    verifier measures the nodes it challenged, never others), each speed within the bounds."""
    if not isinstance(doc, dict) or len(doc) > MAX_SCORES:
        raise VoteExtensionError(f"speeds: expected an object of ≤ {MAX_SCORES} entries")
    for node, value in doc.items():
        if not isinstance(node, str) or not _NODE.match(node):
            raise VoteExtensionError(f"speeds: bad node key {ascii(node)[:80]}")
        if node not in scores:
            raise VoteExtensionError(
                f"speeds[{node}]: a node this report does not score (a verifier reports the "
                "speed of the nodes it challenged only)"
            )
        if not is_speed(value):
            raise VoteExtensionError(
                f"speeds[{node}]: expected an integer in [{MIN_SPEED}, {MAX_SPEED}] tokens/s"
            )
    return dict(doc)


def parse_scores(doc: Any) -> dict[str, int]:
    """Validate a `{node key hex: C at 10**6}` mapping."""
    if not isinstance(doc, dict) or len(doc) > MAX_SCORES:
        raise VoteExtensionError(f"scores: expected an object of ≤ {MAX_SCORES} entries")
    for node, value in doc.items():
        if not isinstance(node, str) or not _NODE.match(node):
            raise VoteExtensionError(f"scores: bad node key {ascii(node)[:80]}")
        if not is_int(value, 0, SCALE):
            raise VoteExtensionError(f"scores[{node}]: expected an integer in [0, {SCALE}]")
    return doc


def parse_extension(raw: bytes, height: int, epoch_length: int) -> Report:
    """The report in a vote extension made at `height` (empty for an empty extension).
    Non-empty extensions are only valid at epoch-closing heights, for that epoch."""
    if not raw:
        return EMPTY_REPORT
    if height < 1 or height % epoch_length != 0:
        raise VoteExtensionError(
            f"height {height} does not close an epoch: extension must be empty"
        )
    try:
        doc = parse_json(raw, max_bytes=MAX_EXTENSION_BYTES, max_depth=2, max_int_digits=20)
    except JsonInputError as error:
        raise VoteExtensionError(error.message) from None
    keys = EXTENSION_KEYS | {"speeds"} if isinstance(doc, dict) and "speeds" in doc else None
    _check.exact_object(doc, "extension", keys or EXTENSION_KEYS)
    epoch = _check.integer(doc["epoch"], "epoch", 0, MAX_INT64)
    if epoch != height // epoch_length:
        raise VoteExtensionError(f"epoch {epoch} is not {height // epoch_length}")
    if "speeds" in doc and doc["speeds"] == {}:
        raise VoteExtensionError("speeds: omitted when empty, never an empty object")
    report = parse_report(doc["scores"], doc["invalid"], doc.get("speeds"))
    # every value is now a validated int, str, list or object: canonical_text is exact
    if canonical_text(doc).encode() != raw:
        raise VoteExtensionError("extension is not canonical JSON")
    return report


# --- the injected extended-commit tx ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtVote:
    """One validator's vote in the extended commit of the previous height."""

    address: str  # CometBFT validator address, uppercase hex
    power: int
    extension: bytes
    signature: bytes
    flag: int

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "extension": self.extension.hex(),
            "flag": self.flag,
            "power": self.power,
            "signature": self.signature.hex(),
        }


@dataclass(frozen=True, slots=True)
class ExtendedCommit:
    height: int  # the height whose votes these are (block height − 1)
    round: int
    votes: tuple[ExtVote, ...]

    def encode(self) -> bytes:
        return VX_PREFIX + canonical_json(
            {"height": self.height, "round": self.round, "votes": [v.to_json() for v in self.votes]}
        )


def is_vx_tx(raw: bytes) -> bool:
    return raw.startswith(VX_PREFIX)


def _vote(doc: Any) -> ExtVote:
    v = _check.exact_object(doc, "vote", {"address", "extension", "flag", "power", "signature"})
    for name, pattern in (
        ("address", _ADDRESS),
        ("extension", _HEX),
        ("signature", _SIGNATURE_HEX),
    ):
        if not isinstance(v[name], str) or not pattern.match(v[name]):
            raise VoteExtensionError(f"vote.{name}: bad value")
    if len(v["extension"]) > 2 * MAX_EXTENSION_BYTES:
        raise VoteExtensionError("vote.extension: too long")
    return ExtVote(
        address=v["address"],
        power=_check.integer(v["power"], "power", 0, MAX_INT64),
        extension=bytes.fromhex(v["extension"]),
        signature=bytes.fromhex(v["signature"]),
        flag=_check.integer(v["flag"], "flag", 0, 3),
    )


def decode_vx_tx(raw: bytes) -> ExtendedCommit:
    """Strictly typed parse of the extended-commit tx; raises `VoteExtensionError` only."""
    if not is_vx_tx(raw):
        raise VoteExtensionError("not an extended-commit tx")
    try:
        doc = parse_json(
            raw[len(VX_PREFIX) :], max_bytes=MAX_VX_BYTES, max_depth=3, max_int_digits=20
        )
    except JsonInputError as error:
        raise VoteExtensionError(f"malformed extended-commit tx ({error.message})") from None
    _check.exact_object(doc, "extended commit", {"height", "round", "votes"})
    votes = doc["votes"]
    if not isinstance(votes, list) or len(votes) > MAX_VOTES:
        raise VoteExtensionError(f"votes: expected a list of ≤ {MAX_VOTES}")
    commit = ExtendedCommit(
        height=_check.integer(doc["height"], "height", 0, MAX_INT64),
        round=_check.integer(doc["round"], "round", 0, MAX_ROUND),
        votes=tuple(_vote(v) for v in votes),
    )
    if commit.encode() != raw:
        raise VoteExtensionError("extended-commit tx is not canonical")
    return commit


def _vote_valid(
    vote: ExtVote,
    chain_id: str,
    height: int,
    round_: int,
    validators: dict[str, tuple[bytes, int]],
    epoch_length: int,
) -> bool:
    if vote.address not in validators or validators[vote.address][1] != vote.power:
        return False
    sign_bytes = vote_extension_sign_bytes(chain_id, height, round_, vote.extension)
    try:
        VerifyKey(validators[vote.address][0]).verify(sign_bytes, vote.signature)
        parse_extension(vote.extension, height, epoch_length)
    except (BadSignatureError, ValueError, VoteExtensionError):
        return False
    return True


def without_invalid_extensions(
    commit: ExtendedCommit,
    chain_id: str,
    validators: dict[str, tuple[bytes, int]],
    epoch_length: int,
) -> ExtendedCommit:
    """The proposer's filter of its `local_last_commit`: a COMMIT vote whose extension does not
    verify (bad signature, junk, floats …) is turned into an absent vote (flag 1, no extension).
    CometBFT v0.38 adds *late* precommits of the previous height to that commit without calling
    VerifyVoteExtension, so a Byzantine validator's junk would otherwise make every honest
    proposal fail ProcessProposal and stop the chain."""
    if not 0 <= commit.height <= MAX_INT64 or not 0 <= commit.round <= MAX_ROUND:
        return commit
    votes = []
    for vote in commit.votes:
        if vote.flag == BLOCK_ID_FLAG_COMMIT and not _vote_valid(
            vote, chain_id, commit.height, commit.round, validators, epoch_length
        ):
            vote = ExtVote(vote.address, vote.power, b"", b"", BLOCK_ID_FLAG_ABSENT)
        votes.append(vote)
    return ExtendedCommit(commit.height, commit.round, tuple(votes))


def verify_extended_commit(
    commit: ExtendedCommit,
    chain_id: str,
    validators: dict[str, tuple[bytes, int]],
    epoch_length: int,
) -> dict[str, Report]:
    """Check every vote's signature and format, and ≥ 2/3 of the power; returns
    {validator address: report} of the signed votes. `validators`: address → (pubkey, power)."""
    total = sum(power for _, power in validators.values())
    seen: set[str] = set()
    signed_power = 0
    reports: dict[str, Report] = {}
    for vote in commit.votes:
        if vote.address in seen:
            raise VoteExtensionError(f"validator {vote.address} appears twice")
        seen.add(vote.address)
        if vote.address not in validators:
            raise VoteExtensionError(f"unknown validator {vote.address}")
        pubkey, power = validators[vote.address]
        if vote.power != power:
            raise VoteExtensionError(f"validator {vote.address}: power {vote.power} != {power}")
        if vote.flag != BLOCK_ID_FLAG_COMMIT:
            if vote.extension or vote.signature:
                raise VoteExtensionError(f"validator {vote.address}: extension without a commit")
            continue
        sign_bytes = vote_extension_sign_bytes(
            chain_id, commit.height, commit.round, vote.extension
        )
        try:
            VerifyKey(pubkey).verify(sign_bytes, vote.signature)
        except (BadSignatureError, ValueError):
            raise VoteExtensionError(f"validator {vote.address}: bad extension signature") from None
        reports[vote.address] = parse_extension(vote.extension, commit.height, epoch_length)
        signed_power += power
    if 3 * signed_power < 2 * total:
        raise VoteExtensionError(f"signed power {signed_power} of {total} is below 2/3")
    return reports


def weighted_lower_median(values: list[tuple[int, int]]) -> int:
    """The smallest value v such that the power of values ≤ v is at least half the total
    (ties broken by value only, so the input order never matters)."""
    if not values:
        raise ValueError("weighted_lower_median of nothing")
    ordered = sorted(values)
    total = sum(power for _, power in ordered)
    running = 0
    for value, power in ordered:
        running += power
        if 2 * running >= total:
            return value
    return ordered[-1][0]  # pragma: no cover - unreachable (running reaches total)


def agreed_scores(
    reports: dict[str, Report], powers: dict[str, int], total_power: int
) -> dict[str, int]:
    """Per node: 0 when validators with > 1/3 of `total_power` reported it invalid; else the
    weighted lower median of the reported scores when validators holding ≥ 2/3 of
    `total_power` reported one; nodes meeting neither rule are left out."""
    per_node: dict[str, list[tuple[int, int]]] = {}
    invalid_power: dict[str, int] = {}
    for validator, report in reports.items():
        for node, value in report.scores.items():
            per_node.setdefault(node, []).append((value, powers[validator]))
        for node in report.invalid:
            invalid_power[node] = invalid_power.get(node, 0) + powers[validator]
    agreed: dict[str, int] = {}
    for node in sorted(set(per_node) | set(invalid_power)):
        if 3 * invalid_power.get(node, 0) > total_power:
            agreed[node] = 0
            continue
        values = per_node.get(node, [])
        if values and 3 * sum(power for _, power in values) >= 2 * total_power:
            agreed[node] = weighted_lower_median(values)
    return agreed
