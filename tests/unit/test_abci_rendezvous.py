"""A node behind NAT names its rendezvous relays in `register_node` (protocol/committee/registry.py
`Rendezvous`, abci_app/registry.py): each must be a registered relay, the address at that
relay's IP; at most 3, distinct; a registration without the field encodes and is stored exactly as
before."""

from __future__ import annotations

import dataclasses

import pytest

from abci_app.codes import Code
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import RegisterNode, Rendezvous
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_relays import add_relay, relay_body, send
from tests.unit.test_abci_state import ask, hexkey, register_body

pytestmark = pytest.mark.unit


def _nat_node(label: str, *entries: Rendezvous) -> RegisterNode:
    body = register_body(label)
    endpoint = entries[0].endpoint if entries else body.endpoint
    return dataclasses.replace(body, endpoint=endpoint, rendezvous=tuple(entries))


def test_node_names_a_registered_relay_and_its_record_says_so() -> None:
    chain = Chain()
    relay = add_relay(chain, "r1", endpoint="http://203.0.113.7:9100")
    entry = Rendezvous(hexkey(relay), "https://203.0.113.7:44001")
    assert send(chain, _nat_node("n1", entry), seeded_key("n1")) == Code.OK
    view = ask(chain, f"/node?key={hexkey(seeded_key('n1'))}")
    assert view["endpoint"] == "https://203.0.113.7:44001"
    assert view["rendezvous"] == [{"endpoint": "https://203.0.113.7:44001", "relay": hexkey(relay)}]


def test_rendezvous_at_a_key_that_is_not_a_relay_is_refused_by_name() -> None:
    chain = Chain()
    assert send(chain, register_body("n0"), seeded_key("n0")) == Code.OK  # a node, not a relay
    for key in (hexkey(seeded_key("n0")), "ab" * 32):
        entry = Rendezvous(key, "https://203.0.113.7:44001")
        assert send(chain, _nat_node("n1", entry), seeded_key("n1")) == Code.RENDEZVOUS_NOT_RELAY
    assert "rendezvous" not in ask(chain, f"/node?key={hexkey(seeded_key('n0'))}")


def test_rendezvous_at_another_address_than_the_relays_is_refused_by_name() -> None:
    chain = Chain()
    relay = add_relay(chain, "r1", endpoint="http://203.0.113.7:9100")
    entry = Rendezvous(hexkey(relay), "https://198.51.100.9:44001")  # someone else's server
    assert send(chain, _nat_node("n1", entry), seeded_key("n1")) == Code.RENDEZVOUS_ENDPOINT


def test_rendezvous_field_is_strict_and_bounded() -> None:
    body = _nat_node("n1", Rendezvous("ab" * 32, "https://203.0.113.7:44001")).to_json()
    assert RegisterNode.from_json(body).rendezvous[0].relay == "ab" * 32
    entry = {"endpoint": "https://203.0.113.7:44001", "relay": "ab" * 32}
    for bad in (
        [],  # absent means none; an empty list is not a second spelling of it
        [entry, entry],  # one relay twice
        [{**entry, "relay": f"{i:064x}"} for i in range(4)],  # more than 3
        [{**entry, "endpoint": "https://relay.example:44001"}],  # not an IP literal
        [{**entry, "endpoint": "https://203.0.113.7:044001"}],  # not canonical
        [{**entry, "extra": 1}],
        [{"relay": "AB" * 32, "endpoint": entry["endpoint"]}],
        "ab" * 32,
    ):
        with pytest.raises(TxDecodeError):
            RegisterNode.from_json({**body, "rendezvous": bad})


def test_registration_without_rendezvous_encodes_as_before() -> None:
    body = register_body("n1")
    assert "rendezvous" not in body.to_json()
    assert RegisterNode.from_json(body.to_json()) == body


def test_rendezvous_registration_is_deterministic_across_replicas() -> None:
    chains = [Chain(), Chain()]
    for chain in chains:
        relay = add_relay(chain, "r1", endpoint="http://203.0.113.7:9100")
        send(chain, relay_body("r2", endpoint="http://203.0.113.8:9100"), seeded_key("r2"))
        good = Rendezvous(hexkey(relay), "https://203.0.113.7:44001")
        send(chain, _nat_node("n1", good), seeded_key("n1"))
        send(chain, _nat_node("n2", Rendezvous("cd" * 32, good.endpoint)), seeded_key("n2"))
    assert chains[0].state.app_hash == chains[1].state.app_hash
