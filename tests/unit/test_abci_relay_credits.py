"""Relays paid from credits on the committee state machine (abci_app/relay_credits.py, issue 43):
a registered relay redeems the credits users paid it with; one spent set with the nodes, so a
credit is paid once to one party, whichever redeems first; forged, foreign, locked and
duplicated credits are refused by name; only a relay's key may use the relay form."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from abci_app import schema
from abci_app.codes import Code
from abci_app.genesis import DEFAULT_RELAY_BYTES, Genesis
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_locks import CreditLock
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import Leave
from protocol.committee.relay_credits import RelayRedeem
from protocol.errors import ConfigError
from protocol.paid_credits import spent_id
from tests.committee_chain import seeded_key
from tests.credit_chain import epoch_now, minted, node_chain, redeem, send
from tests.unit.test_abci_relays import add_relay
from tests.unit.test_abci_state import ask, hexkey

pytestmark = pytest.mark.unit


def earned(chain, relay) -> int:  # type: ignore[no-untyped-def]
    answer = ask(chain, f"/relay_credits?key={hexkey(relay)}")
    return sum(row["credits"] for row in answer["epochs"])


def test_a_relay_redeems_once_and_the_credit_is_spent_for_every_node_and_relay(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path, credits_extra={"relay_bytes": 16})
    first, second = add_relay(chain, "pay-r1"), add_relay(chain, "pay-r2")
    credits, _ = minted(chain, tmp_path, count=3)
    done = send(chain, RelayRedeem(tuple(credits[:2])), first)
    assert done.code == Code.OK, done.log
    assert earned(chain, first) == 2
    answer = ask(chain, f"/relay_credits?key={hexkey(first)}")
    assert answer["evm_address"] and [row["credits"] for row in answer["epochs"]] == [2]
    assert chain.state.get(schema.CREDIT_SPENT, spent_id(credits[0])) is not None
    # the same credit again: to the relay itself, to another relay, to a node, locked by a node
    again = send(chain, RelayRedeem((credits[0],)), first)
    assert again.code == Code.CREDIT_SPENT and "credit 0" in again.log
    assert send(chain, RelayRedeem((credits[1],)), second).code == Code.CREDIT_SPENT
    assert redeem(chain, node, [credits[0]]).code == Code.CREDIT_SPENT
    lock = CreditLock("m", 0, ((spent_id(credits[1]), epoch_now(chain)),))
    assert send(chain, lock, node).code == Code.CREDIT_SPENT
    assert earned(chain, second) == 0 and earned(chain, first) == 2
    # the third, never given to a relay, still pays the node
    assert redeem(chain, node, [credits[2]]).code == Code.OK
    assert send(chain, RelayRedeem((credits[2],)), second).code == Code.CREDIT_SPENT


def test_a_credit_a_node_locked_or_redeemed_is_refused_to_a_relay_by_name(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path)
    relay = add_relay(chain, "pay-r3")
    credits, _ = minted(chain, tmp_path, count=3)
    lock = CreditLock("m", 0, ((spent_id(credits[0]), epoch_now(chain)),))
    assert send(chain, lock, node).code == Code.OK
    locked = send(chain, RelayRedeem((credits[0],)), relay)
    assert locked.code == Code.CREDIT_LOCKED and "locked by node" in locked.log
    assert redeem(chain, node, [credits[1]]).code == Code.OK
    assert send(chain, RelayRedeem((credits[1],)), relay).code == Code.CREDIT_SPENT
    # a whole tx is refused on one bad item: the good credit beside it is not spent
    mixed = send(chain, RelayRedeem((credits[2], credits[1])), relay)
    assert mixed.code == Code.CREDIT_SPENT and "credit 1" in mixed.log
    assert chain.state.get(schema.CREDIT_SPENT, spent_id(credits[2])) is None
    assert earned(chain, relay) == 0


def test_forged_and_duplicated_credits_and_the_wrong_signer_are_refused_by_name(
    tmp_path: Path,
) -> None:
    chain, node = node_chain(tmp_path)
    relay = add_relay(chain, "pay-r4")
    credits, _ = minted(chain, tmp_path, count=2)
    forged = ThresholdCredit(credits[0].period, b"\x07" * 32, credits[0].signature)
    refused = send(chain, RelayRedeem((credits[1], forged)), relay)
    assert refused.code == Code.CREDIT_INVALID and "credit 1" in refused.log
    future = replace(credits[0], period=credits[0].period + 5)
    assert send(chain, RelayRedeem((future,)), relay).code == Code.CREDIT_EPOCH
    twice = send(chain, RelayRedeem((credits[0], credits[0])), relay)
    assert twice.code == Code.CREDIT_SPENT
    # a compute node's key is not a relay's; nor is a key never registered
    assert send(chain, RelayRedeem((credits[0],)), node).code == Code.WRONG_ROLE
    stranger = seeded_key("pay-stranger")
    assert send(chain, RelayRedeem((credits[0],)), stranger).code == Code.UNKNOWN_NODE
    assert send(chain, Leave(), relay).code == Code.OK
    assert send(chain, RelayRedeem((credits[0],)), relay).code == Code.INVALID_LIFECYCLE
    assert earned(chain, relay) == 0
    # nothing of it spent: the credits still pay their node
    assert redeem(chain, node, credits).code == Code.OK


def test_the_relay_redeem_tx_grammar_is_strict() -> None:
    with pytest.raises(TxDecodeError, match=r"body\.credits"):
        RelayRedeem.from_json({"credits": []})
    with pytest.raises(TxDecodeError):
        RelayRedeem.from_json({"credits": ["ab" * 88], "model": "m"})
    with pytest.raises(TxDecodeError):
        RelayRedeem.from_json({"credits": ["zz" * 88]})
    with pytest.raises(TxDecodeError):
        RelayRedeem.from_json({"credits": ["00" * 88] * 65})


def test_the_relay_rate_is_a_genesis_parameter_answered_by_credit_keys(tmp_path: Path) -> None:
    chain, _ = node_chain(tmp_path, credits_extra={"relay_bytes": 16})
    assert ask(chain, "/credit_keys")["relay_bytes"] == 16
    plain = Genesis.parse(b'{"credits": {"price_wei": "1", "layer_tokens": 1}}')
    assert plain.credit_relay_bytes == DEFAULT_RELAY_BYTES
    assert "relay_bytes" not in plain.to_json()["credits"]
    assert (
        Genesis.parse(
            b'{"credits": {"price_wei": "1", "layer_tokens": 1, "relay_bytes": 16}}'
        ).to_json()["credits"]["relay_bytes"]
        == 16
    )
    with pytest.raises(ConfigError, match="relay_bytes"):
        Genesis.parse(b'{"credits": {"price_wei": "1", "layer_tokens": 1, "relay_bytes": 0}}')
