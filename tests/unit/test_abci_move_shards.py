"""`move_shards` on the committee chain (abci_app/registry.py): a registered compute node changes
the shards it serves and its endpoint (rebalancing, node/agent/rebalance.py), keeping its key,
stake, reputation and status; the refusals each have their code, and a refused move changes
nothing."""

from __future__ import annotations

import pytest

from abci_app import schema
from abci_app.codes import Code
from abci_app.registry import MOVE_COOLDOWN_BLOCKS
from protocol.commit_batch import decode_tx
from protocol.committee.grammar import TxDecodeError
from protocol.committee.prices import SetPrice
from protocol.committee.registry import Leave, MoveShards
from tests.committee_chain import Chain
from tests.unit.test_abci_state import ask, hexkey, make_routable, node, register

pytestmark = pytest.mark.unit


def _move(chain: Chain, key: object, shards: tuple[int, ...], endpoint: str = "http://new") -> int:
    [result] = chain.block([chain.tx(MoveShards(shards, endpoint), key)])  # type: ignore[arg-type]
    return int(result.code)


def test_move_shards_changes_shards_and_endpoint_and_keeps_the_rest() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 3}}})
    key = register(chain, "mover", shards=(0,))
    make_routable(chain, key)
    before = node(chain, key)
    assert _move(chain, key, (2,)) == Code.OK
    after = node(chain, key)
    assert after["shards"] == [2] and after["endpoint"] == "http://new"
    for kept in ("status", "routable", "stake", "reputation", "evm_address", "model"):
        assert after[kept] == before[kept], kept
    listed = chain.state.committed(schema.NODE, hexkey(key))
    assert listed["moved_height"] == chain.state.height
    on_two = [n["key"] for n in ask(chain, "/nodes?shard=2")["nodes"]]
    on_zero = [n["key"] for n in ask(chain, "/nodes?shard=0")["nodes"]]
    assert hexkey(key) in on_two and hexkey(key) not in on_zero


def test_move_shards_refusals_have_their_codes_and_change_nothing() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 3}}})
    key = register(chain, "refused", shards=(1,))
    make_routable(chain, key)
    same = node(chain, key)
    assert _move(chain, key, (1,), same["endpoint"]) == Code.MOVE_UNCHANGED
    assert _move(chain, key, (3,)) == Code.MOVE_SHARD_UNKNOWN
    assert node(chain, key)["shards"] == [1]
    verifier = register(chain, "verifier", role="verifier")
    assert _move(chain, verifier, (2,)) == Code.WRONG_ROLE
    stranger = register(chain, "left")
    chain.block([chain.tx(Leave(), stranger)])
    assert _move(chain, stranger, (2,)) == Code.INVALID_LIFECYCLE


def test_move_shards_at_most_one_move_per_cooldown() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 3}}})
    key = register(chain, "flapper", shards=(0,))
    make_routable(chain, key)
    assert _move(chain, key, (1,)) == Code.OK
    moved = chain.state.height
    assert _move(chain, key, (0,)) == Code.MOVE_TOO_SOON
    assert node(chain, key)["shards"] == [1]
    chain.advance_to(moved + MOVE_COOLDOWN_BLOCKS - 1)
    assert _move(chain, key, (0,)) == Code.OK  # its block is moved + MOVE_COOLDOWN_BLOCKS
    assert node(chain, key)["shards"] == [0]


def test_move_shards_carries_the_price_to_the_new_shard() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 3}}})
    key = register(chain, "priced", shards=(0,))
    make_routable(chain, key)
    [priced] = chain.block([chain.tx(SetPrice("m", 0, 7), key)])
    assert priced.code == Code.OK
    record = chain.state.get(schema.PRICE, schema.price_key(hexkey(key), 0))
    [refused] = chain.block([chain.tx(SetPrice("m", 2, 7), key)])
    assert refused.code == Code.PRICE_SHARD  # not its shard yet
    assert _move(chain, key, (2,)) == Code.OK
    assert chain.state.get(schema.PRICE, schema.price_key(hexkey(key), 0)) is None
    assert chain.state.get(schema.PRICE, schema.price_key(hexkey(key), 2)) == record
    assert node(chain, key)["prices"] == {"2": 7}  # routable there with its price at once
    [changed] = chain.block([chain.tx(SetPrice("m", 2, 9), key)])
    assert changed.code == Code.OK


def test_move_shards_to_a_span_drops_the_prices_left() -> None:
    chain = Chain(genesis={"models": {"m": {"shards": 3}}})
    key = register(chain, "span", shards=(0,))
    make_routable(chain, key)
    chain.block([chain.tx(SetPrice("m", 0, 7), key)])
    assert _move(chain, key, (1, 2)) == Code.OK
    for shard in (0, 1, 2):
        assert chain.state.get(schema.PRICE, schema.price_key(hexkey(key), shard)) is None


def test_move_shards_without_a_model_count_in_genesis_takes_any_shard() -> None:
    chain = Chain()
    key = register(chain, "free", shards=(0,))
    assert _move(chain, key, (5,)) == Code.OK
    assert node(chain, key)["shards"] == [5] and node(chain, key)["status"] == "JOIN"


@pytest.mark.parametrize(
    "body",
    [
        {"shards": [], "endpoint": "http://x"},
        {"shards": [2, 1], "endpoint": "http://x"},
        {"shards": [1, 1], "endpoint": "http://x"},
        {"shards": [65536], "endpoint": "http://x"},
        {"shards": [1], "endpoint": ""},
        {"shards": [1], "endpoint": "http://x\n"},
        {"shards": [1]},
        {"shards": [1], "endpoint": "http://x", "extra": 1},
        # what a stranger sends: wrong types, non-ASCII digits, floats, bools, huge or nested
        {"shards": ["1"], "endpoint": "http://x"},
        {"shards": ["١"], "endpoint": "http://x"},
        {"shards": [1.0], "endpoint": "http://x"},
        {"shards": [True], "endpoint": "http://x"},
        {"shards": [-1], "endpoint": "http://x"},
        {"shards": 1, "endpoint": "http://x"},
        {"shards": [[1]], "endpoint": "http://x"},
        {"shards": list(range(100_000)), "endpoint": "http://x"},
        {"shards": [1], "endpoint": "http://" + "x" * 100_000},
        {"shards": [1], "endpoint": {"url": "http://x"}},
        {"shards": [1], "endpoint": 7},
    ],
)
def test_move_shards_malformed_bodies_are_refused_by_name(body: dict) -> None:
    with pytest.raises(TxDecodeError):
        MoveShards.from_json(body)


def test_move_shards_round_trips_through_the_envelope() -> None:
    chain = Chain()
    key = register(chain, "wire")
    raw = chain.tx(MoveShards((0, 1), "https://10.0.0.1:18101"), key)
    assert decode_tx(raw).body == MoveShards((0, 1), "https://10.0.0.1:18101")


def test_a_stranger_s_malformed_move_shards_is_refused_by_name_and_the_chain_goes_on() -> None:
    """Through the app's CheckTx: a body of the wrong shape is MALFORMED_TX, and the chain still
    takes the next valid move."""
    chain = Chain(genesis={"models": {"m": {"shards": 3}}})
    key = register(chain, "stranger", shards=(0,))
    make_routable(chain, key)
    raw = chain.tx(MoveShards((1,), "http://x"), key)
    bad = raw.replace(b'"shards":[1]', rb'"shards":["\u0661"]')
    assert bad != raw
    assert chain.machine.check_tx(bad).code == Code.MALFORMED_TX
    assert _move(chain, key, (2,)) == Code.OK
