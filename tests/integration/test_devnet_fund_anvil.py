"""`planet devnet fund` run side by side against a real anvil (deploy/devnet/fund.py): every
transfer lands exactly once.

anvil numbers its unlocked dev account's transactions itself, and two sends that reach it at
once can get the same nonce; one is refused ("nonce too low", "replacement transaction
underpriced"). On the old code 14 of 80 transfers sent 8 at a time were refused this way, this
test failed in each of its runs, and a shared-devnet test's user once went unfunded (its setup
failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy.anvil import ANVIL_DEV_ADDRESS, Anvil, rpc_call, start_anvil
from deploy.devnet.fund import fund
from deploy.devnet.plan import STATE_FILE, devnet_dir, write_state
from harness.ports import ephemeral_port

pytestmark = pytest.mark.integration

AT_ONCE = 8
ROUNDS = 3
WEI = 10**18


@pytest.fixture
def devnet_home(tmp_path: Path) -> Iterator[tuple[Path, Anvil]]:
    """A devnet state dir naming a real anvil (all `fund` reads of the devnet)."""
    with start_anvil(ephemeral_port(), log_path=tmp_path / "anvil.log") as anvil:
        directory = devnet_dir(tmp_path)
        directory.mkdir(parents=True)
        write_state(directory, {"status": "up", "evm_rpc": anvil.rpc_url, "accounts": []})
        yield tmp_path, anvil


def _nonce(anvil: Anvil) -> int:
    return int(
        str(rpc_call(anvil.rpc_url, "eth_getTransactionCount", [ANVIL_DEV_ADDRESS, "latest"])), 16
    )


def test_transfers_sent_side_by_side_each_land_once(devnet_home: tuple[Path, Anvil]) -> None:
    home, anvil = devnet_home
    # not 0x00…01-09: the precompiles, where a 21,000-gas transfer runs out of gas
    addresses = [f"0x{0xAB00 + r:04x}{i:036x}" for r in range(ROUNDS) for i in range(AT_ONCE)]
    before = _nonce(anvil)
    for start in range(0, len(addresses), AT_ONCE):
        with ThreadPoolExecutor(AT_ONCE) as pool:
            done = list(pool.map(lambda a: fund(home, a, WEI), addresses[start : start + AT_ONCE]))
        assert [d["address"] for d in done] == addresses[start : start + AT_ONCE]
    for address in addresses:  # paid once each: no refused send was counted, none sent twice
        assert int(str(rpc_call(anvil.rpc_url, "eth_getBalance", [address, "latest"])), 16) == WEI
    assert _nonce(anvil) == before + len(addresses)
    listed = json.loads((devnet_dir(home) / STATE_FILE).read_text())["accounts"]
    assert sorted(a["address"] for a in listed) == sorted(addresses)
