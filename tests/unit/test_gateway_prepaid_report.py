"""A gateway's prepaid receipts reach the committee as charges (no circuit), the chain accepts
them, and once the posted root covers them the gateway marks them debited."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from abci_app.codes import Code
from node.gateway.settlement import DebitTracker, WorkLedger
from protocol.committee.settlement import Contribution, ShardWork
from protocol.payment import Receipt, Voucher, circuit_hash, receipt_json, sign_voucher
from protocol.payment import parse_voucher_key as parse_voucher
from tests.unit.test_abci_prepaid import MODEL_ID, NOW, PAYER_KEYS, PAYMENT, payer
from tests.unit.test_abci_settlement import GATEWAY, next_epoch_end, one, settled_chain, two_nodes
from tests.unit.test_abci_state import hexkey
from tests.unit.test_gateway_work_ledger import circuit
from tests.unit.test_watcher_payouts import ChainLink

pytestmark = pytest.mark.unit

GATEWAY_EVM = "0x" + "9A" * 20  # as a wallet reports it (checksummed / mixed case)


def prepaid_receipt(n: int, fee: int, nodes: tuple[str, ...]) -> dict[str, Any]:
    query = bytes.fromhex(f"{n:064x}")
    voucher = Voucher(
        GATEWAY_EVM,
        query,
        bytes.fromhex(MODEL_ID[2:]),
        10**6,
        NOW + 600,
        PAYMENT.verifying_contract,
    )
    proof = parse_voucher(sign_voucher(PAYER_KEYS["payer-1"], voucher, PAYMENT))
    receipt = Receipt(query, GATEWAY_EVM, voucher.model_id, 3, 4, fee, circuit_hash(nodes))
    return receipt_json(receipt, bytes(65), nodes, voucher=(payer("payer-1"), proof))


@dataclass
class Desk:
    charged: dict[bytes, tuple[str, int]] = field(default_factory=dict)
    marked: list[bytes] = field(default_factory=list)

    def undebited(self) -> dict[bytes, tuple[str, int]]:
        return dict(self.charged)

    def mark_debited(self, query_ids: Any) -> int:
        ids = [q for q in query_ids if q in self.charged]
        for q in ids:
            del self.charged[q]
        self.marked.extend(ids)
        return len(ids)


@dataclass
class Escrow:
    posted: set[int] = field(default_factory=set)

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 1 if epoch in self.posted else 0}


async def test_prepaid_receipts_are_reported_as_charges_accepted_and_marked_once_posted() -> None:
    chain = settled_chain()
    chain.time_s = NOW
    a, b = two_nodes(chain)
    ledger = WorkLedger("m", [(0, 2), (2, 5)], min_questions=1)
    nodes = (hexkey(a), hexkey(b))
    ledger.record(prepaid_receipt(1, 70, nodes), circuit(*nodes))
    ledger.record(prepaid_receipt(2, 30, nodes), circuit(*nodes))
    work = ledger.take()
    assert work is not None and work.prepaid == () and len(work.work) == 2
    assert work.queries == ()  # a prepaid question is no escrow deposit
    report = ledger.take()  # the charges: a report of their own, refused apart from the work
    assert report is not None and report.work == () and report.queries == ()
    assert ledger.take() is None
    charged = [(p.payer, p.fee) for p in report.prepaid]
    assert charged == [(payer("payer-1"), 70), (payer("payer-1"), 30)]
    wire = str(report.to_json()["prepaid"])
    assert all(node not in wire for node in nodes)  # charges carry no circuit
    assert one(chain, work, GATEWAY).code == Code.OK
    assert one(chain, report, GATEWAY).code == Code.OK
    results = chain.block(
        [
            chain.tx(Contribution((ShardWork("m", 0, 2, 7),)), a),
            chain.tx(Contribution((ShardWork("m", 1, 3, 7),)), b),
        ]
    )
    assert [r.code for r in results] == [Code.OK, Code.OK]
    epoch = next_epoch_end(chain)
    desk = Desk({bytes.fromhex(f"{n:064x}"): (payer("payer-1"), 1) for n in (1, 2, 3)})
    escrow = Escrow()
    tracker = DebitTracker(ChainLink(chain, 0), escrow, desk)
    assert await tracker.step() == 0 and desk.marked == []  # root not posted yet
    escrow.posted.add(epoch)
    assert await tracker.step() == 2
    assert sorted(desk.marked) == [bytes.fromhex(f"{n:064x}") for n in (1, 2)]
    assert list(desk.charged) == [bytes.fromhex(f"{3:064x}")]  # not in any root: outstanding
    assert await tracker.step() == 0


def test_a_charge_near_its_vouchers_expiry_is_reported_without_waiting_for_the_batch() -> None:
    now = [float(NOW)]
    ledger = WorkLedger("m", [(0, 2), (2, 5)], min_questions=4, max_wait_s=60, wall=lambda: now[0])
    ledger.clock = lambda: 0.0
    nodes = ("aa" * 32, "bb" * 32)
    ledger.record(prepaid_receipt(1, 5, nodes), circuit(*nodes))  # its voucher expires NOW + 600
    assert not ledger.ready()  # 1 question of 4, nothing waited
    now[0] = NOW + 600 - 61
    assert not ledger.ready()
    now[0] = NOW + 600 - 60  # within the margin: report before the chain would refuse it
    assert ledger.ready()
