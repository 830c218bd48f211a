"""A span hop is paid as its shards' hops (node/server/span_payments.py, node/client/circuit.py
payees): one in-process node serving both shards of a tiny model as one hop, each shard priced
and paid on its own (`pay` names the shard), checked against the in-process committee chain.
The client gets generate's exact tokens, pays ceil(positions / price) credits per shard, each
spooled in that shard's spool; each shard's spool redeems on its shard on the chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from node.agent.credit_till import CreditTill, SpoolRedeemer
from node.client.credit_wallet import CreditWallet
from node.client.failover import FailoverPolicy, generate
from node.client.paying import payee
from node.client.replicas import ReplicaCircuits
from node.client.types import Hop
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.server.app import STATE_KEY, create_app
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.payments import Account, CreditCheck, CreditRefusedError, CreditSpool, Payments
from node.server.span_backend import SpanBackend
from node.server.span_payments import SpanPayments
from protocol.paid_credits import spent_id
from protocol.stream import OPS_FROM_CLIENT, BadControlError, parse_control, pay_message
from tests.credit_chain import minted, node_chain
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.test_abci_state import commit_served
from tests.unit.test_credit_till import ChainLink

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 12
PRICE = 8  # positions per credit, on each shard


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("paid-span")
    model = make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)
    return Path(manifest), model


def test_pay_names_the_shard_of_a_span_or_is_refused_by_name(tmp_path) -> None:
    chain, _ = node_chain(tmp_path)
    credit = minted(chain, tmp_path, count=1)[0][0]
    assert parse_control(json.dumps(pay_message(1, credit, 1)), OPS_FROM_CLIENT).shard == 1
    assert parse_control(json.dumps(pay_message(1, credit)), OPS_FROM_CLIENT).shard is None
    for bad in (-1, 65536, 10**30, True, "1", "\u0661", 1.0, None, [1], {"shard": 1}):
        message = {**pay_message(1, credit), "shard": bad}
        with pytest.raises(BadControlError, match="shard"):
            parse_control(json.dumps(message), OPS_FROM_CLIENT)


async def test_a_span_is_paid_per_shard_and_each_shard_redeems_on_its_own(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, model = tiny
    chain, node = node_chain(tmp_path)  # registered on shards 0 and 1, priced on both
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(minted(chain, tmp_path, count=10)[0])
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    config = ServerConfig(
        manifest_path=manifest,
        shard_id=0,
        last_shard=1,
        credit_positions=PRICE,
        committee_rpc="http://127.0.0.1:9",  # replaced: the in-process chain
        credits_dir=tmp_path / "spool" / "shard-0",
    )
    span = SpanBackend([ModelShardBackend(manifest, s, device="cpu") for s in (0, 1)])
    server = await aiohttp_server(create_app(config, span))
    check = CreditCheck(ChainLink(chain, node))
    spools = {s: CreditSpool(tmp_path / "spool" / f"shard-{s}") for s in (0, 1)}
    server.app[STATE_KEY].payments = SpanPayments(
        {s: Payments(PRICE, check, spools[s], wait_s=0.5) for s in (0, 1)}
    )
    hop = Hop(url=str(server.make_url("")).rstrip("/"), shard=0, last=1)
    registered = {payee(hop.url, 0): PRICE, payee(hop.url, 1): PRICE}
    plan = Manifest.load(manifest)
    expected = {s.shard_id: (plan.model_hash, s.layers) for s in plan.shards}
    async with aiohttp.ClientSession() as http:
        source = ReplicaCircuits(
            http,
            [hop],
            expected=expected,
            hidden_size=64,
            prefill_chunk=5,
            credits=wallet,
            min_credit_positions=PRICE,
            chain_prices=registered,
        )
        tokens = [
            t
            async for t in generate(
                source, head, ids, max_new_tokens=STEPS, stop_on_eos=False,
                policy=FailoverPolicy(attempts=0),
            )
        ]  # fmt: skip
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    assert tokens == out[0, len(ids) :].tolist()
    assert source.prices == source.checked == registered  # each shard's price, checked
    fed = len(ids) + STEPS - 1
    per_shard = -(-fed // PRICE)
    payer = source.payer
    assert payer is not None and payer.spent == 2 * per_shard
    assert [len(list(spools[s].held())) for s in (0, 1)] == [per_shard, per_shard]
    assert server.app[STATE_KEY].payments.accepted == 2 * per_shard
    link = ChainLink(chain, node)
    paid = [spent_id(c) for spool in spools.values() for _, c in spool.held()]
    for shard, spool in spools.items():  # what the agent does with `<base>/shard-K`
        commit_served(chain, node, shard, blocks=1)
        redeemer = SpoolRedeemer(CreditTill(link, "m", shard), spool)
        assert await redeemer.step() == per_shard
    for identifier in paid:
        assert (await link.query("/credit_spent", id=identifier))["height"] is not None


async def test_span_payments_cover_every_shard_and_refuse_a_shard_not_served(tmp_path) -> None:
    class Free:
        async def check(self, credit: Any) -> int:
            return 1

    parts = {s: Payments(4, Free(), CreditSpool(tmp_path / f"s{s}"), wait_s=0.05) for s in (1, 2)}  # type: ignore[arg-type]
    payments = SpanPayments(parts)
    account = Account()
    chain_credit = _fake_credit()
    with pytest.raises(CreditRefusedError, match="not shard 3"):
        await payments.accept(account, chain_credit, 3)
    await payments.accept(account, chain_credit, 1)  # shard 1 paid 4 positions, shard 2 none
    from protocol.stream import PaymentRequiredError

    with pytest.raises(PaymentRequiredError):
        await payments.cover(account, 2)
    assert account.parts[1].used == 0 and account.used == 0  # the covered part was refunded
    assert pay_message(1, chain_credit, 2)["shard"] == 2


def _fake_credit() -> Any:
    from protocol.paid_credits import PaidCredit

    return PaidCredit(1, b"\x01" * 32, b"\x02" * 48)
