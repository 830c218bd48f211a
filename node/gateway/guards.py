"""A personal client's guards: the one node per shard it keeps using, chosen at random.

With `--route private` (the personal client's default) the router does not pick nodes by cost:
it keeps one node per shard, drawn uniformly at random (system randomness) from the shard's
routable nodes the first time, and uses it for every question until it fails, stops being
routable, or `ROTATE_S` has passed since it was drawn; then it draws again, uniformly. So an
adversary holding a fraction f of a shard's routable nodes holds this user's hop there with
probability f per draw — whatever its speed, price or claims — instead of with probability
1 − (1 − f)^n over n questions drawn afresh each time, or up to 1 by being the fastest
(docs/privacy.md).

The guards are kept in a JSON file (`<PLANET_HOME>/route.json`, mode 0600), per model (the
other models' guards are kept as they are when one model's change):

    {"version": 1,
     "models": {"sha256:…": {"0": {"key": "<64 hex>", "drawn_at": 1790000000}, …}, …}}

A file that does not parse or holds a malformed entry is not trusted: its guards are drawn again
(a warning says so). Writes replace the file atomically.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# how a client chooses each shard's node (node/gateway/router.py): here, without aiohttp, so the
# CLI lists them at --help time; the personal client's default first
ROUTES = ("private", "cost", "uniform")
ROTATE_S = 30 * 24 * 3600  # a guard is drawn again after this long, even if it never failed
GUARDS_FILE = "route.json"
_KEY = re.compile(r"[0-9a-f]{64}\Z")
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Guard:
    key: str  # the node's ed25519 key (hex)
    drawn_at: int  # unix seconds


class Guards:
    """Per shard, the node this client keeps; `path` None keeps them in memory only."""

    def __init__(
        self,
        path: Path | None,
        model_hash: str,
        *,
        clock: Callable[[], float] = time.time,
        rotate_s: int = ROTATE_S,
        models: dict[str, dict[int, Guard]] | None = None,
    ) -> None:
        self.path = path
        self.model_hash = model_hash
        self.rotate_s = rotate_s
        self._clock = clock
        # every model's guards in the file (`models`: shared with a sibling's); this model's
        # are self._guards
        if models is None:
            models = self._load() if path is not None else {}
        self._models: dict[str, dict[int, Guard]] = models
        self._guards = self._models.setdefault(model_hash, {})

    def sibling(self, model_hash: str) -> Guards:
        """Another model's guards in the same file: one view of every model, so neither's save
        drops what the other kept (a client serving several models)."""
        return Guards(
            self.path, model_hash, clock=self._clock, rotate_s=self.rotate_s, models=self._models
        )

    def get(self, shard: int) -> str | None:
        """The shard's guard's node key, or None when there is none or it is due to rotate."""
        guard = self._guards.get(shard)
        if guard is None or self._clock() - guard.drawn_at >= self.rotate_s:
            return None
        return guard.key

    def keep(self, shard: int, key: str) -> None:
        """`key` is the shard's guard from now on (written through when it is a new one)."""
        if self.get(shard) == key:
            return
        self._guards[shard] = Guard(key, int(self._clock()))
        self._save()

    def _load(self) -> dict[str, dict[int, Guard]]:
        assert self.path is not None
        try:
            with self.path.open("rb") as handle:
                raw = handle.read(_MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as error:
            log.warning("route guards unreadable, drawing new ones: %s", error)
            return {}
        try:
            if len(raw) > _MAX_FILE_BYTES:
                raise ValueError("too large")
            return self._parse(json.loads(raw))
        except (ValueError, TypeError, KeyError) as error:
            log.warning("route guards in %s not trusted, drawing new ones: %s", self.path, error)
            return {}

    @staticmethod
    def _parse(doc: Any) -> dict[str, dict[int, Guard]]:
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("not a version 1 guards file")
        models = doc.get("models")
        if not isinstance(models, dict) or len(models) > 1024:
            raise ValueError("models must be an object (at most 1024)")
        return {str(model): Guards._parse_model(entries) for model, entries in models.items()}

    @staticmethod
    def _parse_model(entries: Any) -> dict[int, Guard]:
        if not isinstance(entries, dict) or len(entries) > 1024:
            raise ValueError("a model's guards must be an object (at most 1024 shards)")
        out = {}
        for shard_text, entry in entries.items():
            if not (isinstance(shard_text, str) and shard_text.isascii() and shard_text.isdigit()):
                raise ValueError(f"shard {shard_text!r} is not a number")
            if not isinstance(entry, dict):
                raise ValueError("a guard must be an object")
            key, drawn_at = entry.get("key"), entry.get("drawn_at")
            if not isinstance(key, str) or not _KEY.match(key):
                raise ValueError("a guard's key must be 64 lowercase hex")
            if type(drawn_at) is not int or drawn_at < 0:
                raise ValueError("a guard's drawn_at must be unix seconds")
            out[int(shard_text)] = Guard(key, drawn_at)
        return out

    def _save(self) -> None:
        if self.path is None:
            return
        doc = {
            "version": 1,
            "models": {
                model: {
                    str(shard): {"key": guard.key, "drawn_at": guard.drawn_at}
                    for shard, guard in sorted(guards.items())
                }
                for model, guards in sorted(self._models.items())
                if guards
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".route-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(doc, handle, indent=1)
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except OSError as error:
            log.warning("route guards not saved to %s (kept for this run): %s", self.path, error)
            Path(temporary).unlink(missing_ok=True)
