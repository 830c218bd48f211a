"""The relay registry on the committee state machine (abci_app/registry.py, relay_queries.py): a
relay registers like a node, is listed by `/relays` only while its Relay stake is agreed and it
is up, refuses a second relay with its endpoint or key, leaves or expires like a node, and
`/relays` pages completely."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import AttestStake, Heartbeat, Leave, sign_registration
from protocol.committee.relays import EndpointError, RegisterRelay, relay_endpoint
from protocol.eip712 import address_of
from tests.committee_chain import Chain, seeded_evm_key, seeded_key
from tests.unit.test_abci_state import ask, hexkey, register

pytestmark = pytest.mark.unit

RELAY_MIN = 10**17  # genesis min_stake.relay by default (the Staking contract's, deploy/evm.py)


def x25519_of(label: str) -> str:
    return hashlib.sha256(b"x25519/" + label.encode()).hexdigest()


def relay_body(label: str, endpoint: str | None = None, key: str | None = None) -> RegisterRelay:
    signing = seeded_key(label)
    evm = seeded_evm_key(label)
    number = int(hashlib.sha256(label.encode()).hexdigest()[:4], 16)
    return RegisterRelay(
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, hexkey(signing)),
        endpoint=endpoint or f"http://10.0.{number % 250}.{number // 250 % 250}:9100",
        relay_key=key or x25519_of(label),
    )


def send(chain: Chain, body: object, key: SigningKey) -> Code:
    [result] = chain.block([chain.tx(body, key)])
    return Code(result.code)


def add_relay(chain: Chain, label: str, **kwargs: str) -> SigningKey:
    key = seeded_key(label)
    assert send(chain, relay_body(label, **kwargs), key) == Code.OK
    return key


def stake(chain: Chain, key: SigningKey, amount: int = RELAY_MIN) -> None:
    txs = [chain.tx(AttestStake(hexkey(key), amount), v.key) for v in chain.validators[:3]]
    assert [r.code for r in chain.block(txs)] == [Code.OK] * 3


def listed(chain: Chain, limit: int = 1000) -> list[str]:
    """Every listed relay's key, paging `/relays` until `next` is null."""
    keys: list[str] = []
    after = ""
    for _ in range(100):  # a cursor that does not advance fails here instead of looping
        page = ask(chain, f"/relays?limit={limit}" + (f"&after={after}" if after else ""))
        assert len(page["relays"]) <= limit
        keys += [entry["key"] for entry in page["relays"]]
        if page["next"] is None:
            return keys
        after = page["next"]
    raise AssertionError("/relays did not reach its last page in 100 pages")


# --- registration -------------------------------------------------------------------------------


def test_relay_registers_join_and_is_listed_once_its_stake_is_agreed() -> None:
    chain = Chain()
    key = add_relay(chain, "r1")
    view = ask(chain, f"/node?key={hexkey(key)}")
    assert (view["role"], view["status"], view["relay_key"]) == ("relay", "JOIN", x25519_of("r1"))
    assert listed(chain) == []  # registered, not yet staked: not listed
    v = chain.validators
    chain.block([chain.tx(AttestStake(hexkey(key), RELAY_MIN), x.key) for x in v[:2]])
    assert listed(chain) == []  # 2 of 4 validators: not 2/3 of the power
    chain.block([chain.tx(AttestStake(hexkey(key), RELAY_MIN), v[2].key)])
    [entry] = ask(chain, "/relays")["relays"]
    assert entry == {
        "key": hexkey(key),
        "evm_address": address_of(seeded_evm_key("r1")),
        "endpoint": relay_body("r1").endpoint,
        "relay_key": x25519_of("r1"),
        "stake": str(RELAY_MIN),
        "status": "JOIN",
    }


def test_relay_stake_below_the_relay_minimum_is_not_listed() -> None:
    chain = Chain()
    key = add_relay(chain, "r1")
    stake(chain, key, RELAY_MIN - 1)
    assert listed(chain) == []
    stake(chain, key, RELAY_MIN)
    assert listed(chain) == [hexkey(key)]
    stake(chain, key, 0)  # unbonding, slashed to nothing or staked as another role: 0 attested
    assert listed(chain) == []


def test_relay_refused_by_name_when_key_address_endpoint_or_x25519_key_is_taken() -> None:
    chain = Chain()
    node = register(chain, "n1")  # a compute node's key cannot also be a relay
    assert send(chain, relay_body("n1"), node) == Code.ALREADY_REGISTERED
    first = add_relay(chain, "r1")
    assert send(chain, relay_body("r1"), first) == Code.ALREADY_REGISTERED
    other = seeded_key("r2")
    evm = seeded_evm_key("r1")  # r1's EVM address bound again, to r2's key
    taken = dataclasses.replace(
        relay_body("r2"),
        evm_address=address_of(evm),
        evm_signature=sign_registration(evm, hexkey(other)),
    )
    assert send(chain, taken, other) == Code.EVM_ADDRESS_TAKEN
    assert send(chain, relay_body("r2", key=x25519_of("r1")), other) == Code.RELAY_KEY_TAKEN
    same_url = relay_body("r2", endpoint=relay_body("r1").endpoint)
    assert send(chain, same_url, other) == Code.RELAY_ENDPOINT_TAKEN
    assert send(chain, relay_body("r2"), other) == Code.OK  # the refusals changed nothing


