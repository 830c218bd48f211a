"""A validator's credit key shares, one file per key period in `<home>/credit_shares/` (0600).

    <period, 12 digits>.json   {period, index, polynomial [hex] | null, opened {dealer: hex},
                                share: hex | null, public_share: hex | null, key: hex | null}

`polynomial` is this validator's dealing polynomial while its run may still need answers to
complaints (dropped once the key is formed); `opened` the shares it opened from others' deals;
`share` its final key share x_i of the period's committee key, checked against the chain's public
share X_i before it is written. The watcher (node/watcher/credit_dkg.py) is the one writer; the
ABCI app reads `share` to answer partial signatures. Files are replaced atomically (write to a
temporary file, fsync, rename), created 0600 in a 0700 directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

from protocol.errors import ConfigError

CREDIT_SHARES_DIR: Final = "credit_shares"


class CreditShareStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, period: int) -> Path:
        return self.directory / f"{period:012d}.json"

    def load(self, period: int) -> dict[str, Any] | None:
        path = self._path(period)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"credit share file {path}: {exc}") from None
        if not isinstance(doc, dict) or doc.get("period") != period:
            raise ConfigError(f"credit share file {path}: not this period's")
        return doc

    def save(self, period: int, doc: dict[str, Any]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(period)
        temporary = path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({**doc, "period": period}, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)

    def share(self, period: int) -> tuple[int, int] | None:
        """(index, x_i) of `period`, or None when this validator holds no formed share."""
        doc = self.load(period)
        if doc is None or not doc.get("share"):
            return None
        return int(doc["index"]), int(doc["share"], 16)
