"""Nodes paid per chunk with bearer credits (node/server/payments.py, node/client/paying.py):
in-process tiny-model nodes that charge, checking credits against the in-process committee chain.

A paying client gets generate's exact tokens and pays each node exactly ceil(positions / price)
credits, which the node spools and its agent's redeemer cashes on the chain (then nothing is
left to redeem twice); a client that does not pay is stopped by name and the node goes on
serving; a credit shown twice or altered is refused by name; a wallet that runs dry stops the
answer with the wallet's error (no failover spends more)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from node.agent.credit_till import CreditTill, SpoolRedeemer
from node.client.circuit import CircuitClient
from node.client.credit_wallet import CreditWallet
from node.client.failover import FailoverPolicy, generate
from node.client.paying import (
    CreditExpiry,
    CreditPayer,
    OutOfCreditsError,
    PriceTooHighError,
    PriceUnregisteredError,
)
from node.client.replicas import ReplicaCircuits
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.server.app import STATE_KEY
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.next_hops import ForwardList
from node.server.payments import Account, CreditCheck, CreditRefusedError, CreditSpool, Payments
from protocol.errors import RemoteError, UnavailableError
from protocol.paid_credits import CreditInvalidError, spent_id
from protocol.stream import PaymentRequiredError, not_taken_id, open_message, pay_message
from tests.credit_chain import minted, node_chain, redeem
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.stream_circuit import serve_circuit
from tests.unit.test_abci_settlement import ask
from tests.unit.test_abci_state import commit_served
from tests.unit.test_credit_till import ChainLink

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 12
PRICE = 8  # positions per credit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("paid-circuit")
    model = make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)
    return Path(manifest), model


async def _paid_nodes(aiohttp_server: Any, manifest: Path, tmp: Path, chain: Any, node: Any):
    servers, hops = await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(
                    manifest_path=manifest,
                    shard_id=shard,
                    credit_positions=PRICE,  # what /info tells clients
                    committee_rpc="http://127.0.0.1:9",  # replaced: the in-process chain
                    credits_dir=tmp / f"spool-{shard}",
                ),
                ModelShardBackend(manifest, shard, device="cpu"),
            )
            for shard in range(2)
        ],
    )
    spools = []
    for shard, server in enumerate(servers):
        spools.append(CreditSpool(tmp / f"spool-{shard}"))
        check = CreditCheck(ChainLink(chain, node))
        server.app[STATE_KEY].payments = Payments(PRICE, check, spools[-1], wait_s=0.5)
    return servers, hops, spools


def _paying_client(manifest: Path, tmp: Path, credits: int) -> tuple[Any, ...]:
    """A chain, its node key, a wallet of `credits` minted credits, the head and PROMPT's ids."""
    chain, node = node_chain(tmp)
    wallet = CreditWallet(tmp / "credits.json")
    wallet.add(minted(chain, tmp, count=credits)[0])
    head = ClientHead.load(manifest, device="cpu")
    return chain, node, wallet, head, head.encode(PROMPT)


def _circuits(http: aiohttp.ClientSession, hops: Any, plan: Manifest, **extra: Any) -> Any:
    """The failover loop's circuits over `hops`, each shard expected as the manifest names it."""
    expected = {s.shard_id: (plan.model_hash, s.layers) for s in plan.shards}
    return ReplicaCircuits(http, hops, expected=expected, hidden_size=64, **extra)


def _generate(client: CircuitClient, head: Any, ids: list[int]) -> Any:
    return client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)