def test_relay_bad_evm_signature_refused_before_a_block() -> None:
    chain = Chain()
    body = dataclasses.replace(relay_body("r1"), evm_address=address_of(seeded_evm_key("else")))
    raw = chain.tx(body, seeded_key("r1"))
    assert chain.machine.check_tx(raw).code == Code.BAD_EVM_SIGNATURE


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://relay.example:9100",  # a name: relays dial next hops only at IP literals
        "http://10.0.0.1",  # no port
        "http://10.0.0.1:9100/",  # a path
        "http://10.0.0.1:09100",  # not canonical
        "http://10.0.0.1:70000",
        "ftp://10.0.0.1:21",
        "http://[2001:DB8::1]:443",  # IPv6 not compressed lowercase
        "http://2001:db8::1:443",  # IPv6 without brackets
        "http://[10.0.0.1]:443",
        "http://10.0.0.256:9100",
        "http://user@10.0.0.1:9100",
        "",
    ],
)
def test_relay_endpoint_not_canonical_is_malformed(endpoint: str) -> None:
    with pytest.raises(EndpointError):
        relay_endpoint(endpoint)
    body = {**relay_body("r1").to_json(), "endpoint": endpoint}
    with pytest.raises(TxDecodeError, match=r"body\.endpoint"):
        RegisterRelay.from_json(body)


def test_relay_endpoint_canonical_forms_accepted() -> None:
    for text in ("http://203.0.113.7:9100", "https://[2001:db8::1]:443", "http://127.0.0.1:1"):
        assert relay_endpoint(text) == text


def test_relay_key_not_32_bytes_of_hex_is_malformed() -> None:
    for bad in ("ab" * 31, "AB" * 32, "ab" * 33, 7):
        with pytest.raises(TxDecodeError, match="relay_key"):
            RegisterRelay.from_json({**relay_body("r1").to_json(), "relay_key": bad})


# --- lifecycle ----------------------------------------------------------------------------------


def test_relay_without_heartbeat_goes_down_and_off_the_list_then_back() -> None:
    chain = Chain()  # heartbeat_timeout 4
    key = add_relay(chain, "r1")  # height 1
    stake(chain, key)
    assert listed(chain) == [hexkey(key)]
    chain.advance_to(6)
    assert ask(chain, f"/node?key={hexkey(key)}")["status"] == "DOWN"
    assert listed(chain) == []
    assert send(chain, Heartbeat(), key) == Code.OK
    assert [e["status"] for e in ask(chain, "/relays")["relays"]] == ["SERVING"]


def test_relay_leave_delists_and_frees_endpoint_and_key() -> None:
    chain = Chain()
    key = add_relay(chain, "r1")
    stake(chain, key)
    assert send(chain, Leave(), key) == Code.OK
    assert listed(chain) == []
    assert ask(chain, f"/node?key={hexkey(key)}")["status"] == "LEFT"
    body = relay_body("r2", endpoint=relay_body("r1").endpoint, key=x25519_of("r1"))
    assert send(chain, body, seeded_key("r2")) == Code.OK  # a new key for the same server


def test_unstaked_relay_expires_with_its_endpoint_and_key() -> None:
    chain = Chain(genesis={"registration_ttl": 3})
    key = add_relay(chain, "r1")  # height 1: checked at height 4
    chain.advance_to(4)
    assert query(chain.state, f"/node?key={hexkey(key)}", b"")[0] == Code.NOT_FOUND
    body = relay_body("r2", endpoint=relay_body("r1").endpoint, key=x25519_of("r1"))
    assert send(chain, body, seeded_key("r2")) == Code.OK


def test_relays_stay_out_of_compute_routes() -> None:
    chain = Chain()
    key = add_relay(chain, "r1")
    stake(chain, key)
    assert ask(chain, "/nodes?role=compute")["nodes"] == []
    assert [n["role"] for n in ask(chain, "/nodes")["nodes"]] == ["relay"]
    assert [p["model"] for p in ask(chain, "/pool_health")["pools"]] == []


# --- paging -------------------------------------------------------------------------------------


def test_relays_page_lists_every_listed_relay_once_in_bounded_pages() -> None:
    chain = Chain(genesis={"heartbeat_timeout": 100})  # all stay up while the test stakes
    keys = [add_relay(chain, f"r{i}") for i in range(9)]
    for i, key in enumerate(keys):
        if i % 3:  # every third relay stays unstaked: skipped, never ends the listing early
            stake(chain, key)
    expected = sorted(hexkey(k) for i, k in enumerate(keys) if i % 3)
    assert listed(chain) == expected
    for limit in (1, 2, 3, 4, 8, 9):
        assert listed(chain, limit) == expected
    page = ask(chain, "/relays?limit=2")
    assert page["next"] is not None and len(page["relays"]) <= 2
    assert ask(chain, "/relays?limit=100000")["next"] is None  # capped, not refused


def test_relays_bad_cursor_is_bad_query() -> None:
    chain = Chain()
    hostile = (
        "/relays?after=zz",
        "/relays?limit=-1",
        "/relays?after=" + "A" * 64,
        "/relays?limit=\u0661\u0662",  # Arabic-Indic digits
        "/relays?limit=" + "9" * 5000,
        "/relays?after=" + "a" * 100_000,
    )
    for path in hostile:
        assert query(chain.state, path, b"")[0] == Code.BAD_QUERY, path
    assert query(chain.state, "/relays", b"")[0] == 0  # and the app still answers


def test_relay_registration_is_deterministic_across_replicas() -> None:
    chains = [Chain(), Chain()]
    for chain in chains:
        key = add_relay(chain, "r1")
        stake(chain, key)
        send(chain, relay_body("r2", key=x25519_of("r1")), seeded_key("r2"))  # refused
    assert chains[0].state.app_hash == chains[1].state.app_hash
