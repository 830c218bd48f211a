"""Reports never vanish, against real processes (harness/gateway_net.py: anvil with the
contracts, one CometBFT validator whose genesis names the escrow (no gateway list), two int8
SmolLM2 nodes, the gateway): a gateway killed with SIGKILL while its prepaid charges are still
unreported is started again and reports every charge exactly once, naming no node."""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from harness.gateway_net import PASSWORD, GatewayNet, prepared_manifest, wait_for
from node.keys import create_dev_wallet, load_or_create_node_key
from node.server.launcher import wait_healthy
from protocol.commit_batch import decode_tx
from protocol.committee.grammar import TxDecodeError
from protocol.committee.settlement import WorkReport

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTIONS = 6
HOLD = ("--report-min-questions", "1000", "--report-max-wait", "300")  # report nothing yet


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    run_dir = tmp_path_factory.mktemp("gateway-books")
    network = GatewayNet(run_dir, manifest)
    try:
        nodes = network.start_nodes([0, 1], wait=False)
        network.start_chain()
        # no genesis list of gateways: the gateway binds its committee key to its wallet's
        # address itself (a `gateway` tx) when it first starts
        load_or_create_node_key(run_dir / "gateway" / "committee_key.json", PASSWORD)
        create_dev_wallet(run_dir / "gateway" / "wallet.json", PASSWORD)
        deployment = network.deployment
        network.start_committee(
            app_state={
                "evm": {
                    "chain_id": deployment.chain_id,
                    "committee_address": deployment.address("Committee"),
                    "escrow_address": deployment.address("QueryEscrow"),
                },
            }
        )
        wait_healthy([c.process for c in nodes], timeout_s=240)
        for node in nodes:
            network.register(node, stake=True)
        network.start_heartbeats()
        network.start_gateway(HOLD)
        yield network
    finally:
        network.close()


def committed_reports(net: GatewayNet) -> list[tuple[WorkReport, list[dict[str, Any]]]]:
    """Every work_report a block holds with code 0, with its tx result's events."""
    assert net.committee is not None
    out = []
    page = 1
    while True:
        found = net.committee.call(
            "tx_search", query='"tx.height>0"', page=str(page), per_page="100"
        )
        for tx in found["txs"]:
            try:
                body = decode_tx(base64.b64decode(tx["tx"])).body
            except TxDecodeError:  # the proposers' extended-commit txs
                continue
            if isinstance(body, WorkReport) and int(tx["tx_result"].get("code", 0)) == 0:
                out.append((body, tx["tx_result"].get("events") or []))
        if page * 100 >= int(found["total_count"]):
            return out
        page += 1


def refusals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == "planet.item_refused"]


def test_a_gateway_killed_with_unreported_charges_reports_each_once_after_restart(
    net: GatewayNet,
) -> None:
    payer = net.account("books payer")
    net.fund_balance(payer, 10**16)
    receipts = []
    for _ in range(QUESTIONS):
        key, _ = net.voucher(payer, 10**14, expires_in_s=1200)
        client = openai.OpenAI(base_url=f"{net.gateway_url}/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(
            model=net.manifest.model_id,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=4,
            temperature=0,
        )
        receipts.append(answer.model_extra["planet_receipt"])
    time.sleep(6)  # a reporter pass or more: the batch is held (1000 questions, 300 s)
    assert committed_reports(net) == []

    assert net.gateway is not None
    net.gateway.kill()  # SIGKILL: no shutdown flush
    net.gateway.wait(10)
    net.start_gateway()  # default batching: what the ledger file holds is reported at once

    fees = {r["query_id"]: int(r["fee_wei"]) for r in receipts}

    def reported() -> list[tuple[WorkReport, list[dict[str, Any]]]] | None:
        reports = committed_reports(net)
        ids = {c.id for body, _ in reports for c in body.charges}
        return reports if set(fees) <= ids else None

    reports = wait_for(reported, 120, "the restarted gateway's reports", interval=1.0)
    charges = Counter(c.id for body, _ in reports for c in body.charges)
    assert charges == Counter(set(fees)), charges  # every charge, exactly once
    assert {c.id: c.total for body, _ in reports for c in body.charges} == fees
    assert [refusals(events) for _, events in reports] == [[] for _ in reports]
    assert all(set(body.to_json()) == {"queries", "charges"} for body, _ in reports)  # no node

    # killed again with nothing left: the next start reports nothing more
    net.gateway.kill()
    net.gateway.wait(10)
    net.start_gateway()
    time.sleep(8)
    assert len(committed_reports(net)) == len(reports)
    ledger = Path(net.run_dir) / "gateway" / "wallet-receipts.ledger.jsonl"
    assert ledger.exists() and json.loads(ledger.read_text().splitlines()[-1])
