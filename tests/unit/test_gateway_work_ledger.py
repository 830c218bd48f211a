"""The gateway's work ledger and reporter against an in-process committee chain: receipts become
query fees and cumulative charges (no node named: nothing that ties a query to its nodes);
reports are split by their encoded bytes, sent once, awaited, retried when they did not reach a
block, and their refused items are kept by name; the journal makes a restart report everything
exactly once."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from node.chain.committee_rpc import tx_hash
from node.gateway.settlement import WorkLedger, WorkReporter, charge_item, ledger_paths
from protocol.canonical import canonical_json
from protocol.committee.envelope import MAX_TX_BYTES, decode, sign
from protocol.committee.settlement import WorkReport
from protocol.errors import RemoteError, UnavailableError
from tests.committee_chain import Chain, ReportingLink
from tests.unit.test_abci_settlement import GATEWAY, GATEWAY_EVM, settled_chain
from tests.unit.test_abci_state import hexkey

pytestmark = pytest.mark.unit

A = "aa" * 32


def receipt(query: int, prompt: int, completion: int, fee: int) -> dict[str, Any]:
    return {
        "query_id": "0x" + f"{query:064x}",
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "fee_wei": str(fee),
    }


def reporter(ledger: WorkLedger, link: ReportingLink, **kwargs: Any) -> WorkReporter:
    return WorkReporter(ledger, link, settle_s=0.0, **kwargs)


def test_ledger_lists_queries_and_names_no_node() -> None:
    ledger = WorkLedger()
    ledger.record(receipt(2, 5, 3, 80))
    ledger.record(receipt(1, 2, 2, 40))
    ledger.record(receipt(3, 1, 1, 0))  # a free question: nothing to report
    report = ledger.take()
    assert report is not None
    assert set(report.to_json()) == {"queries"}  # no served counts (issue 45)
    assert report.queries == (("0x" + f"{1:064x}", 40), ("0x" + f"{2:064x}", 80))
    assert report.charges == ()
    # the wire form is a valid, canonical work_report
    assert decode(sign(report, GATEWAY, 1).encode()).body == report


async def test_reporter_batches_questions_until_enough_or_the_oldest_waited() -> None:
    chain = settled_chain()
    now = [0.0]
    ledger = WorkLedger(min_questions=3, max_wait_s=60, clock=lambda: now[0])
    link = ReportingLink(chain, GATEWAY)
    sender = reporter(ledger, link)
    ledger.record(receipt(1, 1, 1, 5))
    ledger.record(receipt(2, 1, 1, 5))
    assert await sender.flush() == 0  # 2 questions: one report would narrow them down
    ledger.record(receipt(3, 1, 1, 5))
    assert await sender.flush() == 1 and len(chain.state.items("squery")) == 3
    ledger.record(receipt(4, 1, 1, 5))
    now[0] = 59.0
    assert await sender.flush() == 0
    now[0] = 61.0  # the oldest waited long enough: reported alone
    assert await sender.flush() == 1 and len(chain.state.items("squery")) == 4
    ledger.record(receipt(5, 1, 1, 5))
    assert await sender.flush(force=True) == 1  # at shutdown
    assert not ledger.pending and ledger.in_flight is None


async def test_what_did_not_reach_a_block_is_resent_byte_for_byte_and_applied_once() -> None:
    chain = settled_chain()
    ledger = WorkLedger(min_questions=1)
    ledger.record(receipt(1, 1, 1, 5))
    link = ReportingLink(chain, GATEWAY, down=True)
    sender = reporter(ledger, link)
    with pytest.raises(UnavailableError):  # no nonce to sign with: nothing leaves the ledger
        await sender.flush()
    assert ledger.pending and ledger.in_flight is None
    link.down, link.full = False, True  # the RPC answers, its mempool is full
    with pytest.raises(RemoteError):
        await sender.flush()
    sent = ledger.in_flight
    assert sent is not None and not ledger.pending  # signed, on its way, out of the pending lists
    link.full, link.down = False, True
    with pytest.raises(UnavailableError):
        await sender.flush()
    assert ledger.in_flight is sent
    link.down = False
    link.lose = True  # accepted, then lost from the mempool (a validator restart)
    assert await sender.flush() == 0 and ledger.in_flight is sent
    link.lose = False
    assert await sender.flush() == 1 and ledger.in_flight is None
    assert set(link.broadcasts) == {sent.hash}  # always the same bytes: one nonce, one effect
    assert chain.state.get("squery", f"0x{1:064x}/{GATEWAY_EVM}")["fee"] == "5"


async def test_a_report_whose_nonce_was_taken_goes_back_and_is_sent_again() -> None:
    chain = settled_chain()
    ledger = WorkLedger(min_questions=1)
    ledger.record(receipt(1, 1, 1, 5))
    link = ReportingLink(chain, GATEWAY, lose=True)
    sender = reporter(ledger, link)
    assert await sender.flush() == 0
    lost = ledger.in_flight
    assert lost is not None
    # another report of this key takes the nonce first (a second gateway process, a bug)
    other = WorkReport(queries=(("0x" + "ee" * 32, 9),))
    link.lose = False
    link.mine([sign(other, GATEWAY, lost.nonce).encode()])
    assert await sender.flush() == 1  # dead: the items went back and travelled again
    assert ledger.in_flight is None and not ledger.pending
    assert chain.state.get("squery", f"0x{1:064x}/{GATEWAY_EVM}")["fee"] == "5"


class _LaggingIndex(ReportingLink):
    """The tx index answers None for a tx's first `lag` lookups after its block (CometBFT's
    indexer trails the block a little)."""

    lag: int = 0

    async def find_tx(self, hash_hex: str) -> Any:
        found = await super().find_tx(hash_hex)
        if found is not None and self.lag > 0:
            self.lag -= 1
            return None
        return found


async def test_a_report_the_index_shows_late_is_found_while_settle_lasts_not_resent() -> None:
    chain = settled_chain()
    ledger = WorkLedger(min_questions=1)
    ledger.record(receipt(1, 1, 1, 5))
    link = _LaggingIndex(chain, GATEWAY, lose=True)
    sender = WorkReporter(ledger, link, settle_s=10.0)
    assert await sender.flush() == 0
    sent = ledger.in_flight
    assert sent is not None
    link.lose = False
    link.mine([sent.raw])  # a block holds it; the index misses it for 4 lookups
    link.lag = 4
    started = asyncio.get_running_loop().time()
    assert await sender.flush() == 1 and ledger.in_flight is None and not ledger.pending
    assert asyncio.get_running_loop().time() - started < 5.0  # as soon as the index shows it
    assert link.mined == [sent.raw]  # found, not declared dead and sent again
    assert chain.state.get("squery", f"0x{1:064x}/{GATEWAY_EVM}")["fee"] == "5"


async def test_refused_items_are_logged_and_kept_by_name_the_rest_applies(tmp_path: Path) -> None:
    chain = settled_chain()
    journal, refused_file = ledger_paths(tmp_path / "gw-receipts.jsonl")
    ledger = WorkLedger(min_questions=1, journal=journal, refused_path=refused_file)
    first = WorkReport(queries=(("0x" + f"{1:064x}", 4),))  # an earlier report, another fee
    assert chain.block([chain.tx(first, GATEWAY)])[0].code == 0
    ledger.record(receipt(1, 1, 1, 5))
    ledger.record(receipt(2, 1, 1, 5))
    assert await reporter(ledger, ReportingLink(chain, GATEWAY)).flush() == 1
    [refused] = ledger.refused
    assert (refused["kind"], refused["id"], refused["code"]) == (
        "query",
        "0x" + f"{1:064x}",
        "DUPLICATE_QUERY",
    )
    kept = [json.loads(line) for line in refused_file.read_text().splitlines()]
    assert kept[0]["refused"] == [refused]
    assert chain.state.get("squery", f"0x{2:064x}/{GATEWAY_EVM}") is not None  # the rest applied
    assert not ledger.pending and ledger.in_flight is None


async def test_a_whole_tx_refusal_names_every_item() -> None:
    chain = settled_chain()
    ledger = WorkLedger(min_questions=1)
    ledger.record(receipt(1, 1, 1, 5))
    link = ReportingLink(chain, key=SigningKey(b"\x05" * 32))  # not a genesis gateway
    assert await reporter(ledger, link).flush() == 1
    assert {(r["kind"], r["code"]) for r in ledger.refused} == {("query", "UNKNOWN_GATEWAY")}
    assert not ledger.pending


# --- restarts: the journal ---------------------------------------------------------------------


def reopened(ledger: WorkLedger) -> WorkLedger:
    """The ledger a restarted gateway loads from the same file."""
    return WorkLedger(min_questions=1, journal=ledger.journal)


async def test_a_restart_reports_what_was_recorded_exactly_once(tmp_path: Path) -> None:
    chain = settled_chain()
    path = tmp_path / "ledger.jsonl"
    ledger = WorkLedger(min_questions=10, journal=path)
    for n in range(1, 4):
        ledger.record(receipt(n, 1, 1, 5))
    assert await reporter(ledger, ReportingLink(chain, GATEWAY)).flush() == 0  # batch not full
    # killed here; the new process finds the three questions and reports them
    again = reopened(ledger)
    assert sorted(again.queries) == ["0x" + f"{n:064x}" for n in range(1, 4)]
    assert await reporter(again, ReportingLink(chain, GATEWAY)).flush() == 1
    # and a third start finds nothing left to report
    third = reopened(again)
    assert not third.pending and third.in_flight is None


@pytest.mark.parametrize("stage", ["signed", "broadcast", "committed"])
async def test_a_restart_with_a_report_in_flight_never_reports_it_twice(
    tmp_path: Path, stage: str
) -> None:
    chain = settled_chain()  # the binding tx was the key's nonce 1: the report below is its 2
    ledger = WorkLedger(min_questions=1, journal=tmp_path / "ledger.jsonl")
    ledger.record(receipt(1, 1, 1, 5))
    report = ledger.take()
    assert report is not None
    raw = sign(report, GATEWAY, 2).encode()
    ledger.sending(report, raw, 2)  # on disk; killed after this line, at `stage`
    first = ReportingLink(chain, GATEWAY)
    if stage in ("broadcast", "committed"):
        await first.broadcast(raw)
    if stage == "committed":
        first.mine()
    again = reopened(ledger)
    assert again.in_flight is not None and again.in_flight.hash == tx_hash(raw)
    link = ReportingLink(chain, GATEWAY, mempool=list(first.mempool), index=dict(first.index))
    assert await reporter(again, link).flush() == 1
    assert not again.pending and again.in_flight is None
    assert chain.state.committed("acct", hexkey(GATEWAY)) == 2


async def test_the_journal_survives_a_torn_last_line_and_compacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from node.gateway import settlement

    chain = settled_chain()
    path = tmp_path / "ledger.jsonl"
    ledger = WorkLedger(min_questions=100, journal=path)
    ledger.record(receipt(1, 1, 1, 5))
    with open(path, "a") as handle:
        handle.write('{"q": {"seq": 2, "wo')  # the crash cut the line: that receipt never left
    monkeypatch.setattr(settlement, "COMPACT_LINES", 2)
    again = reopened(ledger)
    again.record(receipt(3, 1, 1, 7))
    assert await reporter(again, ReportingLink(chain, GATEWAY)).flush() == 1
    assert len(path.read_text().splitlines()) == 1  # compacted into a snapshot
    ledger_after = reopened(again)
    assert not ledger_after.pending and ledger_after.nonce == 2  # nonce 1: the binding tx
    assert sorted(k for k, _ in chain.state.items("squery")) == [
        f"0x{1:064x}/{GATEWAY_EVM}",
        f"0x{3:064x}/{GATEWAY_EVM}",
    ]


# --- volume: reports split by their encoded bytes ----------------------------------------------


async def test_2000_charges_and_1000_queries_reach_the_chain_in_fitting_reports(
    tmp_path: Path,
) -> None:
    from tests.unit.test_abci_prepaid import NOW, charge

    chain = settled_chain(epoch_length=1_000)
    chain.time_s = NOW
    ledger = WorkLedger(min_questions=1, journal=tmp_path / "l.jsonl")
    items = [charge("payer-1" if n % 2 else "payer-2", n, 10 + n % 7) for n in range(1, 2001)]
    for n, item in enumerate(items, 1):
        ledger.record(prepaid_receipt(item))
        if n % 2 == 0:
            ledger.record(receipt(10_000 + n, 2, 3, 100 + n))
    link = ReportingLink(chain, GATEWAY)
    sender = reporter(ledger, link)
    assert await sender.flush() >= 5
    assert not ledger.pending and ledger.in_flight is None and ledger.refused == []
    sizes = [len(raw) for raw in link.mined]
    assert max(sizes) <= MAX_TX_BYTES and len(sizes) >= 5
    assert len(chain.state.items("squery")) == 1_000
    pending = dict(chain.state.items("cpend"))
    assert len(pending) == 2_000
    assert sum(int(e["total"]) for e in pending.values()) == sum(i.total for i in items)


def prepaid_receipt(item: Any) -> dict[str, Any]:
    """A voucher receipt carrying `item`'s authorization (what the payment desk signs)."""
    return {
        "query_id": item.id,
        "gateway": item.gateway,
        "model_id": item.model_id,
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "fee_wei": str(item.total),
        "payer": item.payer,
        "voucher": {
            "fee_cap_wei": str(item.cap),
            "expiry": item.expiry,
            "signature": item.signature,
        },
    }


