"""The verifier's secret challenge seeds, one per epoch, kept on disk until revealed.

`<validator home>/verifier/seeds.json` (mode 0600): {"<epoch>": "<64 hex>"}. A seed is created
the first time its epoch is asked for, written before its commitment is sent (so a restart
can still reveal it), and forgotten `KEEP_EPOCHS` after its epoch.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from node.verifier.challenges import new_seed
from protocol.errors import ConfigError

KEEP_EPOCHS = 8
_ENTRY = re.compile(r"[0-9a-f]{64}\Z")


class SeedBook:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seeds: dict[int, bytes] = {}
        if path.exists():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                for epoch, seed in doc.items():
                    if not epoch.isascii() or not epoch.isdigit() or not _ENTRY.match(seed):
                        raise ValueError(f"bad entry {epoch!r}")
                    self._seeds[int(epoch)] = bytes.fromhex(seed)
            except (OSError, ValueError, AttributeError) as error:
                raise ConfigError(f"cannot read the verifier's seeds {path}: {error}") from None

    def get(self, epoch: int) -> bytes | None:
        return self._seeds.get(epoch)

    def ensure(self, epoch: int) -> bytes:
        """The seed of `epoch`, created (and saved) when new."""
        seed = self._seeds.get(epoch)
        if seed is None:
            seed = new_seed()
            self._seeds[epoch] = seed
            for old in [e for e in self._seeds if e < epoch - KEEP_EPOCHS]:
                del self._seeds[old]
            self._save()
        return seed

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({str(e): s.hex() for e, s in sorted(self._seeds.items())})
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, self.path)
