"""`ContributionReporter`: the agent's side of settlement — claim the node's own work count.

The compute node counts the positions it ran through its shard (`/info` → `load.tokens`); the
gateways report, per node, the work of the questions they were paid for (`work_report`), which
the chain keeps as the node's *backing* (`/backing?node=`); the node's own commitments of the
blocks it served are its *coverage* (`/coverage?node=`: committed positions not yet credited,
abci_app/coverage.py — no commitment, no pay). Each `step()` claims
`min(unclaimed tokens, backed layer-tokens // layers, creditable committed tokens)` tokens with
one `contribution` tx, so the node is credited exactly what all three agree on; tokens nobody
paid for (direct unpaid use, failed circuits) or that it did not commit stay unclaimed, and
backing or commitments that arrive later are claimed later.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from node.chain.committee_rpc import TxRejectedError
from protocol.committee.settlement import Contribution, ShardWork

log = logging.getLogger(__name__)

MAX_TOKENS = (1 << 48) - 1  # protocol.committee: per contribution item


class Link(Protocol):
    signer: str

    async def query(self, path: str, **params: Any) -> Any: ...
    async def submit(self, body: Any) -> Any: ...


@dataclass
class ContributionReporter:
    link: Link
    model: str
    shard: int
    served: Callable[[], Awaitable[tuple[int, int]]]  # (tokens run so far, layers of the shard)
    claimed: int = 0  # tokens already claimed by this process

    async def step(self) -> int:
        """Claim what is both served and backed; returns the tokens claimed (0: nothing)."""
        tokens, layers = await self.served()
        unclaimed = tokens - self.claimed
        if unclaimed <= 0 or layers < 1:
            return 0
        answer = await self.link.query("/backing", node=self.link.signer)
        backed = 0
        for entry in answer.get("backing", []):
            if entry.get("model") == self.model and entry.get("shard") == self.shard:
                backed = int(entry["layer_tokens"])
        covered = await self.link.query("/coverage", node=self.link.signer)
        creditable = 0
        for entry in covered.get("shards", []):
            if entry.get("shard") == self.shard:
                creditable = int(entry["creditable_tokens"])
        claim = min(unclaimed, backed // layers, creditable, MAX_TOKENS)
        if claim < 1:
            return 0
        body = Contribution((ShardWork(self.model, self.shard, layers, claim),))
        try:
            await self.link.submit(body)
        except TxRejectedError as error:
            log.warning("contribution refused code=%d log=%s", error.tx_code, error.log_text)
            return 0
        self.claimed += claim
        log.info("contribution sent tokens=%d layers=%d", claim, layers)
        return claim
