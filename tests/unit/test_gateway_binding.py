"""`planet gateway serve`'s first-start binding (node/gateway/binding.py) against the in-process
committee chain: a fresh key binds its wallet once and says so; a restart changes nothing; a key
bound elsewhere, or a wallet bound to another key, stops the start by name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.queries import query
from node.gateway.binding import ensure_bound
from protocol.eip712 import address_of
from protocol.errors import ConfigError, RemoteError
from tests.committee_chain import Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_settlement import (
    GATEWAY,
    GATEWAY_EVM,
    GATEWAY_EVM_KEY,
    settled_chain,
)
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit

FRESH = seeded_key("fresh-gateway")
FRESH_EVM_KEY = seeded_evm_key("fresh-gateway")
FRESH_EVM = address_of(FRESH_EVM_KEY)


@dataclass
class ChainLink:
    """`CommitteeLink`'s query and send over an in-process chain (one block per send)."""

    chain: Chain
    key: SigningKey

    @property
    def signer(self) -> str:
        return hexkey(self.key)

    async def query(self, path: str, **params: Any) -> Any:
        full = path + "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else path
        code, value, log = query(self.chain.state, full, b"")
        assert code == 0, log
        return json.loads(value)

    async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]:
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        return int(result.code), result.log


async def test_a_fresh_gateway_binds_its_wallet_once_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chain = settled_chain()
    link = ChainLink(chain, FRESH)
    params = await link.query("/params")
    with caplog.at_level("INFO", logger="node.gateway.binding"):
        assert await ensure_bound(link, FRESH_EVM_KEY, FRESH_EVM, params) is True
    assert "gateway bound: committee key=" in caplog.text and FRESH_EVM.lower() in caplog.text
    assert (await link.query("/gateways", key=hexkey(FRESH)))["address"] == FRESH_EVM.lower()
    height = chain.state.height
    assert await ensure_bound(link, FRESH_EVM_KEY, FRESH_EVM, params) is False  # a restart
    assert chain.state.height == height  # nothing sent


async def test_a_key_or_wallet_bound_elsewhere_stops_the_start_by_name() -> None:
    chain = settled_chain()  # GATEWAY is bound to GATEWAY_EVM
    params = await ChainLink(chain, GATEWAY).query("/params")
    with pytest.raises(ConfigError, match="is bound to"):
        await ensure_bound(ChainLink(chain, GATEWAY), FRESH_EVM_KEY, FRESH_EVM, params)
    with pytest.raises(ConfigError, match="bound to another gateway key"):
        await ensure_bound(ChainLink(chain, FRESH), GATEWAY_EVM_KEY, GATEWAY_EVM, params)


@pytest.mark.parametrize(
    "answers",
    [
        [["not", "a dict"]],
        [{"address": "0xNOPE"}],
        [{"address": None}, {"binding": {"key": "zz", "bound": True, "nonce": 1}}],
        [{"address": None}, {"binding": {"key": "ab" * 32, "bound": "yes", "nonce": 1}}],
    ],
)
async def test_a_malformed_committee_answer_is_refused_by_name(answers: list[Any]) -> None:
    chain = settled_chain()
    link = ChainLink(chain, FRESH)
    params = await link.query("/params")
    replies = iter(answers)

    async def junk(path: str, **params: Any) -> Any:
        return next(replies)

    link.query = junk  # type: ignore[method-assign]
    with pytest.raises(RemoteError, match="bad_answer"):
        await ensure_bound(link, FRESH_EVM_KEY, FRESH_EVM, params)
