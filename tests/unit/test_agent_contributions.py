"""The agent's contribution reporter against an in-process committee chain: it claims only
what the node served AND a gateway backed, and claims later backing later."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from node.agent.contributions import CONTRIBUTIONS_FILE, ContributionReporter, Served
from node.chain.committee_rpc import TxRejectedError
from protocol.committee.settlement import NodeWork
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_settlement import (
    GATEWAY,
    evm_of,
    one,
    report,
    settled_chain,
    two_nodes,
)
from tests.unit.test_abci_state import commit_served, hexkey, make_routable, register

pytestmark = pytest.mark.unit


@dataclass
class NodeLink:
    chain: Chain
    key: SigningKey
    signer: str = field(init=False)

    def __post_init__(self) -> None:
        self.signer = hexkey(self.key)

    async def query(self, path: str, **params: Any) -> Any:
        full = path + "?" + "&".join(f"{k}={v}" for k, v in params.items())
        code, value, log = query(self.chain.state, full, b"")
        assert code == Code.OK, log
        return json.loads(value)

    async def submit(self, body: Any) -> Any:
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        if result.code != Code.OK:
            raise TxRejectedError("chain", code=int(result.code), log_text=result.log)
        return result


def credited(chain: Chain, label: str = "node-a") -> int:
    _, value, _ = query(chain.state, f"/credits?account={evm_of(label)}", b"")
    return sum(c["layer_tokens"] for c in json.loads(value)["credits"])


async def test_contributions_claim_the_served_and_backed_part_only() -> None:
    chain = settled_chain()
    a, _ = two_nodes(chain)
    served = {"tokens": 30}

    async def counter() -> tuple[int, int]:
        return served["tokens"], 2

    reporter = ContributionReporter(NodeLink(chain, a), "m", 0, counter)
    assert await reporter.step() == 0  # served but nothing backed: no tx at all
    assert credited(chain) == 0
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 10)), GATEWAY).code == Code.OK
    assert await reporter.step() == 10  # backed 10 of the 30 served
    assert credited(chain) == 20
    assert await reporter.step() == 0
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 50)), GATEWAY).code == Code.OK
    assert await reporter.step() == 20  # the other 20 served tokens, no more
    assert credited(chain) == 60
    served["tokens"] = 45
    assert await reporter.step() == 15


async def test_a_restarted_agent_does_not_claim_the_same_node_tokens_twice(tmp_path: Path) -> None:
    """The node keeps running (same instance) while its agent restarts: the new agent reads
    what was claimed and claims only new tokens; a restarted node (new instance) counts from 0."""
    chain = settled_chain()
    a, _ = two_nodes(chain)
    served = Served(30, 2, "node-run-1")

    async def counter() -> Served:
        return served

    state = tmp_path / CONTRIBUTIONS_FILE
    first = ContributionReporter(NodeLink(chain, a), "m", 0, counter, state_path=state)
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 100)), GATEWAY).code == Code.OK
    assert await first.step() == 30
    assert credited(chain) == 60
    # the agent is killed and started again; the node served 5 more tokens meanwhile
    served = Served(35, 2, "node-run-1")
    second = ContributionReporter(NodeLink(chain, a), "m", 0, counter, state_path=state)
    assert await second.step() == 5
    assert credited(chain) == 70
    # without the state file the same restart would claim all 35 again
    forgetful = ContributionReporter(NodeLink(chain, a), "m", 0, counter)
    assert await forgetful.step() == 35
    # the node restarts: its counter starts at 0 with a new instance, and so does the claim
    served = Served(4, 2, "node-run-2")
    third = ContributionReporter(NodeLink(chain, a), "m", 0, counter, state_path=state)
    assert await third.step() == 4
    assert json.loads(state.read_text()) == {"instance": "node-run-2", "claimed": 4}


async def test_the_claim_is_saved_before_it_is_sent(tmp_path: Path) -> None:
    """Killed between writing and sending: the claim counts as made (never sent twice)."""
    chain = settled_chain()
    a, _ = two_nodes(chain)
    assert one(chain, report(NodeWork(hexkey(a), "m", 0, 2, 100)), GATEWAY).code == Code.OK
    state = tmp_path / CONTRIBUTIONS_FILE

    async def counter() -> Served:
        return Served(20, 2, "run")

    class Killed(Exception):
        pass

    link = NodeLink(chain, a)
    reporter = ContributionReporter(link, "m", 0, counter, state_path=state)

    async def killed(body: Any) -> Any:
        assert json.loads(state.read_text())["claimed"] == 20
        raise Killed

    link.submit = killed  # type: ignore[method-assign]
    with pytest.raises(Killed):
        await reporter.step()
    again = ContributionReporter(NodeLink(chain, a), "m", 0, counter, state_path=state)
    assert await again.step() == 0


async def test_contributions_claim_only_what_the_node_committed() -> None:
    chain = settled_chain()
    register(chain, "silent", shards=(0,))
    silent = seeded_key("silent")
    make_routable(chain, silent)
    served = {"tokens": 100}

    async def counter() -> tuple[int, int]:
        return served["tokens"], 2

    reporter = ContributionReporter(NodeLink(chain, silent), "m", 0, counter)
    assert one(chain, report(NodeWork(hexkey(silent), "m", 0, 2, 100)), GATEWAY).code == Code.OK
    assert await reporter.step() == 0  # served and backed, nothing committed: no claim
    assert credited(chain, "silent") == 0
    commit_served(chain, silent, shard=0, blocks=1)  # 32 committed positions
    assert await reporter.step() == 32
    assert credited(chain, "silent") == 64
    assert await reporter.step() == 0
    commit_served(chain, silent, shard=0, blocks=4)
    assert await reporter.step() == 68  # the rest of the 100 served and backed tokens
