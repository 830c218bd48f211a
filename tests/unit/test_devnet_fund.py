"""`planet devnet fund` run side by side (deploy/devnet/fund.py): every funded address stays in
devnet.json's accounts, none lost to another command's write.

anvil is an in-process fake of its JSON-RPC (`rpc_call`): the two transfers are held until
both commands have read the state, which is when a command that writes back the state it read
before its transfer loses the other's address.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deploy.anvil import DEVNET_CHAIN_ID
from deploy.devnet import fund as fund_module
from deploy.devnet.plan import devnet_dir, write_state

pytestmark = pytest.mark.unit

ADDRESSES = ("0x" + "1" * 40, "0x" + "2" * 40, "0x" + "3" * 40)


def _fake_anvil(both_sent: threading.Barrier) -> Any:
    def rpc_call(url: str, method: str, params: Any = None, timeout: float = 5.0) -> Any:
        if method == "web3_clientVersion":
            return "anvil/v1.0.0"
        if method == "eth_chainId":
            return hex(DEVNET_CHAIN_ID)
        if method == "eth_sendTransaction":
            return "0x" + params[0]["to"][2:].rjust(64, "0")
        if method == "eth_getTransactionReceipt":
            both_sent.wait(timeout=10)  # every command has read the state and sent its transfer
            return {"status": "0x1"}
        if method == "eth_getBalance":
            return hex(10**19)
        raise AssertionError(f"unexpected RPC {method}")

    return rpc_call


def test_funds_side_by_side_all_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = devnet_dir(tmp_path)
    directory.mkdir(parents=True)
    user = {"name": "user", "address": "0x" + "9" * 40, "keystore": None, "home": None}
    write_state(directory, {"status": "up", "evm_rpc": "http://127.0.0.1:1", "accounts": [user]})
    monkeypatch.setattr(fund_module, "rpc_call", _fake_anvil(threading.Barrier(len(ADDRESSES))))

    with ThreadPoolExecutor(max_workers=len(ADDRESSES)) as pool:
        done = list(pool.map(lambda a: fund_module.fund(tmp_path, a, 10**19), ADDRESSES))

    assert [d["address"] for d in done] == list(ADDRESSES)
    state = json.loads((directory / "devnet.json").read_text())
    listed = [a["address"] for a in state["accounts"]]
    assert listed[0] == user["address"] and sorted(listed[1:]) == sorted(ADDRESSES)
    assert state["status"] == "up" and state["evm_rpc"] == "http://127.0.0.1:1"


def test_an_address_funded_again_is_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = devnet_dir(tmp_path)
    directory.mkdir(parents=True)
    write_state(directory, {"status": "up", "evm_rpc": "http://127.0.0.1:1", "accounts": []})
    monkeypatch.setattr(fund_module, "rpc_call", _fake_anvil(threading.Barrier(1)))

    mixed = "0x" + "aB" * 20
    fund_module.fund(tmp_path, mixed, 10**19)
    fund_module.fund(tmp_path, mixed.lower(), 10**19)

    state = json.loads((directory / "devnet.json").read_text())
    assert [a["address"] for a in state["accounts"]] == [mixed]