async def test_paid_circuit_exact_tokens_each_node_paid_per_chunk_and_redeemed(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, model = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 10)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    # the path of `planet ask --credits --committee-rpc`: the prices registered on the chain
    # (their /info agreeing), opens not waited for (each `pay` goes right behind its open), the
    # failover loop around the circuit
    plan = Manifest.load(manifest)
    registered = {hop.url: PRICE for hop in hops}
    async with aiohttp.ClientSession() as http:
        source = _circuits(http, hops, plan, prefill_chunk=5, credits=wallet,
                           min_credit_positions=PRICE, chain_prices=registered)  # fmt: skip
        tokens = [
            t
            async for t in generate(
                source,
                head,
                ids,
                max_new_tokens=STEPS,
                stop_on_eos=False,
                policy=FailoverPolicy(attempts=0),
            )
        ]
    payer = source.payer
    assert payer is not None and source.prices == source.checked == registered
    # the client's own decode passes went into its cost book, for every hop (costs.py)
    assert all(0 < (source.costs.get(hop.url).seen_s or 0) < 10 for hop in hops)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    assert tokens == out[0, len(ids) :].tolist()
    fed = len(ids) + STEPS - 1  # the last token chosen is never fed
    per_node = -(-fed // PRICE)
    assert payer.spent == 2 * per_node and wallet.count() == 10 - 2 * per_node
    assert [len(list(spool.held())) for spool in spools] == [per_node, per_node]
    for server in servers:
        assert server.app[STATE_KEY].payments.accepted == per_node

    paid = [spent_id(c) for spool in spools for _, c in spool.held()]
    link = ChainLink(chain, node)
    for shard in range(2):  # the agents commit what the nodes served (a redemption needs it)
        commit_served(chain, node, shard, blocks=1)
    for shard, spool in enumerate(spools):
        redeemer = SpoolRedeemer(CreditTill(link, "m", shard), spool)
        assert await redeemer.step() == per_node
        assert list(spool.held()) == [] and await redeemer.step() == 0
    for identifier in paid:  # every credit a node took is redeemed on the chain, once
        assert (await link.query("/credit_spent", id=identifier))["height"] is not None


async def test_a_nodes_file_without_a_chain_pays_no_info_price_unless_capped(
    aiohttp_server, tiny, tmp_path
) -> None:
    """`planet ask --credits --nodes FILE` with no committee and no explicit
    `--min-credit-positions`: a node's /info price is its own word, so the question stops by
    name before a credit leaves the wallet (before: /info's price was paid as it stood)."""
    manifest, _ = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 4)
    _, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    plan = Manifest.load(manifest)
    async with aiohttp.ClientSession() as http:
        source = _circuits(http, hops, plan, credits=wallet, min_credit_positions=PRICE)
        with pytest.raises(PriceUnregisteredError) as refused:
            _ = [t async for t in generate(source, head, ids, max_new_tokens=2)]
        assert refused.value.code == "price_unregistered" and hops[0].url in refused.value.message
        assert source.prices == {hop.url: PRICE for hop in hops} and source.checked == {}
        # a chain that lists them without a price: the same refusal
        unpriced = _circuits(http, hops, plan, credits=wallet, chain_prices={})
        with pytest.raises(PriceUnregisteredError):
            _ = [t async for t in generate(unpriced, head, ids, max_new_tokens=2)]
    assert wallet.count() == 4 and source.payer is not None and source.payer.spent == 0
    assert [list(spool.held()) for spool in spools] == [[], []]


