"""The node agent announces this release's numerics by itself after an upgrade
(node/agent/numerics_keeper.py), on the in-process chain (epoch_length 5): once, only a version
genesis lists, never inside the 8-epoch cooldown (no refused txs), and not when turned off."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from node.agent.__main__ import parse_args
from node.agent.numerics_keeper import NumericsKeeper, first_send_epoch
from protocol.committee.registry import SetNumerics
from protocol.numerics import NUMERICS_COOLDOWN_EPOCHS
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import ask, node, register_body

pytestmark = pytest.mark.unit

LENGTH = 5


class ChainAgent:
    """`NodeAgent.send` and `CommitteeLink.params` over the in-process chain."""

    def __init__(self, chain: Chain, key: SigningKey) -> None:
        self.chain, self.key = chain, key
        self.codes: list[int] = []

    async def send(self, body: Any) -> tuple[int, str]:
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        self.codes.append(int(result.code))
        return int(result.code), result.log

    async def params(self) -> dict[str, Any]:
        return ask(self.chain, "/params")


def registered(numerics: int | None, accepted: list[int]) -> tuple[Chain, SigningKey, ChainAgent]:
    chain = Chain(genesis={"numerics": accepted})
    key = seeded_key("n1")
    body = dataclasses.replace(register_body("n1"), numerics=numerics)
    [result] = chain.block([chain.tx(body, key)])
    assert result.code == Code.OK
    return chain, key, ChainAgent(chain, key)


async def look(keeper: NumericsKeeper, chain: Chain, key: SigningKey) -> bool:
    """One look as the agent takes it: the node's view and the committed height."""
    return await keeper.step(node(chain, key), chain.state.height)


async def test_an_upgraded_node_announces_its_release_once() -> None:
    chain, key, agent = registered(2, [2, 3])
    keeper = NumericsKeeper(agent, agent, release=3)
    assert await look(keeper, chain, key) is True
    assert node(chain, key)["numerics_next"] == {"epoch": 2, "numerics": 3}
    for _ in range(3):  # pending, then in effect: nothing more is sent
        assert await look(keeper, chain, key) is False
        chain.advance_to(chain.state.height + LENGTH)
    assert node(chain, key)["numerics"] == 3 and agent.codes == [Code.OK]


async def test_an_unannounced_registration_announces_the_release() -> None:
    chain, key, agent = registered(None, [2])
    keeper = NumericsKeeper(agent, agent, release=2)
    assert await look(keeper, chain, key) is True and agent.codes == [Code.OK]


async def test_the_same_release_or_a_version_genesis_does_not_list_sends_nothing() -> None:
    chain, key, agent = registered(2, [2])
    assert await look(NumericsKeeper(agent, agent, release=2), chain, key) is False
    keeper = NumericsKeeper(agent, agent, release=3)  # a release the chain does not accept yet
    for _ in range(3):
        assert await look(keeper, chain, key) is False
    assert agent.codes == [] and keeper.accepted == (2,)


async def test_the_cooldown_is_waited_out_without_a_refused_tx() -> None:
    """The node moved to 3 in epoch 2; a second upgrade back to 2 is sent in the first epoch
    the chain accepts it (2 + 8 − 1), and no tx before."""
    chain, key, agent = registered(2, [2, 3])
    assert await look(NumericsKeeper(agent, agent, release=3), chain, key)
    chain.advance_to(LENGTH)  # epoch 2 opens: 3 in effect
    assert node(chain, key)["numerics_epoch"] == 2
    keeper = NumericsKeeper(agent, agent, release=2)
    first = first_send_epoch(node(chain, key))
    assert first == 2 + NUMERICS_COOLDOWN_EPOCHS - 1
    while chain.state.height < LENGTH * (first - 1):  # up to the last block of first − 1
        assert await look(keeper, chain, key) is False
        chain.block()
    assert agent.codes == [Code.OK]  # only the first change
    assert await look(keeper, chain, key) is True  # its tx: the first block of `first`
    assert agent.codes == [Code.OK, Code.OK]
    assert node(chain, key)["numerics_next"] == {"epoch": first + 1, "numerics": 2}


async def test_a_refusal_waits_for_the_next_epoch() -> None:
    """A TOO_SOON the keeper could not foresee (another process changed the record) is not
    sent again within the epoch."""

    class Refusing:
        def __init__(self) -> None:
            self.sent: list[Any] = []

        async def send(self, body: Any) -> tuple[int, str]:
            self.sent.append(body)
            return int(Code.NUMERICS_TOO_SOON), "changed numerics at epoch 1"

    chain, key, agent = registered(2, [2, 3])
    refusing = Refusing()
    keeper = NumericsKeeper(refusing, agent, release=3)
    for _ in range(LENGTH - 2):  # the rest of epoch 1
        assert await look(keeper, chain, key) is False
        chain.block()
    assert refusing.sent == [SetNumerics(3)]
    chain.advance_to(LENGTH)  # epoch 2
    await look(keeper, chain, key)
    assert len(refusing.sent) == 2


def test_auto_numerics_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--home", "h", "--manifest", "m", "--shard", "0", "--endpoint", "http://x",
            "--committee-rpc", "http://c"]  # fmt: skip
    assert parse_args(base).auto_numerics is True
    assert parse_args([*base, "--no-auto-numerics"]).auto_numerics is False
    monkeypatch.setenv("PLANET_AUTO_NUMERICS", "0")
    assert parse_args(base).auto_numerics is False
    monkeypatch.setenv("PLANET_AUTO_NUMERICS", "no")
    with pytest.raises(SystemExit):
        parse_args(base)
