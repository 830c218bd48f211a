"""`planet ask --pay` building blocks: devnet defaults, the deposit quote, chain checks,
an unreachable gateway."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from node.cli.ask import _pay_defaults
from node.gateway import client as gw
from planet.main import build_parser
from protocol.errors import ConfigError, UnavailableError, UsageError

pytestmark = pytest.mark.unit

POOL = {"price_wei_per_token": "1000", "chain_id": 31337, "escrow": "0x" + "ab" * 20}


def _args(*extra: str):
    return build_parser().parse_args(["ask", "--pay", "Hi", *extra])


def test_ask_pay_defaults_come_from_devnet_json_and_flags_win(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    monkeypatch.delenv("PLANET_PASSWORD", raising=False)
    (tmp_path / "devnet").mkdir()
    (tmp_path / "devnet" / "devnet.json").write_text(
        json.dumps(
            {
                "status": "up",
                "chain_id": 31337,
                "gateway_url": "http://127.0.0.1:8123/",
                "evm_rpc": "http://127.0.0.1:8545",
                "deployment": "/d/deployment.json",
                "password_file": "/d/password",
                "accounts": [
                    {"name": "node0", "keystore": "/d/node0.json"},
                    {"name": "user", "keystore": "/d/user.json"},
                ],
            }
        )
    )
    settings = _pay_defaults(_args())
    assert settings["gateway"] == "http://127.0.0.1:8123"
    assert settings["deployment"] == Path("/d/deployment.json")
    assert settings["wallet"] == Path("/d/user.json")
    assert settings["password_file"] == Path("/d/password")
    flags = _pay_defaults(_args("--gateway", "http://g:1", "--wallet", "/w.json"))
    assert flags["gateway"] == "http://g:1" and flags["wallet"] == Path("/w.json")
    assert flags["password_file"] is None


def test_ask_pay_without_devnet_or_deployment_is_a_usage_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    with pytest.raises(UsageError, match="deployment"):
        _pay_defaults(_args())


def test_quote_bounds_the_prompt_by_its_bytes() -> None:
    quote = gw.quote(POOL, "héllo", 10)
    assert quote.prompt_bound == 6 + gw.TEMPLATE_ALLOWANCE
    assert quote.amount == 1000 * (6 + gw.TEMPLATE_ALLOWANCE + 10)


def test_check_chain_refuses_another_chain_or_escrow() -> None:
    gw.check_chain(POOL, 31337, "0x" + "AB" * 20)
    with pytest.raises(ConfigError, match="chain"):
        gw.check_chain(POOL, 1, POOL["escrow"])
    with pytest.raises(ConfigError):
        gw.check_chain(POOL, 31337, "0x" + "cd" * 20)


async def test_fetch_pool_unreachable_gateway_is_unavailable(unused_tcp_port) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(UnavailableError, match="unreachable"):
            await gw.fetch_pool(http, f"http://127.0.0.1:{unused_tcp_port}")
