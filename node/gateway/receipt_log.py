"""The gateway's receipt log: an append-only JSON-lines file, one money event a line.

    {"receipt": {...}, "holder": "<hex>", "n": 7}       a charged question (its signed receipt,
                                                         numbered 1, 2, … in log order)
    {"debited": ["0x<query id>", ...]}                   voucher charges a posted root debited
    {"key_debited": {"payer", "key_id", "total_wei"}}    a key's total a posted root debited
    {"revoked": {"payer", "key_id"}}                     a payer revoked its payment key here

Every line is written and fsync'd before the gateway acts on it outside (a receipt leaves the
gateway only once it is on disk), so a restart replays the same history: used query ids,
running totals per payment key, revocations, what is still outstanding per payer. A damaged
line (a crash mid-write) is skipped with a warning; the lines after it still count.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ReceiptLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every readable entry, oldest first (none when the file does not exist)."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = None
                if not isinstance(entry, dict):
                    log.warning("skipping a damaged receipt line=%d file=%s", number, self.path)
                    continue
                yield entry
