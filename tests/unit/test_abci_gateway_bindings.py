"""Gateway bindings on the committee chain (`gateway` tx, abci_app/gateway_bindings.py): a key
binds its payee address under that address's EIP-712 signature, with no genesis change; forged,
replayed and front-run bindings are refused by name; a binding is released and re-bound; a
gateway reporting another gateway's query id never displaces that gateway's own report."""

from __future__ import annotations

from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from protocol.committee.gateways import GatewayBind, sign_binding
from protocol.committee.settlement import statement_number
from protocol.eip712 import address_of
from tests.committee_chain import (
    CHAIN_ID,
    COMMITTEE_ADDRESS,
    EVM_CHAIN_ID,
    Chain,
    seeded_evm_key,
    seeded_key,
)
from tests.unit.test_abci_settlement import (
    GATEWAY,
    GATEWAY_EVM,
    GATEWAY_EVM_KEY,
    Q1,
    ask,
    ask_code,
    bind_gateway,
    next_epoch_end,
    one,
    refused_codes,
    report,
    settled_chain,
    two_nodes,
)
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit

NEWCOMER = seeded_key("newcomer-gateway")  # not in genesis `gateways`
NEWCOMER_EVM_KEY = seeded_evm_key("newcomer-gateway")
NEWCOMER_EVM = address_of(NEWCOMER_EVM_KEY).lower()
THIEF = seeded_key("thief-gateway")
THIEF_EVM_KEY = seeded_evm_key("thief-gateway")
THIEF_EVM = address_of(THIEF_EVM_KEY).lower()


def body_for(
    evm_key: bytes, key: SigningKey, *, bound: bool = True, nonce: int = 1, **domain: Any
) -> GatewayBind:
    where = {
        "chain_id": CHAIN_ID,
        "evm_chain_id": EVM_CHAIN_ID,
        "committee_address": COMMITTEE_ADDRESS,
        **domain,
    }
    return sign_binding(evm_key, hexkey(key), bound=bound, nonce=nonce, **where)


def binding(chain: Chain, key: SigningKey) -> str | None:
    return ask(chain, f"/gateways?key={hexkey(key)}")["address"]


def test_a_fresh_key_binds_itself_and_is_paid_its_fees_without_a_genesis_change() -> None:
    chain = settled_chain()
    two_nodes(chain)
    [result] = chain.block([bind_gateway(chain, NEWCOMER, NEWCOMER_EVM_KEY)])
    assert result.code == Code.OK, result.log
    [event] = [dict(attrs) for kind, attrs in result.events if kind == "planet.gateway"]
    assert event == {
        "address": NEWCOMER_EVM,
        "bound": "true",
        "key": hexkey(NEWCOMER),
        "nonce": "1",
    }
    assert binding(chain, NEWCOMER) == NEWCOMER_EVM
    assert ask(chain, f"/gateways?address={NEWCOMER_EVM}")["binding"]["key"] == hexkey(NEWCOMER)
    assert ask(chain, "/gateways")["gateways"] == {
        hexkey(GATEWAY): GATEWAY_EVM,
        hexkey(NEWCOMER): NEWCOMER_EVM,
    }
    # its report is accepted; its fees are paid to its own address
    result = one(chain, report(queries=((Q1, 5),)), NEWCOMER)
    assert result.code == Code.OK and refused_codes(result) == []
    assert chain.state.get("squery", f"{Q1}/{NEWCOMER_EVM}")["gateway"] == NEWCOMER_EVM
    epoch = next_epoch_end(chain)
    view = ask(chain, f"/payouts?epoch={statement_number(epoch, 0)}")
    assert view["rows"] == [[NEWCOMER_EVM, "5"]] and view["query_ids"] == [Q1]


def test_an_unbound_key_cannot_report() -> None:
    chain = settled_chain()
    assert one(chain, report(queries=((Q1, 5),)), NEWCOMER).code == Code.UNKNOWN_GATEWAY


@pytest.mark.parametrize(
    ("label", "forge"),
    [
        ("signed by another EVM key", lambda: body_for(THIEF_EVM_KEY, NEWCOMER)),
        ("signed for another chain", lambda: body_for(NEWCOMER_EVM_KEY, NEWCOMER, chain_id="x")),
        (
            "signed for another committee",
            lambda: body_for(NEWCOMER_EVM_KEY, NEWCOMER, committee_address="0x" + "11" * 20),
        ),
        (
            "signed for another EVM chain",
            lambda: body_for(NEWCOMER_EVM_KEY, NEWCOMER, evm_chain_id=1),
        ),
        ("signed for another key", lambda: body_for(NEWCOMER_EVM_KEY, THIEF)),
    ],
)
def test_a_forged_binding_is_refused(label: str, forge: Any) -> None:
    chain = settled_chain()
    forged: GatewayBind = forge()
    # the forged signature claims NEWCOMER_EVM's consent for the key NEWCOMER
    claimed = GatewayBind(NEWCOMER_EVM, True, forged.nonce, forged.signature)
    result = one(chain, claimed, NEWCOMER)
    assert result.code == Code.GATEWAY_BINDING_INVALID, label
    assert binding(chain, NEWCOMER) is None


