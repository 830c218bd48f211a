"""The ring's money rules (docs/overlay.md, *The ring*): in-process tiny-model nodes that charge
per chunk, checking credits against the in-process committee chain (tests/unit/test_paid_circuit.py
builds them). The loop runs only as far as every hop's credits cover; the client pays ahead by
less than two chunks; a client that stops paying is stopped by name; one that hangs up leaves
every hop with what it was paid and nothing computed unpaid; a first node that lies about a
token is caught by the client, which closes the session and pays nothing more."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

import node.server.ring as server_ring
from node.client.circuit import CircuitClient
from node.client.paying import CreditPayer
from node.client.ring import generate_ring
from node.server.app import STATE_KEY
from protocol.errors import RemoteError
from protocol.ring import RingMismatchError
from tests.unit.ring_nodes import greedy_tokens, learn_features
from tests.unit.test_paid_circuit import PRICE, _paid_nodes, _paying_client
from tests.unit.test_paid_circuit import tiny as tiny  # the module's fixture

pytestmark = pytest.mark.unit

STEPS = 30


def _expected(model: Any, ids: list[int], steps: int = STEPS) -> list[int]:
    return greedy_tokens(model, ids, steps)


def _state(servers: list[Any]) -> list[Any]:
    return [server.app[STATE_KEY] for server in servers]


def _never_unpaid(servers: list[Any]) -> None:
    """No node computed a position its credits did not cover (one session each here)."""
    for state in _state(servers):
        assert state.tokens <= state.payments.accepted * PRICE


async def _settle(condition: Any) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.02)


async def test_ring_paid_same_tokens_and_credits_as_the_client_loop_never_two_chunks_ahead(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, model = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 40)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    payer = CreditPayer(wallet, {h.url: PRICE for h in hops}, min_positions=PRICE)
    ahead: list[int] = []
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5, payer=payer) as client:
        await learn_features(client)
        assert client.ring_ready()
        tokens = []
        async for token in generate_ring(
            client, head, ids, max_new_tokens=STEPS, stop_on_eos=False
        ):
            tokens.append(token)
            _never_unpaid(servers)
            for state in _state(servers):  # credits a node holds beyond what it computed
                ahead.append(state.payments.accepted * PRICE - state.tokens)
    assert tokens == _expected(model, ids)
    computed = len(ids) + STEPS - 1  # the last token chosen is never fed
    per_node = -(-computed // PRICE)  # exactly what the client-driven loop pays
    assert [state.tokens for state in _state(servers)] == [computed, computed]
    assert payer.spent == 2 * per_node and wallet.count() == 40 - 2 * per_node
    assert [len(list(spool.held())) for spool in spools] == [per_node, per_node]
    assert max(ahead) < 2 * PRICE  # less than two chunks ahead of the work, at every token
    # the client-driven loop pays the same for the same answer
    before = payer.spent
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5, payer=payer) as client:
        direct = [
            t async for t in client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)
        ]
    assert direct == tokens and payer.spent - before == 2 * per_node


async def test_ring_client_that_stops_paying_is_stopped_by_name_no_position_unpaid(
    aiohttp_server, tiny, tmp_path
) -> None:
    """The client pays the prompt (ahead of each chunk, as always) and then nothing: the loop
    runs while the credits cover it, its next frame waits for a `pay`, then the session is
    refused `payment_required` and closed; no node computed a position it was not paid."""
    manifest, model = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 10)
    servers, hops, _ = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    payer = CreditPayer(wallet, {h.url: PRICE for h in hops}, min_positions=PRICE)
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5, payer=payer) as client:
        await learn_features(client)

        async def pays_nothing_more(sid: int, targets: Any) -> None:
            return None

        client.pay_upto = pays_nothing_more  # type: ignore[method-assign]
        tokens: list[int] = []
        with pytest.raises(RemoteError) as refused:
            async for token in generate_ring(
                client, head, ids, max_new_tokens=STEPS, stop_on_eos=False
            ):
                tokens.append(token)
    assert refused.value.code == "payment_required"
    paid = -(-len(ids) // PRICE) * PRICE  # the prompt's credits: their positions, no more
    assert tokens == _expected(model, ids)[: paid - len(ids) + 1]
    _never_unpaid(servers)
    assert _state(servers)[0].tokens == paid
    await _settle(lambda: all(len(s.store) == 0 for s in _state(servers)))
    assert [len(s.store) for s in _state(servers)] == [0, 0]  # closed, KV freed


async def test_ring_client_gone_mid_loop_loop_stops_nodes_keep_what_they_were_paid(
    aiohttp_server, tiny, tmp_path
) -> None:
    manifest, _ = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 20)
    servers, hops, spools = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    http = aiohttp.ClientSession()
    payer = CreditPayer(wallet, {h.url: PRICE for h in hops}, min_positions=PRICE)
    client = CircuitClient(hops, hidden_size=64, prefill_chunk=5, http=http, payer=payer)
    await client.__aenter__()
    await learn_features(client)
    got = 0
    answer = generate_ring(client, head, ids, max_new_tokens=STEPS, stop_on_eos=False)
    async for _ in answer:
        got += 1
        if got == 6:
            break
    await http.close()  # gone: the connections drop under the open sessions, no close sent
    for link in client.links:
        link.reader.cancel()
    taken = 20 - wallet.count()
    states = _state(servers)
    await _settle(lambda: all(len(s.store) == 0 for s in states))
    assert [len(s.store) for s in states] == [0, 0]  # the loop stopped, its sessions closed
    computed = [s.tokens for s in states]
    await asyncio.sleep(0.3)
    assert [s.tokens for s in states] == computed  # and nothing runs on
    _never_unpaid(servers)
    assert sum(s.payments.accepted for s in states) == taken  # every credit sent is kept
    assert sum(len(list(spool.held())) for spool in spools) == taken
    for state in states:  # and no hop holds two chunks beyond its work
        assert state.payments.accepted * PRICE - state.tokens < 2 * PRICE


async def test_ring_first_node_lying_about_a_token_is_caught_and_paid_no_more(
    aiohttp_server, tiny, tmp_path, monkeypatch
) -> None:
    """The first node's sampler picks another token at the 4th step (a node that lies about
    a token, or computes another head): the client's own head and sampler disagree on that
    token's row, so it raises `ring_token_mismatch` before yielding it, closes the session
    and pays nothing more."""
    manifest, model = tiny
    chain, node, wallet, head, ids = _paying_client(manifest, tmp_path, 20)
    servers, hops, _ = await _paid_nodes(aiohttp_server, manifest, tmp_path, chain, node)
    honest = server_ring.sample
    calls = {"n": 0}

    def lying(logits: Any, config: Any, rng: Any) -> int:
        calls["n"] += 1
        token = honest(logits, config, rng)
        return (token + 1) % len(logits) if calls["n"] == 4 else token

    monkeypatch.setattr(server_ring, "sample", lying)
    payer = CreditPayer(wallet, {h.url: PRICE for h in hops}, min_positions=PRICE)
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5, payer=payer) as client:
        await learn_features(client)
        tokens: list[int] = []
        with pytest.raises(RingMismatchError) as caught:
            async for token in generate_ring(
                client, head, ids, max_new_tokens=STEPS, stop_on_eos=False
            ):
                tokens.append(token)
        spent = payer.spent
        assert client.blame.get(max(client.blame)) == 0  # the first hop is the one blamed
        await asyncio.sleep(0.3)
        assert payer.spent == spent  # nothing paid after the lie
    assert caught.value.code == "ring_token_mismatch"
    assert tokens == _expected(model, ids)[:3]
    states = _state(servers)
    await _settle(lambda: all(len(s.store) == 0 for s in states))
    assert [len(s.store) for s in states] == [0, 0]
    _never_unpaid(servers)
