"""The watcher relays the committee's confirmed verdicts to FraudProofs (node/watcher/verdicts.py):
each once; another relayer first (`VerdictNonceUsed`) is done; a transient failure is retried."""

from __future__ import annotations

from typing import Any

import pytest

from node.chain.evm.errors import ContractRevert
from node.watcher.verdicts import VerdictRelay
from protocol.errors import UnavailableError

pytestmark = pytest.mark.unit


class Committee:
    def __init__(self, verdicts: list[dict[str, Any]]) -> None:
        self.verdicts = verdicts
        self.asked: list[dict[str, Any]] = []

    async def query(self, path: str, **params: Any) -> Any:
        self.asked.append({"path": path, **params})
        return {"verdicts": self.verdicts}


class Chain:
    def __init__(self, answers: dict[str, list[Exception | None]]) -> None:
        self.answers = answers
        self.sent: list[str] = []

    def relay_confirmed_verdict(self, record: dict[str, Any]) -> Any:
        self.sent.append(record["id"])
        outcome = self.answers.get(record["id"], [None]).pop(0)
        if outcome is not None:
            raise outcome
        return {"status": 1}


async def test_verdict_relay_slashes_each_confirmed_verdict_once() -> None:
    committee = Committee([{"id": "0xa", "node": "n"}, {"id": "0xb"}, {"id": "0xc"}])
    chain = Chain(
        {
            "0xb": [ContractRevert("VerdictNonceUsed")],  # another watcher was first
            "0xc": [UnavailableError("evm rpc down"), None],  # retried on the next pass
        }
    )
    relay = VerdictRelay(committee, chain)
    with pytest.raises(UnavailableError):
        await relay.step()
    assert committee.asked[0] == {"path": "/verdicts", "confirmed": "true"}
    assert await relay.step() == ["0xc"]
    assert await relay.step() == []
    assert chain.sent == ["0xa", "0xb", "0xc", "0xc"]
    assert relay.relayed == {"0xa", "0xb", "0xc"}


async def test_verdict_relay_waits_for_two_thirds_on_a_version_quorum_verdict() -> None:
    """Confirmed by a numerics version's quorum (< 2/3 of all power): not sent, not marked
    done; sent once more votes make it relayable."""
    record = {"id": "0xd", "quorum_numerics": 3, "relayable": False}
    committee = Committee([record])
    chain = Chain({})
    relay = VerdictRelay(committee, chain)
    assert await relay.step() == [] and chain.sent == [] and relay.relayed == set()
    record["relayable"] = True
    assert await relay.step() == ["0xd"]
