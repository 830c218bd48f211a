"""`planet relay serve`'s standing on the committee (node/relay/registration.py) over the
in-process committee chain: it registers once, a restart finds itself, what no retry can change
stops it by name, and it heartbeats so the chain keeps listing it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from abci_app.queries import query
from node.chain.committee_rpc import TxRejectedError
from node.cli.relay import _check_endpoint, _default_endpoint
from node.relay.registration import (
    RelayIdentity,
    RelayStandingError,
    ensure_registered,
    keep_alive,
)
from protocol.committee.registry import AttestStake, Leave, sign_registration
from protocol.eip712 import address_of
from protocol.errors import UsageError
from tests.committee_chain import Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_relays import x25519_of
from tests.unit.test_abci_state import hexkey, register

pytestmark = pytest.mark.unit


class ChainLink:
    """The relay's `CommitteeLink` calls over an in-process `Chain`: each `send` is one block."""

    def __init__(self, chain: Chain, label: str) -> None:
        self.chain, self.key = chain, seeded_key(label)
        self.signer = hexkey(self.key)
        self.sent: list[str] = []

    async def node(self, key: str) -> dict[str, Any] | None:
        code, value, _ = query(self.chain.state, f"/node?key={key}", b"")
        return json.loads(value) if code == 0 else None

    async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]:
        raw = self.chain.tx(body, self.key)
        checked = self.chain.machine.check_tx(raw)
        if checked.code != 0:
            raise TxRejectedError("chain", code=checked.code, log_text=checked.log)
        self.sent.append(body.TYPE)
        [result] = self.chain.block([raw])
        return result.code, result.log

    async def params(self) -> dict[str, Any]:
        return {"genesis": {"heartbeat_timeout": 6}}

    async def height(self) -> int:
        return self.chain.state.height


def identity(label: str, endpoint: str = "http://10.1.2.3:9100", key: str = "") -> RelayIdentity:
    evm = seeded_evm_key(label)
    return RelayIdentity(
        endpoint=endpoint,
        relay_key=key or x25519_of(label),
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, hexkey(seeded_key(label))),
    )


async def test_a_new_relay_registers_and_a_restart_finds_itself() -> None:
    chain = Chain()
    link = ChainLink(chain, "r1")
    view = await ensure_registered(link, identity("r1"))
    assert (view["role"], view["status"], view["endpoint"]) == (
        "relay",
        "JOIN",
        "http://10.1.2.3:9100",
    )
    assert link.sent == ["relay"]
    again = await ensure_registered(link, identity("r1"))  # a restart: nothing sent
    assert again["key"] == link.signer and link.sent == ["relay"]


@pytest.mark.parametrize(
    ("other", "mine", "words"),
    [
        (identity("r2", key=x25519_of("r1")), identity("r1"), "X25519 key"),
        (identity("r2", endpoint="http://10.1.2.3:9100"), identity("r1"), "endpoint"),
    ],
)
async def test_a_refused_registration_is_named(
    other: RelayIdentity, mine: RelayIdentity, words: str
) -> None:
    chain = Chain()
    await ensure_registered(ChainLink(chain, "r1"), mine)
    with pytest.raises(RelayStandingError, match=words) as refused:
        await ensure_registered(ChainLink(chain, "r2"), other)
    assert refused.value.hint


async def test_a_wallet_bound_to_a_node_is_refused_by_name() -> None:
    chain = Chain()
    register(chain, "n1")  # n1's wallet is bound to n1's node key
    evm = seeded_evm_key("n1")
    mine = RelayIdentity(
        "http://10.1.2.3:9100",
        x25519_of("r1"),
        address_of(evm),
        sign_registration(evm, hexkey(seeded_key("r1"))),
    )
    with pytest.raises(RelayStandingError, match="bound to another committee key"):
        await ensure_registered(ChainLink(chain, "r1"), mine)


async def test_a_node_key_a_left_relay_or_a_moved_relay_stops_it() -> None:
    chain = Chain()
    register(chain, "n1")
    with pytest.raises(RelayStandingError, match="not a relay"):
        await ensure_registered(ChainLink(chain, "n1"), identity("n1"))
    link = ChainLink(chain, "r1")
    await ensure_registered(link, identity("r1"))
    with pytest.raises(RelayStandingError, match=r"registered at http://10\.1\.2\.3:9100"):
        await ensure_registered(link, identity("r1", endpoint="http://10.9.9.9:9100"))
    assert (await link.send(Leave()))[0] == 0
    with pytest.raises(RelayStandingError, match="LEFT"):
        await ensure_registered(link, identity("r1"))


