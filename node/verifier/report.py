"""How credibility scores reach the chain: `<validator home>/reputation_scores.json`.

The validator's ABCI app reads this file in ExtendVote at each epoch-closing height
(docs/committee.md, "Vote extensions"): `{"epoch": e, "scores": {node key: C}, "invalid": [...]
[, "speeds": {node key: tokens/s}]}` with C an integer in [0, 10**6], node keys 64 lowercase
hex, `invalid` sorted, unique and disjoint from `scores` (nodes whose challenge answer was
missing or wrongly signed), `speeds` (only when not empty) the measured decode speeds of scored
nodes, integers in [1, 100 000] (speeds.py, protocol/speeds.py). The file is written
canonically and atomically (temp file + rename) so ExtendVote never reads half of it.

    scores = {key: epoch_credibility(per_challenge_scores[key]) for key in nodes}
    write_scores(home / SCORES_FILE, epoch, scores, invalid=[...], speeds={key: 42})
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from node.verifier.scoring import SCALE
from protocol.canonical import canonical_json
from protocol.errors import UsageError
from protocol.speeds import MAX_SPEED, MIN_SPEED, is_speed

SCORES_FILE = "reputation_scores.json"
MAX_ENTRIES = 10_000
_NODE_KEY = re.compile(r"[0-9a-f]{64}")


def scores_report(
    epoch: int,
    scores: Mapping[str, int],
    invalid: Iterable[str] = (),
    speeds: Mapping[str, int] | None = None,
) -> dict[str, object]:
    """The validated report object (raises UsageError on anything the chain would refuse)."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise UsageError(f"epoch must be a non-negative integer, got {epoch!r}")
    bad = sorted(set(invalid))
    for key in [*scores, *bad]:
        if not isinstance(key, str) or not _NODE_KEY.fullmatch(key):
            raise UsageError(f"node key {key!r} is not 64 lowercase hex")
    for key, value in scores.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SCALE:
            raise UsageError(f"credibility of {key} must be an integer in [0, {SCALE}]")
    if set(bad) & set(scores):
        raise UsageError("a node cannot be both scored and invalid")
    if len(scores) > MAX_ENTRIES or len(bad) > MAX_ENTRIES:
        raise UsageError(f"at most {MAX_ENTRIES} scores and {MAX_ENTRIES} invalid nodes")
    report: dict[str, object] = {
        "epoch": epoch,
        "invalid": bad,
        "scores": dict(sorted(scores.items())),
    }
    for key, value in (speeds or {}).items():
        if key not in scores:
            raise UsageError(f"speed of {key}: a node the report does not score")
        if not is_speed(value):
            raise UsageError(f"speed of {key} must be an integer in [{MIN_SPEED}, {MAX_SPEED}]")
    if speeds:
        report["speeds"] = dict(sorted(speeds.items()))
    return report


def write_scores(
    path: Path,
    epoch: int,
    scores: Mapping[str, int],
    invalid: Iterable[str] = (),
    speeds: Mapping[str, int] | None = None,
) -> Path:
    """Write the report atomically; returns `path`."""
    data = canonical_json(scores_report(epoch, scores, invalid, speeds))
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    return path
