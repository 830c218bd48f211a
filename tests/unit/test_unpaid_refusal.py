"""A node's `payment_required` for positions a client sent it unpaid, knowing it charges, is the
question's end, not a node failure (issue 41): the failover loop does not replay it on other
circuits (each replay waited the node's --pay-wait before the same refusal), no node is blamed
or avoided, the user gets it by name with a hint on how to pay — `planet ask` its `error:` and
`hint:` lines, a gateway 402 `payment_required`. A `payment_required` from a node the client did
pay (it did not count what it was paid) stays a node failure and fails over. Which replica a
client that pays no node is sent to: a free one first (node/client/replicas.py).

The real nodes' side of it: tests/unit/test_paid_circuit.py
`test_a_client_paying_no_node_is_refused_once_and_no_node_is_avoided`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from node.client.credit_wallet import CreditWallet
from node.client.failover import FailoverPolicy, generate
from node.client.paying import UnpaidError
from node.client.replicas import ReplicaCircuits
from node.client.sampling import SamplingConfig
from node.client.types import Hop
from node.gateway.engine import Generation
from node.gateway.errors import planet_error_body
from protocol.errors import RemoteError
from tests.unit.gateway_fakes import CHAT, RawClient
from tests.unit.test_gateway_hangups import deposit, env, settled

pytestmark = pytest.mark.unit

__all__ = ["env"]  # the fixture: a gateway over scripted nodes (test_gateway_hangups.py)

NODE = "http://127.0.0.1:9"
REFUSAL = "this node computes paid positions only: 0 credits paid for 0 positions of this session"
QUICK = FailoverPolicy(attempts=4, backoff_s=0.0, backoff_max_s=0.0, stall_s=None)


def _unpaid() -> UnpaidError:
    return UnpaidError(NODE, 0, REFUSAL)


class _Refusing:
    """A circuit source whose every circuit is refused with `error` as it starts."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.leases: list[tuple[frozenset[int], bool]] = []
        self.circuits: list[Any] = []

    @contextlib.asynccontextmanager
    async def lease(
        self,
        replace: frozenset[int],
        *,
        failed: bool = True,
        accused: frozenset[int] = frozenset(),
    ) -> AsyncIterator[Any]:
        self.leases.append((replace, failed))
        raise self.error
        yield  # an async generator, never reached

    async def probe(self) -> set[int]:
        return {0}  # the refusing hop

    def outpriced(self, hops: Any) -> set[int]:
        return set()

    def observe(self, urls: Any, pass_s: float) -> None:
        pass


async def _drain(source: _Refusing, policy: FailoverPolicy = QUICK) -> list[int]:
    tokens = generate(source, None, [1, 2, 3], max_new_tokens=4, policy=policy)  # type: ignore[arg-type]
    return [t async for t in tokens]


async def test_the_failover_loop_does_not_replay_a_refusal_for_unpaid_positions() -> None:
    source = _Refusing(_unpaid())
    with pytest.raises(UnpaidError) as refused:
        await _drain(source)
    assert source.leases == [(frozenset(), True)]  # one circuit: no replacement asked for
    error = refused.value
    assert error.code == "payment_required" and error.http_status == 402
    assert REFUSAL in error.message and NODE in error.message
    assert error.hint and "--credits" in error.hint and "planet credits buy" in error.hint


async def test_a_paid_clients_payment_required_is_still_a_node_failure_and_fails_over() -> None:
    # the client paid that node (its refusal is the node's: a credit it could not check, a
    # price above the announced one): another replica would not share it
    paid = RemoteError(f"node {NODE} (shard 0)", "payment_required", REFUSAL, http_status=502)
    source = _Refusing(paid)
    with pytest.raises(RemoteError) as refused:
        await _drain(source)
    assert not isinstance(refused.value, UnpaidError)
    assert len(source.leases) == 1 + QUICK.attempts  # replaced each time, the hop blamed
    assert all(replace == frozenset({0}) and failed for replace, failed in source.leases[1:])


async def test_the_gateways_generation_hands_the_refusal_on_by_name_not_as_node_failed() -> None:
    generation = Generation(
        router=None,  # type: ignore[arg-type]  # only its source is used here
        head=None,  # type: ignore[arg-type]
        circuits=None,  # type: ignore[arg-type]
        prompt_ids=[1, 2, 3],
        max_tokens=4,
        sampling=SamplingConfig(),
        logprobs=False,
        top_logprobs=0,
        stall_s=1.0,
    )
    generation.policy = QUICK
    source = _Refusing(_unpaid())
    generation.source = source  # type: ignore[assignment]
    with pytest.raises(UnpaidError):
        _ = [event async for event in generation.events()]
    assert len(source.leases) == 1
    status, body = planet_error_body(_unpaid())
    assert status == 402
    assert body["error"]["type"] == "payment_required"
    assert body["error"]["code"] == "payment_required"


async def test_a_gateway_answers_the_refusal_402_payment_required_and_charges_nothing(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    body = {**CHAT, "max_tokens": 8}
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", body, key)
    script.fail(_unpaid())
    head = await client.reader.read(4096)
    assert b" 402 " in head
    assert b'"type": "payment_required"' in head or b'"type":"payment_required"' in head
    assert b"payment_required" in head.split(b"\r\n\r\n", 1)[1]
    await settled(gateway)
    assert gateway.desk.receipt(query) is None and gateway.desk.in_flight() == (0, 0)


def _replicas(prices: dict[str, int], credits: CreditWallet | None) -> ReplicaCircuits:
    hops = [Hop(url=url, shard=0) for url in prices]
    source = ReplicaCircuits(
        None,  # type: ignore[arg-type]  # `pick` dials nothing
        hops,
        expected={0: ("m", (0, 2))},
        hidden_size=8,
        credits=credits,
        min_credit_positions=16,
    )
    source.prices.update(prices)  # what each asks in its /info …
    source.checked.update(prices)  # … and registered on the chain
    return source


def test_a_client_that_pays_no_node_is_sent_to_a_free_replica_first(tmp_path: Path) -> None:
    free, charging = "http://127.0.0.1:1", "http://127.0.0.1:2"
    unpaid = _replicas({charging: 8, free: 0}, None)
    assert {unpaid.pick(0).url for _ in range(40)} == {free}
    # only charging nodes serve the shard: one of them (it refuses, by name, at once)
    assert _replicas({charging: 8}, None).pick(0).url == charging
    # a paying client: the nodes it pays at its floor (16 positions a credit) before dearer ones
    cheap, dear = "http://127.0.0.1:3", "http://127.0.0.1:4"
    paying = _replicas({dear: 8, cheap: 32}, CreditWallet(tmp_path / "credits.json"))
    assert {paying.pick(0).url for _ in range(40)} == {cheap}
