"""Credits that hold (issue 42): a node's redemptions are paid at face value less the verifiers'
cut, so self-dealing returns (1 − cut) of what it paid, never more (abci_app/node_payouts.py,
settlement.py `close`; docs/credits.md *Self-dealing returns (1 − cut) of what it paid*).

Before, the close split the whole draw by weighted shares with the scarcity bonus: a node alone
on its shard (5x) that bought X credits and redeemed them itself took X·5/(W + X·5) of the
epoch's draw, paid by the other nodes' payers (M = W = X = 100: 167 for 100 paid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from abci_app import schema, settlement
from abci_app.codes import Code
from shares.payouts import net_of_cut
from tests.committee_chain import Chain
from tests.credit_chain import ensure_key
from tests.unit.test_abci_settlement import (
    CREDIT_LAYER_TOKENS,
    ESCROW,
    evm_of,
    next_epoch_end,
    redeemed,
    rows,
    settled_chain,
)
from tests.unit.test_abci_state import make_routable, register

pytestmark = pytest.mark.unit

PRICE = 10**12
CUT = 1_000  # the genesis default


def _nodes(chain: Chain, tmp_path: Path) -> dict[str, SigningKey]:
    """A alone on shard 0 (the old 5x); B, C, D on shard 1 (three of them: the old 1x)."""
    ensure_key(chain, tmp_path)
    keys = {"a": register(chain, "self-a", shards=(0,))}
    keys.update({x: register(chain, f"self-{x}", shards=(1,)) for x in "bcd"})
    for key in keys.values():
        make_routable(chain, key)
    return keys


def _epoch(tmp_path: Path, own: int, others: tuple[int, int, int]) -> dict[str, int]:
    """One epoch on a fresh chain: A redeems `own` credits (bought with its own money: a
    credit is bearer, the chain cannot tell who bought it), B, C, D `others`; the close's pool
    rows by node label."""
    chain = settled_chain()
    keys = _nodes(chain, tmp_path)
    shares = {keys[x]: (1, n) for x, n in zip("bcd", others, strict=True)}
    if own:
        shares[keys["a"]] = (0, own)
    results = redeemed(chain, tmp_path, shares)
    assert [r.code for r in results] == [Code.OK] * (2 * len(shares)), [r.log for r in results]
    epoch = next_epoch_end(chain)
    paid = rows(chain, epoch)
    return {x: paid.get(evm_of(f"self-{x}"), 0) for x in "abcd"}


@pytest.mark.parametrize(
    ("own", "others"),
    [
        (4, (1, 1, 2)),  # M = W = X = 4: before, A took 8·20/24 = 6.67 credits' price
        (50, (16, 17, 17)),  # M = W = X = 50: before 83.3 for 50 paid (B, C, D 16.7 of 50)
        (6, (10, 10, 10)),  # other payers' money M = 30 large next to X
    ],
)
def test_a_lone_node_self_dealing_gets_back_at_most_what_it_paid_less_the_cut(
    tmp_path: Path, own: int, others: tuple[int, int, int]
) -> None:
    dealt = _epoch(tmp_path / "dealt", own, others)
    paid = own * PRICE
    assert dealt["a"] <= paid * (10_000 - CUT) // 10_000 < paid
    assert dealt["a"] == net_of_cut(paid, CUT)
    # the other nodes' rows are what they are without A's self-dealing: it funds nothing
    honest = _epoch(tmp_path / "honest", 0, others)
    assert honest["a"] == 0
    assert {x: dealt[x] for x in "bcd"} == {x: honest[x] for x in "bcd"}
    assert [dealt[x] for x in "bcd"] == [net_of_cut(n * PRICE, CUT) for n in others]


# --- random epochs through the close ----------------------------------------------------------


def _address(role: str, index: int) -> str:
    return "0x" + f"{role}{index:02x}".rjust(40, "0")


_COUNTS = st.lists(st.integers(1, 5_000), max_size=4)


@st.composite
def _epochs(draw: Any) -> dict[str, Any]:
    nodes = draw(_COUNTS)
    relays = draw(_COUNTS)
    verifiers = draw(st.lists(st.integers(0, 50), max_size=3))
    accounts = [_address("a", i) for i in range(len(nodes))]
    accounts += [_address("b", i) for i in range(len(relays))]
    accounts += [_address("c", i) for i in range(len(verifiers))]
    face = (sum(nodes) + sum(relays)) * (price := draw(st.sampled_from([1, 7, 10**12, 999_983])))
    extra = draw(st.integers(0, 10**6))  # due from before, not drawn then
    return {
        "price": price,
        "cut": draw(st.sampled_from([0, 1, 1_000, 3_333, 9_999, 10_000])),
        "nodes": nodes,
        "relays": relays,
        "verifiers": verifiers,
        "slashed": draw(st.sets(st.sampled_from(accounts))) if accounts else set(),
        "extra": extra,
        # the pool holds it all (mostly), or falls short (purchases of this close on top)
        "pool": draw(
            st.one_of(
                st.integers(face + extra, face + extra + 10),
                st.integers(0, face + extra),
            )
        ),
        "purchases": draw(st.lists(st.integers(1, 10**6), max_size=3)),
    }


def _close(epoch_input: dict[str, Any], relay_role: str = "b") -> tuple[Any, int, dict[str, int]]:
    """Close epoch 3 of a chain holding `epoch_input`'s records (relay i's account:
    `_address(relay_role, i)`); (state, epoch, written)."""
    price, cut = epoch_input["price"], epoch_input["cut"]
    chain = settled_chain(
        bindings={},
        verifier_cut_bps=cut,
        credits={"price_wei": str(price), "layer_tokens": CREDIT_LAYER_TOKENS},
    )
    length = chain.state.genesis.epoch_length
    epoch = 3
    chain.advance_to(epoch * length - 1)
    state = chain.state
    state.begin_block(epoch * length, b"\x00" * 32, chain.time_s)
    face = 0
    for i, count in enumerate(epoch_input["nodes"]):
        account = _address("a", i)
        # two records for a node with credits on two shards (one row for both)
        for shard, part in enumerate((count // 2, count - count // 2)):
            if part:
                record = {"account": account, "model": "m", "shard": shard, "credits": part}
                state.put(
                    schema.CREDIT,
                    schema.credit_key(epoch, account, "m", shard),
                    {**record, "layer_tokens": part * CREDIT_LAYER_TOKENS},
                )
        face += count * price
    for i, count in enumerate(epoch_input["relays"]):
        account = _address(relay_role, i)
        state.put(
            schema.RELAY_PAY,
            schema.in_epoch(epoch, account),
            {"account": account, "credits": count},
        )
        face += count * price
    for i, checks in enumerate(epoch_input["verifiers"]):
        state.put(schema.SPOT_CREDIT, schema.in_epoch(epoch, _address("c", i)), checks)
    for account in sorted(epoch_input["slashed"]):
        state.put(schema.SLASHED, schema.in_epoch(epoch, account), ["failed_verification"])
    for i, amount in enumerate(epoch_input["purchases"]):
        key = schema.charge_key(_address("d", i), ESCROW, "mint", f"p{i}")
        state.put(schema.PENDING_CHARGE, key, {"from": "0", "total": str(amount), "height": 1})
    due = face + epoch_input["extra"]
    if due:
        state.put(schema.CREDIT_DUE, schema.epoch_key(epoch), str(due))
    state.put(schema.CREDIT_POOL, schema.POOL_BALANCE, str(epoch_input["pool"]))
    settlement.close(state, epoch * length)
    return state, epoch, {"due": due}


def _pages(state: Any, epoch: int) -> list[dict[str, Any]]:
    start, stop = schema.epoch_range(epoch)
    page0 = state.get(schema.PAYOUT, schema.epoch_key(epoch))
    others = [record for _, record in state.items(schema.PAYOUT, start, stop)]
    return [page0, *others] if page0 is not None else others


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_epochs())
def test_random_epochs_every_wei_drawn_is_paid_and_nothing_created_or_lost(
    epoch_input: dict[str, Any],
) -> None:
    state, epoch, written = _close(epoch_input)
    price, cut, slashed = epoch_input["price"], epoch_input["cut"], epoch_input["slashed"]
    pages = _pages(state, epoch)
    drawn = bought = 0
    paid: dict[str, int] = {}
    for page in pages:
        assert page["gateways"] == [ESCROW] * len(page["gateways"])  # pool pages only here
        for payer, debit in zip(page["payers"], page["debits"], strict=True):
            if payer == ESCROW:
                drawn += int(debit)
            else:
                bought += int(debit)
        page_rows = [(account, int(amount)) for account, amount in page["rows"]]
        # each pool page's rows sum to its own total, ascending by account, amounts > 0
        assert sum(a for _, a in page_rows) == int(page["total"])
        assert [a for a, _ in page_rows] == sorted({a for a, _ in page_rows})
        assert all(amount > 0 for _, amount in page_rows)
        for account, amount in page_rows:
            paid[account] = paid.get(account, 0) + amount
    assert bought == sum(epoch_input["purchases"])
    # Σ rows == the draw; the pool moved by exactly that; what was not drawn is still due,
    # but for the slashed accounts' credits, which stay in the pool
    assert sum(paid.values()) == drawn
    pool = int(state.get(schema.CREDIT_POOL, schema.POOL_BALANCE))
    assert pool == epoch_input["pool"] + bought - drawn >= 0
    forfeit = sum(
        count * price
        for role, counts in (("a", epoch_input["nodes"]), ("b", epoch_input["relays"]))
        for i, count in enumerate(counts)
        if _address(role, i) in slashed
    )
    due_after = int(state.get(schema.CREDIT_DUE, schema.epoch_key(epoch + 1)) or 0)
    assert drawn + due_after + forfeit == written["due"]
    # a slashed account gets nothing
    assert not slashed & paid.keys()
    nodes = {
        _address("a", i): net_of_cut(count * price, cut)
        for i, count in enumerate(epoch_input["nodes"])
        if _address("a", i) not in slashed
    }
    relays = {
        _address("b", i): count * price
        for i, count in enumerate(epoch_input["relays"])
        if _address("b", i) not in slashed
    }
    verifiers = {
        _address("c", i)
        for i, checks in enumerate(epoch_input["verifiers"])
        if checks and _address("c", i) not in slashed
    }
    assert paid.keys() <= nodes.keys() | relays.keys() | verifiers
    for account in nodes.keys() | relays.keys():  # never above its credits' price (less cut)
        assert paid.get(account, 0) <= nodes.get(account, 0) + relays.get(account, 0)
    available = epoch_input["pool"] + bought
    owed = written["due"] - forfeit
    if not (nodes or relays) or available < sum(nodes.values()) + sum(relays.values()):
        return  # nothing to draw, or the pool falls short (the relays, then the nodes)
    # the pool covers the rows: each node its credits less the cut, each relay its price …
    assert {a: paid.get(a, 0) for a in nodes if nodes[a]} == {a: v for a, v in nodes.items() if v}
    assert {a: paid.get(a, 0) for a in relays} == relays
    # … and the verifiers exactly the rest: the cut of the nodes' credits, rounding included,
    # and what was due from before (all of it when the pool holds it, else what it holds)
    to_verifiers = sum(paid.get(a, 0) for a in verifiers)
    rest = min(owed, available) - sum(nodes.values()) - sum(relays.values())
    if verifiers and rest:
        assert to_verifiers == rest
    else:  # no eligible verifier: their part is not drawn, it stays due to the next epoch
        assert to_verifiers == 0 and due_after == owed - drawn


def test_a_relay_and_a_node_of_one_account_get_one_row_for_both() -> None:
    """A relay's staking address may be a node's EVM address too: one row, its relay credits at
    the price and its node credits at the price less the cut."""
    epoch_input = {
        "price": PRICE,
        "cut": CUT,
        "nodes": [3],
        "relays": [2],
        "verifiers": [],
        "slashed": set(),
        "extra": 0,
        "pool": 5 * PRICE,
        "purchases": [],
    }
    state, epoch, _ = _close(epoch_input, relay_role="a")
    [page] = _pages(state, epoch)
    assert page["rows"] == [[_address("a", 0), str(2 * PRICE + net_of_cut(3 * PRICE, CUT))]]
    assert int(page["total"]) == 2 * PRICE + net_of_cut(3 * PRICE, CUT)
