"""The relays a user's overlay paths enter by: its guards, kept like `--route private`'s nodes.

A path's first relay sees the user's address. Drawing it afresh for every link would let an
adversary that runs a fraction f of the relays be the first hop of some path of this user with
probability close to 1 over many questions. So the client keeps n entry relays (one per path),
drawn uniformly at random once and reused until one fails (the client suspects it:
node/client/overlay.py `OverlayLink.suspects`), leaves the relay list, or `ROTATE_S` passes
since it was drawn; then only that guard is drawn again. The adversary then holds one of this
user's guards with probability about f per draw.

Kept in `<PLANET_HOME>/relay-guards.json` (mode 0600, replaced atomically):

    {"version": 1, "guards": [{"url": "http://…", "key": "<64 hex>", "drawn_at": 1790000000}]}

A file that does not parse or holds a malformed entry is not trusted: its guards are drawn
again, and a warning says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from protocol.overlay import Hop

log = logging.getLogger(__name__)

ROTATE_S = 30 * 24 * 3600
GUARDS_FILE = "relay-guards.json"
_KEY = re.compile(r"[0-9a-f]{64}\Z")
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RelayGuard:
    url: str
    key: str  # the relay's X25519 key, hex
    drawn_at: int


class RelayGuards:
    """`entries(relays, n, avoided)`: the n entry relays, kept across questions and runs."""

    def __init__(
        self,
        path: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        rotate_s: int = ROTATE_S,
    ) -> None:
        self.path = path
        self.rotate_s = rotate_s
        self._clock = clock
        self._random = random.SystemRandom()
        self.guards: list[RelayGuard] = self._load() if path is not None else []

    def entries(self, relays: Sequence[Hop], n: int, avoided: set[str]) -> list[Hop]:
        """n distinct entry relays from `relays`: the kept guards that are still listed (same
        key), not avoided and not due, topped up by uniform draws from the rest."""
        listed = {relay.url: relay for relay in relays}
        now = int(self._clock())

        def still_good(guard: RelayGuard) -> bool:
            return (
                guard.url in listed
                and listed[guard.url].key.hex() == guard.key
                and guard.url not in avoided
                and now - guard.drawn_at < self.rotate_s
            )

        # a guard keeps its slot (its path) while it is good; a bad one's slot is drawn again
        slots: list[RelayGuard | None] = [g if still_good(g) else None for g in self.guards[:n]]
        slots += [None] * (n - len(slots))
        taken = {guard.url for guard in slots if guard is not None}
        fresh = [r for r in relays if r.url not in taken and r.url not in avoided]
        if len(taken) + len(fresh) < n:  # too few left unsuspected: draw from every relay
            fresh = [r for r in relays if r.url not in taken]
        drawn = iter(self._random.sample(fresh, slots.count(None)))
        guards = [
            guard if guard is not None else RelayGuard(r.url, r.key.hex(), now)
            for guard in slots
            for r in ([next(drawn)] if guard is None else [listed[guard.url]])
        ]
        if guards != self.guards:
            self.guards = guards
            self._save()
        return [listed[guard.url] for guard in guards]

    def _load(self) -> list[RelayGuard]:
        assert self.path is not None
        try:
            if self.path.stat().st_size > _MAX_FILE_BYTES:
                raise ValueError("too large")
            doc = json.loads(self.path.read_text())
            if doc.get("version") != 1 or not isinstance(doc.get("guards"), list):
                raise ValueError("not version 1")
            out = []
            for entry in doc["guards"]:
                url, key, drawn = entry["url"], entry["key"], entry["drawn_at"]
                valid = isinstance(url, str) and url.startswith(("http://", "https://"))
                valid = valid and isinstance(key, str) and bool(_KEY.match(key))
                if not valid or type(drawn) is not int or drawn < 0:
                    raise ValueError("a malformed guard")
                out.append(RelayGuard(url, key, drawn))
            return out
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            log.warning("relay guards %s not trusted (%s): drawing them again", self.path, error)
            return []

    def _save(self) -> None:
        if self.path is None:
            return
        guards = [{"url": g.url, "key": g.key, "drawn_at": g.drawn_at} for g in self.guards]
        doc = {"version": 1, "guards": guards}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=".relay-guards.")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(doc, out, sort_keys=True)
            os.chmod(temp, 0o600)
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
