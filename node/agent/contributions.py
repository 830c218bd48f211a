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

With `state_path` what was claimed survives an agent restart: `{"instance", "claimed"}` is
written *before* each claim is sent (a claim whose tx then fails to land is lost, never sent
twice), and read back at the first step when the node process is the same one (`instance`,
the id `/info` gives each node start; a restarted node counts from 0 again, and so does the
claim). Without it a restarted agent would claim the running node's tokens a second time
against later backing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from node.chain.committee_rpc import TxRejectedError
from protocol.committee.settlement import Contribution, ShardWork

log = logging.getLogger(__name__)

CONTRIBUTIONS_FILE = "agent-contributions.json"  # in the operator home (`state_path`)
MAX_TOKENS = (1 << 48) - 1  # protocol.committee: per contribution item


class Link(Protocol):
    signer: str

    async def query(self, path: str, **params: Any) -> Any: ...
    async def submit(self, body: Any) -> Any: ...


class Served(NamedTuple):
    tokens: int  # tokens the node ran through its layers since it started
    layers: int  # layers of its shard
    instance: str = ""  # the node process's id (/info `instance`); "" when unknown


@dataclass
class ContributionReporter:
    link: Link
    model: str
    shard: int
    served: Callable[[], Awaitable[tuple[Any, ...]]]  # a `Served` (or (tokens, layers))
    claimed: int = 0  # tokens of this node instance already claimed
    state_path: Path | None = None  # where `claimed` survives a restart (None: memory only)
    instance: str | None = None  # the node instance `claimed` counts for (None: not loaded)

    def _load(self, instance: str) -> None:
        saved: Any = {}
        if self.state_path is not None:
            with contextlib.suppress(OSError, ValueError):
                saved = json.loads(self.state_path.read_text())
        same = isinstance(saved, dict) and instance and saved.get("instance") == instance
        claimed = saved.get("claimed") if same else 0
        self.claimed = claimed if type(claimed) is int and claimed >= 0 else 0
        self.instance = instance
        if same:
            log.info(
                "contributions: %d tokens of node instance %s already claimed", claimed, instance
            )

    def _save(self, claimed: int) -> None:
        if self.state_path is None:
            return
        temporary = self.state_path.with_name(self.state_path.name + ".tmp")
        temporary.write_text(json.dumps({"instance": self.instance, "claimed": claimed}) + "\n")
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, self.state_path)

    async def step(self) -> int:
        """Claim what is both served and backed; returns the tokens claimed (0: nothing)."""
        tokens, layers, instance = Served(*await self.served())
        if instance != self.instance:
            self._load(instance)  # the first step, or the node restarted (its counter too)
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
        self._save(self.claimed + claim)  # before sending: a restart never claims it twice
        try:
            await self.link.submit(body)
        except TxRejectedError as error:
            log.warning("contribution refused code=%d log=%s", error.tx_code, error.log_text)
            self._save(self.claimed)  # refused for sure: it may be claimed again
            return 0
        self.claimed += claim
        log.info("contribution sent tokens=%d layers=%d", claim, layers)
        return claim