async def test_a_client_gone_mid_answer_and_a_node_dead_before_redeeming_lose_no_credit(
    aiohttp_server, tiny, tmp_path
) -> None:
    """The client vanishes after 10 of 40 tokens (its links drop, no close); the nodes keep
    every credit that left the wallet, at most one chunk ahead of the work each. Their
    processes then die before redeeming: a new spool over the same directory (the restarted
    node's agent) cashes every one on the chain, and the credits still in the wallet stay
    good."""
    manifest, _ = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 20)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    http = aiohttp.ClientSession()
    payer = CreditPayer(wallet, {h.url: PRICE for h in hops}, min_positions=PRICE)
    client = CircuitClient(hops, hidden_size=64, prefill_chunk=5, http=http, payer=payer)
    await client.__aenter__()
    got = 0
    answer = client.generate(head, ids, max_new_tokens=40, stop_on_eos=False)
    async for _ in answer:
        got += 1
        if got == 10:
            break
    await http.close()  # gone: the connections drop under the open sessions, no close sent
    for link in client.links:
        link.reader.cancel()
    taken = 20 - wallet.count()
    payments = [server.app[STATE_KEY].payments for server in servers]

    async def settled() -> bool:
        return sum(p.accepted for p in payments) == taken

    for _ in range(100):
        if await settled():
            break
        await asyncio.sleep(0.02)
    fed = len(ids) + got  # positions each node computed, the frame in flight included
    for spool in spools:
        kept = len(list(spool.held()))
        assert 1 <= kept <= -(-fed // PRICE) + 1  # at most one credit ahead of its work
    assert sum(len(list(spool.held())) for spool in spools) == taken  # none lost in between
    # the nodes die here: only their spool directories (and their commitments) remain
    link = ChainLink(chain, node)
    for shard in range(2):
        commit_served(chain, node, shard, blocks=1)
    redeemed = 0
    for shard in range(2):
        restarted = CreditSpool(tmp_path / f"spool-{shard}")
        redeemed += await SpoolRedeemer(CreditTill(link, "m", shard), restarted).step()
        assert list(restarted.held()) == []
    assert redeemed == taken
    for credit in CreditWallet(tmp_path / "credits.json").take(wallet.count()):
        assert (await link.query("/credit_spent", id=spent_id(credit)))["height"] is None


async def test_a_client_that_does_not_pay_is_stopped_by_name_and_the_node_serves_on(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=8)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    async with CircuitClient(hops, hidden_size=64) as client:
        with pytest.raises(RemoteError) as refused:
            _ = [t async for t in _generate(client, head, ids)]
    assert refused.value.code == "payment_required"
    assert "0 credits paid" in refused.value.message
    assert [len(s.app[STATE_KEY].store) for s in servers] == [0, 0]  # closed, KV freed
    assert [list(spool.held()) for spool in spools] == [[], []]
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    payer = CreditPayer(wallet, {hop.url: PRICE for hop in hops}, min_positions=PRICE)
    async with CircuitClient(hops, hidden_size=64, payer=payer) as client:
        assert len([t async for t in _generate(client, head, ids)]) == STEPS


async def test_a_client_paying_no_node_is_refused_once_and_no_node_is_avoided(
    aiohttp_server, tiny, tmp_path
) -> None:
    """`planet ask` without --credits over nodes whose /info says they charge: the first
    `payment_required` ends the question by name, with a hint on how to pay. No replay on a
    replacement circuit (each would wait the node's pay-wait for the same refusal), no node
    avoided: it did nothing wrong (issue 41)."""
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    head = ClientHead.load(manifest, device="cpu")
    plan = Manifest.load(manifest)
    async with aiohttp.ClientSession() as http:
        source = _circuits(http, hops, plan)
        with pytest.raises(RemoteError) as refused:
            _ = [
                t
                async for t in generate(
                    source,
                    head,
                    head.encode(PROMPT),
                    max_new_tokens=STEPS,
                    stop_on_eos=False,
                    policy=FailoverPolicy(backoff_s=0.0, stall_s=None),
                )
            ]
    error = refused.value
    assert error.code == "payment_required" and error.http_status == 402
    assert "0 credits paid" in error.message
    assert error.hint is not None and "--credits" in error.hint
    assert source.circuits == [tuple(hops)]  # the one circuit: nothing replayed
    assert not source._avoid  # neither node sits out for it
    assert [len(s.app[STATE_KEY].store) for s in servers] == [0, 0]
    assert [list(spool.held()) for spool in spools] == [[], []]


async def test_a_credit_shown_twice_altered_or_for_another_link_is_refused_by_name(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    [credit, other], _ = minted(chain, tmp_path, count=2)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    altered = replace(other, nonce=other.nonce[:-1] + bytes([other.nonce[-1] ^ 1]))
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[0].url}/v1/stream") as ws:
        await ws.send_json(open_message(1, "s" * 43, 0, None, None))
        assert (await ws.receive_json(timeout=10))["op"] == "opened"
        for sid, paid in ((1, credit), (1, credit), (1, altered), (2, other)):
            await ws.send_json(pay_message(sid, paid))  # the first one taken: no answer
        answers = [await ws.receive_json(timeout=10) for _ in range(3)]
    assert [a["code"] for a in answers] == ["credit_refused", "credit_invalid", "credit_not_taken"]
    assert "already paid to this node" in answers[0]["message"]
    # a credit for a session that is not open here is not taken, and named so the client can
    # put it back into its wallet
    assert not_taken_id(answers[2]["message"]) == spent_id(other)
    assert [len(list(spool.held())) for spool in spools] == [1, 0]  # the good one, once
    assert servers[0].app[STATE_KEY].payments.accepted == 1


async def test_credits_sent_to_a_hop_whose_open_failed_go_back_into_the_wallet(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=6)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    servers[0].app[STATE_KEY].next_hops = ForwardList(0, frozenset())  # refuses every next hop
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    payer = CreditPayer(wallet, {hop.url: PRICE for hop in hops}, min_positions=PRICE)
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=16, payer=payer) as client:
        sid = await client.open("a-secret-of-this-question", wait=False)  # pays right behind
        await client.send(sid, 0, _rows(len(ids)))
        with pytest.raises(RemoteError) as refused:
            await client.receive(sid, 0, 1)
        assert refused.value.code == "next_hop_not_allowed"
        await client.close(sid)
    # the first hop never opened the session: both credits it was sent are back; the last hop
    # opened it and keeps what it was paid ahead (the one chunk at risk)
    kept = len(list(spools[1].held()))
    assert list(spools[0].held()) == [] and kept == 2
    assert wallet.count() == 6 - kept and payer.spent == kept


