"""Mints strangers cannot flood (issue 42, attacks 2 and 3) on the committee state machine: a
payer holds at most `credits.max_pending_mints` unfunded mints, so junk of its own can no longer
bury its in-flight mint; `/mints` pages completely (a cursor, no silent cap), so 1,000+ junk
mints with ids ground below an honest one no longer hide it from the watchers; and returning
buyers' waiting mints list ahead of every new payer's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from abci_app.codes import Code
from abci_app.genesis import DEFAULT_MAX_PENDING_MINTS, Genesis
from node.client.mint_request import MintRequest
from protocol.errors import ConfigError
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.credit_chain import NOW, PAYER, PRICE, credit_chain, fund, period_key, send
from tests.mint_flood import junk_mint
from tests.unit.test_abci_settlement import ESCROW, ask

pytestmark = pytest.mark.unit

JUNK_SENDER = seeded_key("junk-sender")


def flood_chain(tmp: Path, **credits: object) -> Chain:
    """A chain selling credits, its first key period's key formed (a period of 1,000 blocks:
    every mint below lands in it), at the end of the first 40-block epoch."""
    chain = credit_chain(tmp, period_blocks=1000, credits_extra=credits, epoch_length=40)
    chain.advance_to(40)
    return chain


def honest_mint(chain: Chain, payer: bytes = PAYER, above: str = "0x8") -> MintRequest:
    """A one-credit mint by `payer` whose id is at least `above` (redrawn until it is), sent."""
    key = period_key(chain)
    while True:
        request = MintRequest.create(key, 1, payer, PRICE, EVM_CHAIN_ID, ESCROW, NOW + 3600)
        if request.mint_id >= above:
            break
    assert send(chain, request.body).code == Code.OK
    return request


def flood(
    chain: Chain, payers: list[bytes], per_payer: int, below: str = "0x8", seed: int = 0
) -> tuple[list[str], list[Code]]:
    """`per_payer` junk mints of each payer in one block, ids below `below`, drawn from `seed`
    (another seed for each flood of one payer in one key period): (ids, codes)."""
    period = period_key(chain).period
    ids, txs = [], []
    for index, payer in enumerate(payers):
        for n in range(per_payer):
            identifier, body = junk_mint(
                period,
                payer,
                PRICE,
                EVM_CHAIN_ID,
                ESCROW,
                NOW + 3600,
                seed + index * 4096 + n,
                below,
            )
            ids.append(identifier)
            txs.append(chain.tx(body, JUNK_SENDER))
    results = chain.block(txs)
    assert len(results) == len(txs)
    return ids, [Code(r.code) for r in results]


def strangers(count: int, label: str = "stranger") -> list[bytes]:
    return [seeded_evm_key(f"{label}-{i}") for i in range(count)]


def pages(chain: Chain, path: str, limit: int | None = None) -> list[list[dict[str, Any]]]:
    """Every page of a `/mints` list, following `next` (bounded: 100 pages)."""
    out: list[list[dict[str, Any]]] = []
    after: str | None = None
    for _ in range(100):
        query = path + ("" if limit is None else f"&limit={limit}")
        answer = ask(chain, query + ("" if after is None else f"&after={after}"))
        out.append(answer["mints"])
        after = answer["next"]
        if after is None:
            return out
    raise AssertionError("more than 100 pages")


def ids_of(listing: list[list[dict[str, Any]]]) -> list[str]:
    return [m["id"] for page in listing for m in page]


# --- attack 3: junk mints no longer hide an honest purchase from the watchers ------------------


def test_1200_junk_mints_ground_below_an_honest_one_do_not_hide_it_from_the_pending_list(
    tmp_path: Path,
) -> None:
    chain = flood_chain(tmp_path)
    honest = honest_mint(chain)
    junk, codes = flood(chain, strangers(300), 4)  # 4 each: the most a payer may hold
    assert codes == [Code.OK] * 1200
    assert all(j < honest.mint_id for j in junk)  # the old first 1,000 by id: junk only
    listing = pages(chain, "/mints?pending=true")
    assert len(listing) == 2 and len(listing[0]) == 1000  # no silent cap: a second page
    listed = ids_of(listing)
    assert len(listed) == len(set(listed)) == 1201  # each mint exactly once
    assert set(listed) == {*junk, honest.mint_id}


def test_pages_list_each_waiting_mint_once_while_others_are_funded_between_pages(
    tmp_path: Path,
) -> None:
    chain = flood_chain(tmp_path)
    junk, _ = flood(chain, strangers(40), 3, below="0x" + "f" * 64)
    seen: list[str] = []
    after: str | None = None
    funded: list[str] = []
    while True:
        answer = ask(chain, "/mints?pending=true&limit=7" + (f"&after={after}" if after else ""))
        seen += [m["id"] for m in answer["mints"]]
        assert all(m["buyer"] is False for m in answer["mints"])
        if answer["next"] is None:
            break
        after = answer["next"]
        # a mint not listed yet is funded meanwhile: it leaves the list, nothing is repeated
        later = sorted(set(junk) - set(seen) - set(funded))
        if later:
            fund(chain, later[-1])
            funded.append(later[-1])
    assert len(seen) == len(set(seen))
    assert set(seen) == set(junk) - set(funded) and funded


def test_a_returning_buyers_mint_lists_first_ahead_of_any_number_of_new_payers(
    tmp_path: Path,
) -> None:
    chain = flood_chain(tmp_path)
    first = honest_mint(chain)
    fund(chain, first.mint_id)  # the payer bought before: a returning buyer
    again = honest_mint(chain, above="0xf")
    _, codes = flood(chain, strangers(300), 4, below="0x1")  # ids ground to 0x0…
    assert codes == [Code.OK] * 1200
    page = ask(chain, "/mints?pending=true")
    assert page["mints"][0]["id"] == again.mint_id and page["mints"][0]["buyer"] is True
    assert all(m["buyer"] is False for m in page["mints"][1:]) and page["next"] is not None


# --- attack 2: a payer's own junk no longer hides its in-flight mint ------------------------------


def test_a_payer_cannot_bury_its_in_flight_mint_under_1000_junk_mints(tmp_path: Path) -> None:
    chain = flood_chain(tmp_path)
    in_flight = honest_mint(chain)
    fund(chain, in_flight.mint_id)  # funded, not yet debited: in flight
    junk, codes = flood(chain, [PAYER], 1000, below="0x1")
    limit = DEFAULT_MAX_PENDING_MINTS
    assert codes == [Code.OK] * limit + [Code.MINT_PENDING_LIMIT] * (1000 - limit)
    payer = junk_payer = ask(chain, f"/mints?id={junk[0]}")["payer"]
    assert junk_payer == payer
    listed = ids_of(pages(chain, f"/mints?payer={payer}"))
    assert sorted(listed) == sorted([in_flight.mint_id, *junk[:limit]])
    limited = ids_of(pages(chain, f"/mints?payer={payer}", limit=2))
    assert limited == sorted(listed) and len(limited) == len(set(limited))  # by id, once each


def test_the_pending_bound_frees_a_slot_on_funding_and_when_a_mint_lapses(tmp_path: Path) -> None:
    chain = flood_chain(tmp_path, max_pending_mints=2)
    waiting, codes = flood(chain, [PAYER], 3)
    assert codes == [Code.OK, Code.OK, Code.MINT_PENDING_LIMIT]
    fund(chain, waiting[0])
    _, codes = flood(chain, [PAYER], 2, seed=1 << 20)  # the funded one no longer counts
    assert codes == [Code.OK, Code.MINT_PENDING_LIMIT]
    chain.advance_to(chain.state.height + 40)  # the next epoch: the first epoch's still count
    _, codes = flood(chain, [PAYER], 1, seed=2 << 20)
    assert codes == [Code.MINT_PENDING_LIMIT]
    chain.advance_to(chain.state.height + 40)  # past their funding window: lapsed
    _, codes = flood(chain, [PAYER], 3, seed=3 << 20)
    assert codes == [Code.OK, Code.OK, Code.MINT_PENDING_LIMIT]
    other, _ = flood(chain, strangers(1, "other-payer"), 1)  # the bound is per payer
    assert ask(chain, f"/mints?id={other[0]}")["funded_height"] is None


def test_the_pending_bound_is_a_checked_genesis_parameter() -> None:
    def parse(credits: dict[str, object]) -> Genesis:
        return Genesis.parse(json.dumps({"credits": credits}).encode())

    base = {"price_wei": "1", "layer_tokens": 1}
    assert parse(base).credit_max_pending_mints == DEFAULT_MAX_PENDING_MINTS
    assert "max_pending_mints" not in parse(base).to_json()["credits"]
    eight = parse({**base, "max_pending_mints": 8})
    assert eight.credit_max_pending_mints == 8
    assert Genesis.from_json(eight.to_json()).credit_max_pending_mints == 8
    for bad in (0, 65, "x", -1):
        with pytest.raises(ConfigError):
            parse({**base, "max_pending_mints": bad})


def test_mints_query_cursors_are_typed(tmp_path: Path) -> None:
    from abci_app.queries import query

    chain = flood_chain(tmp_path)
    payer = "0x" + "ab" * 20
    for path in (
        "/mints?pending=true&after=0x" + "00" * 32,  # a pending cursor names its lane
        "/mints?pending=true&after=2/0x" + "00" * 32,
        f"/mints?payer={payer}&after=0/0x" + "00" * 32,
        f"/mints?payer={payer}&after=0x" + "zz" * 32,
        "/mints?pending=true&limit=-1",
    ):
        assert query(chain.state, path, b"")[0] == Code.BAD_QUERY, path


def test_a_client_refused_for_its_pending_mints_is_told_why_and_what_to_do(tmp_path: Path) -> None:
    from node.client.credit_purchase import MintRefused
    from tests.unit.test_credit_purchase_resume import _finish, _setup

    chain, stores, _, _, wallet = _setup(tmp_path)
    _, codes = flood(chain, [PAYER], DEFAULT_MAX_PENDING_MINTS)  # earlier purchases, unfunded
    assert codes == [Code.OK] * DEFAULT_MAX_PENDING_MINTS
    with pytest.raises(MintRefused) as refused:
        _finish(chain, stores, wallet)
    assert refused.value.tx_code == Code.MINT_PENDING_LIMIT
    assert refused.value.hint is not None and "planet credits finish" in refused.value.hint
    assert wallet.pending() == []  # never on the chain: nothing to finish, nothing charged


def test_the_mempool_refuses_a_mint_beyond_the_payers_bound(tmp_path: Path) -> None:
    """CheckTx reads the committed counters: a payer at its bound gets no mint into a block."""
    chain = flood_chain(tmp_path, max_pending_mints=2)
    first, codes = flood(chain, [PAYER], 2)
    assert codes == [Code.OK, Code.OK]
    _, body = junk_mint(
        period_key(chain).period, PAYER, PRICE, EVM_CHAIN_ID, ESCROW, NOW + 3600, 1 << 24
    )
    checked = chain.machine.check_tx(chain.tx(body, JUNK_SENDER))
    assert checked.code == Code.MINT_PENDING_LIMIT and "at most 2" in checked.log
    fund(chain, first[0])
    assert chain.machine.check_tx(chain.tx(body, JUNK_SENDER)).code == Code.OK