def test_a_front_runner_cannot_take_an_observed_binding() -> None:
    chain = settled_chain()
    honest = body_for(NEWCOMER_EVM_KEY, NEWCOMER)
    # the thief copies the observed body into its own tx, ahead of the honest one in the block
    stolen, rightful = chain.block(
        [chain.tx(honest, THIEF), bind_gateway(chain, NEWCOMER, NEWCOMER_EVM_KEY)]
    )
    assert stolen.code == Code.GATEWAY_BINDING_INVALID
    assert rightful.code == Code.OK
    assert binding(chain, THIEF) is None and binding(chain, NEWCOMER) == NEWCOMER_EVM


def test_release_rebind_and_replays() -> None:
    chain = settled_chain()
    assert one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER), NEWCOMER).code == Code.OK
    # a second bind of the same key, or of its address to another key: release first
    again = one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER, nonce=2), NEWCOMER)
    assert again.code == Code.GATEWAY_ALREADY_BOUND
    other = one(chain, body_for(THIEF_EVM_KEY, NEWCOMER), NEWCOMER)
    assert other.code == Code.GATEWAY_ALREADY_BOUND
    taken = one(chain, body_for(NEWCOMER_EVM_KEY, THIEF, nonce=2), THIEF)
    assert taken.code == Code.GATEWAY_ALREADY_BOUND
    # release: the address signs it; the nonce must rise
    stale = one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER, bound=False, nonce=1), NEWCOMER)
    assert stale.code == Code.GATEWAY_BINDING_REPLAYED
    released = one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER, bound=False, nonce=2), NEWCOMER)
    assert released.code == Code.OK
    assert binding(chain, NEWCOMER) is None
    assert one(chain, report(queries=((Q1, 5),)), NEWCOMER).code == Code.UNKNOWN_GATEWAY
    twice = one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER, bound=False, nonce=3), NEWCOMER)
    assert twice.code == Code.GATEWAY_NOT_BOUND
    # the first binding replayed after the release: refused (its nonce is spent)
    replayed = one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER, nonce=1), NEWCOMER)
    assert replayed.code == Code.GATEWAY_BINDING_REPLAYED
    # the same tx bytes again: the envelope's nonce refuses them
    raw = bind_gateway(chain, THIEF, THIEF_EVM_KEY)
    assert [r.code for r in chain.block([raw])] == [Code.OK]
    assert chain.block([raw])[0].code == Code.BAD_NONCE
    # the address may now bind another key, with a fresh nonce
    moved = one(chain, body_for(NEWCOMER_EVM_KEY, GATEWAY, nonce=4), GATEWAY)
    assert moved.code == Code.GATEWAY_ALREADY_BOUND  # GATEWAY is still bound to its own
    assert one(chain, body_for(NEWCOMER_EVM_KEY, NEWCOMER, nonce=4), NEWCOMER).code == Code.OK


def test_a_gateway_reporting_anothers_query_never_displaces_its_report() -> None:
    chain = settled_chain(bindings={GATEWAY: GATEWAY_EVM_KEY, THIEF: THIEF_EVM_KEY})
    # the thief reports the other gateway's deposit first, even at another fee
    assert refused_codes(one(chain, report(queries=((Q1, 9),)), THIEF)) == []
    assert refused_codes(one(chain, report(queries=((Q1, 5),)), GATEWAY)) == []
    epoch = next_epoch_end(chain)
    views = [ask(chain, f"/payouts?epoch={statement_number(epoch, p)}") for p in range(2)]
    # each on its own page, paid to its own address: the escrow posts only the page whose
    # payee the deposit names (the thief's page reverts WrongGatewayQuery there)
    assert sorted((v["rows"][0][0], v["query_ids"], v["fees"]) for v in views) == sorted(
        [(THIEF_EVM, [Q1], ["9"]), (GATEWAY_EVM, [Q1], ["5"])]
    )


def test_the_bound_keys_are_listed_a_page_at_a_time() -> None:
    """Binding is free, so `/gateways` without a key or an address answers a page of at most
    `limit` bound keys in key order after `after`, and `next` to go on (before: every binding
    in one answer)."""
    chain = settled_chain()
    results = chain.block(
        [bind_gateway(chain, NEWCOMER, NEWCOMER_EVM_KEY), bind_gateway(chain, THIEF, THIEF_EVM_KEY)]
    )
    assert [r.code for r in results] == [Code.OK, Code.OK]
    every = {hexkey(GATEWAY): GATEWAY_EVM, hexkey(NEWCOMER): NEWCOMER_EVM, hexkey(THIEF): THIEF_EVM}
    assert ask(chain, "/gateways") == {"gateways": every, "next": None}
    keys = sorted(every)
    first = ask(chain, "/gateways?limit=2")
    assert first == {"gateways": {k: every[k] for k in keys[:2]}, "next": keys[1]}
    rest = ask(chain, f"/gateways?limit=2&after={first['next']}")
    assert rest == {"gateways": {keys[2]: every[keys[2]]}, "next": None}
    assert ask(chain, f"/gateways?after={keys[2]}") == {"gateways": {}, "next": None}
    assert ask_code(chain, "/gateways?after=nothex") == Code.BAD_QUERY
