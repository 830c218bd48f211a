"""SQLite persistence of the committee state (`<home>/app.sqlite`).

Layout: `kv(ns, key, value)` holds every state entry as canonical JSON text; `meta(k, v)` holds
`height` (last committed block) and `app_hash` (hex) — what ABCI Info returns so CometBFT knows
which blocks to replay after a crash. One SQLite transaction per block (`commit`) writes the
block's changed entries and the new height/app hash together, so a process killed at any point
restarts at a consistent committed height. WAL mode, `synchronous=NORMAL`.

The state is never loaded whole: `get` is a point lookup and `items` an ordered range scan
(keyset-paged, so a caller that stops early reads little). Parsed values are kept in a read
cache bounded in bytes of their JSON text (`READ_CACHE_BYTES`), updated by `commit`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                               PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID;
"""


READ_CACHE_BYTES = 16 * 1024 * 1024
_PAGE = 256
_MANY = 500  # keys per `get_many` query (SQLite allows 32 766 parameters)


class Store:
    """The committed state on disk; `path=":memory:"` for tests."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._cache: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self._cache_bytes = 0

    def load(self) -> tuple[int, bytes]:
        """(height, app hash) of the last committed block ((0, b"") for a new store)."""
        meta = dict(self._db.execute("SELECT k, v FROM meta"))
        height = int(meta.get("height", "0"))
        app_hash = bytes.fromhex(meta.get("app_hash", ""))
        log.info("state opened path=%s height=%d", self.path, height)
        return height, app_hash

    def get(self, ns: str, key: str) -> Any:
        """The committed value of (ns, key), or None. Never mutate the result (it is cached)."""
        item = (ns, key)
        cached = self._cache.get(item)
        if cached is not None:
            self._cache.move_to_end(item)
            return cached[0]
        row = self._db.execute("SELECT value FROM kv WHERE ns = ? AND key = ?", item).fetchone()
        if row is None:
            return None
        value = json.loads(row[0])
        self._remember(item, value, len(row[0]))
        return value

    def get_many(self, ns: str, keys: list[str]) -> dict[str, Any]:
        """Committed values of many keys of `ns` (absent keys are left out): one SQL query per
        `_MANY` keys instead of one per key (the commit/reveal batches' hot path)."""
        found: dict[str, Any] = {}
        missing: list[str] = []
        for key in keys:
            cached = self._cache.get((ns, key))
            if cached is not None:
                found[key] = cached[0]
            else:
                missing.append(key)
        for offset in range(0, len(missing), _MANY):
            chunk = missing[offset : offset + _MANY]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT key, value FROM kv WHERE ns = ? AND key IN ({marks})", (ns, *chunk)
            ).fetchall()
            for key, text in rows:
                value = json.loads(text)
                self._remember((ns, key), value, len(text))
                found[key] = value
        return found

    def _remember(self, item: tuple[str, str], value: Any, size: int) -> None:
        size += len(item[0]) + len(item[1]) + 64
        if size > READ_CACHE_BYTES // 16:
            return
        old = self._cache.pop(item, None)
        if old is not None:
            self._cache_bytes -= old[1]
        self._cache[item] = (value, size)
        self._cache_bytes += size
        while self._cache_bytes > READ_CACHE_BYTES:
            _, (_, dropped) = self._cache.popitem(last=False)
            self._cache_bytes -= dropped

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes

    def items(
        self, ns: str, start: str = "", stop: str | None = None, *, descending: bool = False
    ) -> Iterator[tuple[str, Any]]:
        """Committed (key, value) of `ns` with start ≤ key < stop, in key order (or the reverse
        order, `descending`), read lazily."""
        if descending:
            yield from self._items_descending(ns, start, stop)
            return
        lower, inclusive = start, True
        while True:
            op = ">=" if inclusive else ">"
            if stop is None:
                rows = self._db.execute(
                    f"SELECT key, value FROM kv WHERE ns = ? AND key {op} ? ORDER BY key LIMIT ?",
                    (ns, lower, _PAGE),
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT key, value FROM kv WHERE ns = ? AND key {op} ? AND key < ? "
                    "ORDER BY key LIMIT ?",
                    (ns, lower, stop, _PAGE),
                ).fetchall()
            for key, text in rows:
                yield key, json.loads(text)
            if len(rows) < _PAGE:
                return
            lower, inclusive = rows[-1][0], False

    def _items_descending(self, ns: str, start: str, stop: str | None) -> Iterator[tuple[str, Any]]:
        upper = stop
        while True:
            if upper is None:
                rows = self._db.execute(
                    "SELECT key, value FROM kv WHERE ns = ? AND key >= ? ORDER BY key DESC LIMIT ?",
                    (ns, start, _PAGE),
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT key, value FROM kv WHERE ns = ? AND key >= ? AND key < ? "
                    "ORDER BY key DESC LIMIT ?",
                    (ns, start, upper, _PAGE),
                ).fetchall()
            for key, text in rows:
                yield key, json.loads(text)
            if len(rows) < _PAGE:
                return
            upper = rows[-1][0]

    def size_bytes(self) -> int:
        """Bytes of every committed entry (ns + key + value text): what the state costs."""
        row = self._db.execute(
            "SELECT COALESCE(SUM(length(ns) + length(key) + length(value)), 0) FROM kv"
        ).fetchone()
        return int(row[0])

    def commit(
        self,
        height: int,
        app_hash: bytes,
        writes: Iterable[tuple[str, str, str | None]],
        keep: dict[tuple[str, str], Any] | None = None,
    ) -> None:
        """Persist one block atomically: `(ns, key, canonical JSON or None to delete)`.
        `keep`: written values to hold in the read cache (entries read by every tx, such as
        nonces); every other written entry leaves the cache."""
        upserts: list[tuple[str, str, str]] = []
        deletes: list[tuple[str, str]] = []
        for ns, key, text in writes:
            old = self._cache.pop((ns, key), None)
            if old is not None:
                self._cache_bytes -= old[1]
            if text is None:
                deletes.append((ns, key))
            else:
                upserts.append((ns, key, text))
                if keep is not None and (ns, key) in keep:
                    self._remember((ns, key), keep[(ns, key)], len(text))
        cur = self._db.cursor()
        cur.execute("BEGIN")
        try:
            if upserts:
                cur.executemany(
                    "INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)", upserts
                )
            if deletes:
                cur.executemany("DELETE FROM kv WHERE ns = ? AND key = ?", deletes)
            cur.executemany(
                "INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)",
                [("height", str(height)), ("app_hash", app_hash.hex())],
            )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