async def test_heartbeats_keep_a_staked_relay_listed() -> None:
    chain = Chain()  # heartbeat_timeout 4 blocks; the link says 6: one heartbeat every 2 blocks
    link = ChainLink(chain, "r1")
    await ensure_registered(link, identity("r1"))
    chain.block([chain.tx(AttestStake(link.signer, 10**17), v.key) for v in chain.validators[:3]])
    stop = asyncio.Event()
    task = asyncio.create_task(keep_alive(link, stop, poll_s=0.001))
    for _ in range(12):  # blocks made by others while the relay runs
        await asyncio.sleep(0.01)
        chain.block()
    stop.set()
    await task
    assert link.sent.count("heartbeat") >= 4
    _, value, _ = query(chain.state, "/relays", b"")
    [entry] = json.loads(value)["relays"]
    assert (entry["key"], entry["status"]) == (link.signer, "SERVING")


async def test_heartbeats_stop_once_the_relay_has_left() -> None:
    chain = Chain()
    link = ChainLink(chain, "r1")
    await ensure_registered(link, identity("r1"))
    await link.send(Leave())
    await asyncio.wait_for(keep_alive(link, asyncio.Event(), poll_s=0.001), 5)  # returns


def test_default_endpoint_is_the_listen_address_or_the_route_to_the_committee(monkeypatch) -> None:
    assert _default_endpoint("127.0.0.1", 9100, "http://127.0.0.1:26657") == "http://127.0.0.1:9100"
    assert _default_endpoint("::1", 9100, "http://127.0.0.1:26657") == "http://[::1]:9100"
    monkeypatch.setattr("node.cli.operator._reachable_address", lambda rpc: "198.51.100.4")
    assert _default_endpoint("0.0.0.0", 9100, "http://c:26657") == "http://198.51.100.4:9100"
    with pytest.raises(UsageError, match="not an IP address"):
        _default_endpoint("relay.example", 9100, "http://c:26657")


@pytest.mark.parametrize(
    "endpoint", ["http://relay.example:9100", "http://10.0.0.1", "http://10.0.0.1:9100/x"]
)
def test_a_bad_endpoint_flag_is_a_usage_error(endpoint: str) -> None:
    with pytest.raises(UsageError, match="--endpoint") as refused:
        _check_endpoint(endpoint)
    assert refused.value.hint


class FakeStaking:
    def __init__(self, amount: int, role: int, status: int) -> None:
        self.amount, self.role, self.status = amount, role, status

    def minimum_stake(self, role: int) -> int:
        return 10**17 if role == 3 else 10**18

    def stake_of(self) -> int:
        return self.amount

    def role_of(self) -> int:
        return self.role

    def status_of(self) -> int:
        return self.status


@pytest.mark.parametrize(
    ("staking", "words"),
    [
        (FakeStaking(0, 0, 0), "planet stake --role relay --amount 0.1"),
        (FakeStaking(10**17, 3, 2), "unbonding"),
        (FakeStaking(10**18, 1, 1), "another role"),
    ],
)
def test_serve_without_a_relay_stake_is_one_error_line(
    staking: FakeStaking, words: str, tmp_path, monkeypatch, capsys
) -> None:
    from types import SimpleNamespace

    from planet.main import main

    chain = SimpleNamespace(address="0x" + "12" * 20, staking=staking)
    monkeypatch.setattr("node.cli.operator._chain", lambda config, password: chain)
    monkeypatch.setenv("PLANET_PASSWORD", "relay test password")
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    rpc = "http://127.0.0.1:9"  # never dialled: the stake check comes first
    code = main(
        ["relay", "serve", "--home", str(tmp_path), "--evm-rpc", rpc, "--committee-rpc", rpc]
    )
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert err.count("error:") == 1 and words in err


@pytest.mark.parametrize("lease", ["0", "0.5", "3601", "nan", "inf", "-5", "1e9"])
def test_a_lease_out_of_range_is_one_error_line_with_a_hint(
    lease: str, tmp_path, monkeypatch, capsys
) -> None:
    from planet.main import main

    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    rpc = "http://127.0.0.1:9"  # never dialled: the flag is checked first
    code = main(["relay", "serve", "--home", str(tmp_path), "--evm-rpc", rpc,
                 "--committee-rpc", rpc, "--rendezvous-lease", lease])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.count("error:") == 1 and "--rendezvous-lease" in err and "hint:" in err


def test_a_lease_that_is_not_a_number_is_refused_by_the_parser(tmp_path, capsys) -> None:
    from planet.main import main

    with pytest.raises(SystemExit) as stopped:
        main(["relay", "serve", "--home", str(tmp_path), "--rendezvous-lease", "٣٠"])
    assert stopped.value.code == 2 and "--rendezvous-lease" in capsys.readouterr().err