async def test_a_credit_assigned_to_another_node_goes_back_into_the_wallet(
    aiohttp_server, tiny, tmp_path
) -> None:
    """The client's listing of the first hop is stale (another key, model or shard: here
    another key): the node refuses each credit `credit_not_assigned` before it takes it, the
    question stops on that refusal, and every credit sent is back in the wallet, unspent."""
    from protocol.committee.credit_holder import node_party
    from protocol.paid_credits import HeldCredit

    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=4)
    assert all(isinstance(c, HeldCredit) for c in credits)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    model_hash = Manifest.load(manifest).model_hash
    servers[0].app[STATE_KEY].payments.party = node_party(b"\x05" * 32, model_hash, 0)
    head = ClientHead.load(manifest, device="cpu")
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    payer = CreditPayer(
        wallet,
        {hops[0].url: PRICE, hops[1].url: 0},
        min_positions=PRICE,
        parties={hops[0].url: node_party(b"\x06" * 32, model_hash, 0)},  # not the node's
    )
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=16, payer=payer) as client:
        with pytest.raises(RemoteError) as refused:
            _ = [t async for t in _generate(client, head, head.encode(PROMPT))]
        assert refused.value.code == "credit_not_assigned"
    assert wallet.count() == 4 and payer.spent == 0  # back, none lost
    assert list(spools[0].held()) == [] and servers[0].app[STATE_KEY].payments.accepted == 0
    assert all(isinstance(c, HeldCredit) for c in wallet.take(4))  # seeds kept: assignable


def _rows(count: int) -> Any:
    import numpy as np

    return np.zeros((1, count, 64), dtype=np.float32)


class _Unreachable:
    async def query(self, path: str, **params: Any) -> Any:
        raise UnavailableError("the validator does not answer")


