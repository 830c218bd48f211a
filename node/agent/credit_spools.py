"""One credit spool per shard, so a node that moved redeems each credit on the shard it earned
it on (issue 44).

A compute node spools the credits it is paid with into its `--credits-dir`; the node agent's
`--credits-dir` is the base above them: the process serving shard K spools to
`<base>/shard-K` (`shard_spool`; `planet join` starts the first one so, a move starts the new
one so, node_host.py). After a move the old process still spools there while it drains, and the
agent goes on redeeming that directory on the old shard: the chain takes a node's credits on a
shard it left for their window (abci_app/left_shards.py), and holds them to the committed
positions and price it had there.

    spools = ShardSpools(link, model, base, shard, legacy_shard=K)
    await spools.step()   each shard directory that holds credits is locked and redeemed on its
                          shard (credit_locker.py, credit_till.py `SpoolRedeemer`); credits
                          directly in `base` (a node joined before per-shard spools) count as
                          `legacy_shard`'s; returns the credits redeemed
    spools.shard = T      after a move: T's directory is the current one
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.agent.credit_locker import SpoolLocker
from node.agent.credit_till import CreditTill, SpoolRedeemer
from node.server.payments import CreditSpool, shard_spool, spool_base

log = logging.getLogger(__name__)

__all__ = ["ShardSpools", "shard_spool", "spool_base", "spooled_shards"]

_SHARD_DIR = re.compile(r"shard-(\d{1,5})")


def spooled_shards(base: Path) -> list[int]:
    """The shards whose spool directory under `base` exists, in order."""
    if not base.is_dir():
        return []
    found = (_SHARD_DIR.fullmatch(p.name) for p in base.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m is not None)


@dataclass
class ShardSpools:
    link: Any  # CommitteeLink (query, submit, committed_code)
    model: str
    base: Path
    shard: int  # the shard the node serves now
    legacy_shard: int | None = None  # the shard of credits spooled directly in `base`
    redeemed: int = 0
    _redeemers: dict[tuple[Path, int], SpoolRedeemer] = field(default_factory=dict)

    def _redeemer(self, directory: Path, shard: int) -> SpoolRedeemer:
        key = (directory, shard)
        if key not in self._redeemers:
            spool = CreditSpool(directory)
            self._redeemers[key] = SpoolRedeemer(
                CreditTill(self.link, self.model, shard),
                spool,
                locker=SpoolLocker(self.link, self.model, shard, spool),
            )
        return self._redeemers[key]

    def _spools(self) -> list[tuple[Path, int]]:
        spools = [(shard_spool(self.base, s), s) for s in {self.shard, *spooled_shards(self.base)}]
        if self.legacy_shard is not None and any(self.base.glob("[0-9a-f]*.json")):
            spools.append((self.base, self.legacy_shard))
        return sorted(spools)

    async def step(self) -> int:
        redeemed = 0
        for directory, shard in self._spools():
            if shard != self.shard and not any(directory.glob("[0-9a-f]*.json")):
                continue  # a shard left, nothing spooled there any more
            redeemed += await self._redeemer(directory, shard).step()
        self.redeemed += redeemed
        return redeemed
