"""What a node's `open` parser takes beyond the first open (protocol/stream.py), as its GET /info
advertises it, and the client's typed reading of that advertisement.

A node answers `"open_features": ["next_alternates", ...]` in its /info (and in the INFO its
overlay door answers: node/server/info_body.py). A client sends an open a field only the nodes
that advertise it parse, because a node of before refuses an open with a field it does not know
(`bad_control`) and the circuit would fail there:

    next_alternates   `next.alternates`: the next hop's addresses at its other rendezvous relays
                      (a node behind NAT, docs/overlay.md), dialled when `next.url` is not reached
    ring_back         `back`: a later hop sends its outputs (or its next hop's) back up the link
                      that fed it (the ring's return path, docs/overlay.md *The ring*)
    ring_vouch        `vouch`: the last hop of a ring sends the client the digest of each row
                      it sends back up (protocol/ring_vouch.py)
    ring              `ring`: the first hop runs the session's decode loop (it holds the
                      model's client head; advertised only then)

Reading it (`parse_open_features`): an absent field is a node of before (`OLD_NODE`: nothing
beyond the first open); a well-formed list may name features this client does not know (a newer
node), which are ignored; anything else (not a list, too long, a name out of grammar) is
refused as `BadOpenFeaturesError`, and the caller treats the node as one of before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from protocol.errors import ProtocolError

NEXT_ALTERNATES: Final = "next_alternates"
RING_BACK: Final = "ring_back"
RING_VOUCH: Final = "ring_vouch"
RING: Final = "ring"
# what this code's nodes advertise (node/server/info_body.py), in this order; RING after them
# where the node holds the client head
ADVERTISED: Final = (NEXT_ALTERNATES, RING_BACK, RING_VOUCH)
MAX_FEATURES: Final = 32
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")


class BadOpenFeaturesError(ProtocolError):
    """A node's /info `open_features` is not a list of at most MAX_FEATURES feature names
    (`[a-z][a-z0-9_]{0,31}`, distinct)."""

    code = "bad_open_features"


@dataclass(frozen=True, slots=True)
class OpenFeatures:
    """The open fields a node takes beyond the first open (module docstring)."""

    next_alternates: bool = False
    ring_back: bool = False
    ring: bool = False
    ring_vouch: bool = False


OLD_NODE: Final = OpenFeatures()  # no advertisement: only the first open's fields


def parse_open_features(value: Any) -> OpenFeatures:
    """A node's /info `open_features` value (None: the field was absent) as OpenFeatures, or
    BadOpenFeaturesError naming what is wrong."""
    if value is None:
        return OLD_NODE
    if not isinstance(value, list) or len(value) > MAX_FEATURES:
        raise BadOpenFeaturesError(f"open_features must be a list of at most {MAX_FEATURES} names")
    names: set[str] = set()
    for index, item in enumerate(value):
        if not isinstance(item, str) or not _NAME.match(item):
            raise BadOpenFeaturesError(
                f"open_features[{index}] is not a feature name ([a-z][a-z0-9_]{{0,31}})"
            )
        if item in names:
            raise BadOpenFeaturesError(f"open_features[{index}] repeats {item}")
        names.add(item)
    return OpenFeatures(
        next_alternates=NEXT_ALTERNATES in names,
        ring_back=RING_BACK in names,
        ring=RING in names,
        ring_vouch=RING_VOUCH in names,
    )


def open_features_of(info: Any) -> OpenFeatures:
    """`parse_open_features` of a whole /info answer (untrusted: not an object → OLD_NODE)."""
    return parse_open_features(info.get("open_features") if isinstance(info, dict) else None)