async def test_a_credit_the_node_cannot_check_or_keep_goes_back_to_the_client(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=4)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    head = ClientHead.load(manifest, device="cpu")
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    # only the first hop is paid (the second taken for free: it never gets that far)
    payer = CreditPayer(wallet, {hops[0].url: PRICE, hops[1].url: 0}, min_positions=PRICE)
    servers[0].app[STATE_KEY].payments.check = CreditCheck(_Unreachable())  # type: ignore[arg-type]
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=16, payer=payer) as client:
        with pytest.raises(RemoteError) as refused:
            _ = [t async for t in _generate(client, head, head.encode(PROMPT))]
        assert refused.value.code == "payment_required"  # nothing paid: the session stops
    assert wallet.count() == 4 and payer.spent == 0  # both credits sent came back
    assert list(spools[0].held()) == []


class _Blip:
    """The node's committee link, failing its first `failures` queries as unanswered."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner, self.failures = inner, failures

    async def query(self, path: str, **params: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise UnavailableError("the validator did not answer in time")
        return await self.inner.query(path, **params)


async def test_a_credit_check_the_committee_missed_once_is_tried_again_and_the_answer_paid(
    aiohttp_server, tiny, tmp_path
) -> None:
    """A validator's blip while a node checks a credit: the node asks again (stream.py
    PAY_CHECK_RETRY_S) and keeps it, so the answer is paid and served, not refused
    `payment_required` with the credit on its way back (seen on the hosts devnet)."""
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=16)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    head = ClientHead.load(manifest, device="cpu")
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    payer = CreditPayer(wallet, {hop.url: PRICE for hop in hops}, min_positions=PRICE)
    payments = servers[0].app[STATE_KEY].payments
    payments.check = CreditCheck(_Blip(payments.check.link, failures=1))  # type: ignore[arg-type]
    payments.wait_s = 5.0  # the nodes' default (PAY_WAIT_S): room for the check's second try
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=16, payer=payer) as client:
        tokens = [t async for t in _generate(client, head, head.encode(PROMPT))]
    held = [len(list(spool.held())) for spool in spools]
    assert tokens and held[0] >= 1 and sum(held) == payer.spent == 16 - wallet.count()


async def test_a_node_dearer_than_the_clients_floor_is_never_paid(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=4)
    _, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    head = ClientHead.load(manifest, device="cpu")
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    payer = CreditPayer(wallet, {hop.url: PRICE for hop in hops})  # the default floor: 16
    async with CircuitClient(hops, hidden_size=64, payer=payer) as client:
        with pytest.raises(PriceTooHighError, match=f"a credit per {PRICE} positions"):
            _ = [t async for t in _generate(client, head, head.encode(PROMPT))]
    assert wallet.count() == 4 and payer.spent == 0
    assert [list(spool.held()) for spool in spools] == [[], []]


async def test_a_wallet_that_runs_dry_stops_the_answer_with_its_own_error(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node = node_chain(tmp_path)
    credits, _ = minted(chain, tmp_path, count=3)
    _, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(credits)
    payer = CreditPayer(wallet, {hop.url: PRICE for hop in hops}, min_positions=PRICE)
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=4, payer=payer) as client:
        with pytest.raises(OutOfCreditsError) as dry:
            _ = [t async for t in _generate(client, head, ids)]
    assert "ask for 2 more credits and the credit wallet holds 1" in dry.value.message
    # nothing taken by the refused payment; what the nodes did not keep of the closed session
    # (a close can overtake the `pay`s held behind the open) came back into the wallet
    kept = len(list(spools[0].held())) + len(list(spools[1].held()))
    assert payer.spent == kept <= 2 and wallet.count() == 3 - kept


def test_pay_control_is_parsed_at_the_boundary_and_malformed_ones_named() -> None:
    from protocol.frames.errors import FrameError
    from protocol.paid_credits import credit_json
    from protocol.stream import MAX_CONTROL_BYTES, OPS_FROM_CLIENT, parse_control
    from tests.credit_fakes import fake_credit, rsa_credit_json

    good = credit_json(fake_credit(1, period=3))
    parsed = parse_control(json.dumps({"op": "pay", "sid": 7, "credit": good}), OPS_FROM_CLIENT)
    assert parsed.sid == 7 and parsed.credit is not None and parsed.credit.period == 3
    for credit in (
        None,
        good[:-2],
        good.upper(),
        "zz" + good[2:],
        good[:112] + "00" * 32,  # σ not a point
        rsa_credit_json(1),  # the retired RSA form
        [3, "ab" * 81, [["A" * 40, "cd" * 256]]],
    ):
        with pytest.raises(FrameError) as bad:
            parse_control(json.dumps({"op": "pay", "sid": 7, "credit": credit}), OPS_FROM_CLIENT)
        assert bad.value.code == "bad_control", credit
    with pytest.raises(FrameError) as big:
        huge = {"op": "pay", "sid": 1, "credit": "ab" * 10000}
        parse_control(json.dumps(huge), OPS_FROM_CLIENT)
    assert big.value.code == "too_large" and MAX_CONTROL_BYTES == 16384


async def test_the_node_checks_a_credit_as_the_chain_will_redeem_it(tmp_path) -> None:
    chain, node = node_chain(tmp_path, lifetime_epochs=2)
    credits, req = minted(chain, tmp_path, count=4)
    spool = CreditSpool(tmp_path / "spool")
    # margin 1: the chain's own window (a redeem lands in the next block); test_credit_window.py
    check = CreditCheck(ChainLink(chain, node), margin_blocks=1)
    payments = Payments(PRICE, check, spool, wait_s=0.2)
    account = Account()
    # redeemed on the chain already (the client paid another node with it first)
    result = redeem(chain, node, credits[:1])
    assert result.code == 0, result.log
    with pytest.raises(CreditRefusedError, match="redeemed on the committee chain at height"):
        await payments.accept(account, credits[0])
    # a σ that is not this credit's (another credit's): does not verify under the period's key
    with pytest.raises(CreditInvalidError, match="does not verify"):
        await payments.accept(account, replace(credits[1], signature=credits[2].signature))
    await payments.accept(account, credits[1])
    assert (account.paid, account.credits, payments.refused) == (PRICE, 1, 2)
    await payments.cover(account, PRICE)  # paid: at once
    with pytest.raises(PaymentRequiredError):
        await payments.cover(account, 1)  # nothing more came within wait_s
    payments.refund(account, PRICE)  # a busy refusal: not computed, not charged
    await payments.cover(account, PRICE)
    # the window is the chain's (genesis lifetime_epochs 2: a credit of issue epoch e, its key
    # period's last block's, is redeemed up to e + 2)
    length = chain.state.genesis.epoch_length
    e = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    chain.advance_to((e + 1) * length + 1)  # epoch e + 2: still good
    check = CreditCheck(ChainLink(chain, node), refresh_s=0.0, margin_blocks=1)
    await Payments(PRICE, check, spool).accept(Account(), credits[3])
    chain.advance_to((e + 2) * length + 1)  # e + 3: past it
    with pytest.raises(CreditRefusedError, match=r"not redeemable in epoch"):
        await Payments(PRICE, check, spool).accept(Account(), credits[2])
    assert sorted(path.name for path, _ in spool.held()) == sorted(
        f"{spent_id(c)}.json" for c in (credits[1], credits[3])
    )


async def test_a_spent_credit_replayed_costs_the_validators_one_query(tmp_path) -> None:
    """A client showing a credit the chain already redeemed, pay after pay, is refused each time;
    the node asks `/credit_spent` once and remembers the answer."""
    chain, node = node_chain(tmp_path)
    [credit] = minted(chain, tmp_path, count=1)[0]
    result = redeem(chain, node, [credit])
    assert result.code == 0, result.log
    link = ChainLink(chain, node)
    asked: list[str] = []
    original = link.query

    async def counted(path: str, **params: Any) -> Any:
        asked.append(path)
        return await original(path, **params)

    link.query = counted  # type: ignore[method-assign]
    payments = Payments(PRICE, CreditCheck(link), CreditSpool(tmp_path / "spool"), wait_s=0.2)
    for _ in range(5):
        with pytest.raises(CreditRefusedError, match="redeemed on the committee chain at height"):
            await payments.accept(Account(), credit)
    assert asked.count("/credit_spent") == 1 and payments.refused == 5


async def test_the_client_drops_credits_past_their_window_before_it_pays(tmp_path) -> None:
    """`CreditExpiry` (the personal client's, before each question): the committee's epoch
    and lifetime say which credits no node will take; those leave the wallet, the rest stay;
    it asks again only after `every_s`."""
    chain, node = node_chain(tmp_path, lifetime_epochs=1)
    old, req = minted(chain, tmp_path, count=2)
    length = chain.state.genesis.epoch_length
    e = ask(chain, f"/mints?id={req.mint_id}")["issue_epoch"]
    chain.advance_to((e + 1) * length + 1)  # e + 2: the old ones are past
    fresh, _ = minted(chain, tmp_path, count=3)  # of the next key period (its key made first)
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(old + fresh)
    link = ChainLink(chain, node)
    asked: list[str] = []

    async def query(path: str) -> Any:
        asked.append(path)
        return await link.query(path)

    expiry = CreditExpiry(wallet, query, every_s=3600, margin=1)  # the window alone
    assert await expiry.check() == 2 and wallet.count() == 3
    assert wallet.take(3) == fresh
    assert await expiry.check() == 0 and asked == ["/credit_keys"]  # not due again


async def test_speculation_every_verified_position_is_paid_by_one_rule_both_sides_count(
    aiohttp_server, tiny, tmp_path, monkeypatch
) -> None:
    """The speculation rule (docs/committee.md, *Commitment coverage*): all verified positions.
    A speculative pass sends the last token and its guesses as one frame; every hop computes
    them all, so the client pays (`_pay` over the positions sent) and each node charges
    (`cover` per frame) every position of every frame, rejected guesses and positions
    recomputed after a rewind included: both count the frames, nothing else."""
    from node.client.speculation import SpeculationConfig

    manifest, _ = tiny
    chain, node, wallet, head, _ = _paying_client(manifest, tmp_path, 24)
    # prompt lookup proposes what followed the last token(s) before: the tiny model's own
    # choice (it repeats token 68, "w60") is guessed to be followed by w1 w2 w3, and is not
    ids = head.encode("w60 w1 w2 w3 w60 w1 w2 w3 w9 w60")
    servers, hops, _ = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    counted: dict[int, int] = {}  # id(Payments) → positions the node charged
    cover = Payments.cover

    async def counting(self: Payments, account: Account, count: int) -> None:
        counted[id(self)] = counted.get(id(self), 0) + count
        await cover(self, account, count)

    monkeypatch.setattr(Payments, "cover", counting)
    plan = Manifest.load(manifest)
    async with aiohttp.ClientSession() as http:  # no chain: /info's price, under the user's cap
        source = _circuits(http, hops, plan, prefill_chunk=5, credits=wallet,
                           min_credit_positions=PRICE, info_prices=True)  # fmt: skip
        tokens = [
            t
            async for t in generate(
                source,
                head,
                ids,
                max_new_tokens=STEPS,
                stop_on_eos=False,
                policy=FailoverPolicy(attempts=0),
                speculation=SpeculationConfig(lookahead=4, min_ngram=1),
            )
        ]
    assert len(tokens) == STEPS
    charged = [counted[id(server.app[STATE_KEY].payments)] for server in servers]
    accepted_only = len(ids) + STEPS - 1
    assert charged[0] == charged[1] > accepted_only  # guesses were rejected, and paid
    per_node = -(-charged[0] // PRICE)
    assert [server.app[STATE_KEY].payments.accepted for server in servers] == [per_node] * 2
    assert source.payer is not None and source.payer.spent == 2 * per_node
