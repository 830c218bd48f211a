"""SQLite persistence of the committee state (`<home>/app.sqlite`).

Layout: `kv(ns, key, value)` holds every state entry as canonical JSON text; `meta(k, v)` holds
`height` (last committed block) and `app_hash` (hex) — what ABCI Info returns so CometBFT knows
which blocks to replay after a crash. One SQLite transaction per block (`commit`) writes the
block's changed entries and the new height/app hash together, so a process killed at any point
restarts at a consistent committed height. WAL mode, `synchronous=NORMAL`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                               PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID;
"""


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

    def load(self) -> tuple[int, bytes, dict[str, dict[str, Any]]]:
        """(height, app hash, {ns: {key: value}}) of the last committed block (0, b"", {})."""
        meta = dict(self._db.execute("SELECT k, v FROM meta"))
        data: dict[str, dict[str, Any]] = {}
        for ns, key, value in self._db.execute("SELECT ns, key, value FROM kv"):
            data.setdefault(ns, {})[key] = json.loads(value)
        height = int(meta.get("height", "0"))
        app_hash = bytes.fromhex(meta.get("app_hash", ""))
        log.info(
            "state loaded path=%s height=%d entries=%d",
            self.path,
            height,
            sum(map(len, data.values())),
        )
        return height, app_hash, data

    def commit(
        self, height: int, app_hash: bytes, writes: Iterable[tuple[str, str, str | None]]
    ) -> None:
        """Persist one block atomically: `(ns, key, canonical JSON or None to delete)`."""
        upserts: list[tuple[str, str, str]] = []
        deletes: list[tuple[str, str]] = []
        for ns, key, text in writes:
            if text is None:
                deletes.append((ns, key))
            else:
                upserts.append((ns, key, text))
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