def test_a_receipt_becomes_the_charge_the_chain_checks() -> None:
    from tests.unit.test_abci_prepaid import charge

    item = charge("payer-1", 3, 40)
    assert charge_item(prepaid_receipt(item)) == item
    key = {
        **prepaid_receipt(item),
        "key": {
            "key_id": "0x" + "cd" * 32,
            "cap_wei": "900",
            "expiry": item.expiry,
            "signature": item.signature,
            "total_wei": "120",
        },
    }
    del key["voucher"]
    made = charge_item(key)
    assert made is not None
    assert (made.kind, made.id, made.total, made.cap) == ("key", "0x" + "cd" * 32, 120, 900)
    assert charge_item(receipt(1, 1, 1, 5)) is None


def test_a_journal_written_with_served_counts_loads_and_its_report_in_flight_goes_again(
    tmp_path: Path,
) -> None:
    """A gateway upgraded from a ledger that recorded per-node served counts (issue 45: reports
    carry none now): the `work` fields are ignored, and the report signed with them, still in
    flight, no longer decodes, so its query is pending again and travels in a new report."""
    chain = settled_chain()
    path = tmp_path / "ledger.jsonl"
    query = "0x" + f"{1:064x}"
    old_body = {"queries": [[query, "5"]], "work": [[A, "m", 0, 2, 7]]}
    unsigned = {"body": old_body, "nonce": 2, "signer": hexkey(GATEWAY), "type": "work_report"}
    raw = canonical_json({**unsigned, "sig": "00" * 64})
    lines = [
        {"q": {"seq": 1, "work": [[A, 0, 7]], "query": [query, 5], "charge": None, "n": 1}},
        {"tx": {"hash": tx_hash(raw), "nonce": 2, "raw": base64.b64encode(raw).decode()}},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ledger = WorkLedger(min_questions=1, journal=path)
    assert ledger.in_flight is None and ledger.queries == {query: (5, 1)}
    assert ledger.recorded_through == 1
    assert await_flush(ledger, chain) == 1
    assert chain.state.get("squery", f"{query}/{GATEWAY_EVM}")["fee"] == "5"


def await_flush(ledger: WorkLedger, chain: Chain) -> int:
    return asyncio.run(reporter(ledger, ReportingLink(chain, GATEWAY)).flush())
