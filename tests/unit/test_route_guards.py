"""A personal client's private route (node/gateway/guards.py, Router(route="private")): one node
per shard drawn uniformly and kept, so a fast or lying stranger does not draw the user's hops."""

from __future__ import annotations

import json
import logging
import random
import stat
from pathlib import Path

import pytest

from node.gateway.guards import ROTATE_S, Guards
from node.gateway.router import ROUTES, RoutableNode, Router
from tests.unit.test_gateway_router import Source, _seen, entry

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "0" * 64


def _router(
    keys: list[str], route: str, *, guards: Guards | None = None, seed: int = 0, shards: int = 1
) -> Router:
    entries = [
        entry(key=k, endpoint=f"http://127.0.0.1:{9000 + i}", shards=[i % shards])
        for i, k in enumerate(keys)
    ]
    router = Router(
        Source(entries),
        model_hash=MODEL,
        shard_layers=[(0, 30)] if shards == 1 else [(0, 15), (15, 30)],
        http=None,  # type: ignore[arg-type]
        refresh_s=0,
        public_only=False,  # loopback test endpoints
        route=route,
        guards=guards,
    )
    router._random = random.Random(seed)  # reproducible draws (production: system randomness)

    async def verified(node: RoutableNode) -> bool:
        return True

    router._verify = verified  # type: ignore[method-assign]
    return router


def _keys(count: int) -> list[str]:
    return [f"{i + 1:02x}" * 32 for i in range(count)]


async def _first_hops(keys: list[str], route: str, fast: str, clients: int) -> int:
    """How many of `clients` fresh clients (each its own router) take `fast` for shard 0,
    where `fast` is really 3× faster than every other node (and says so)."""
    taken = 0
    for seed in range(clients):
        router = _router(keys, route, seed=seed)
        for i, key in enumerate(keys):
            _seen(router, f"http://127.0.0.1:{9000 + i}", 0.05 if key == fast else 0.15)
        taken += (await router.circuit()).keys[0] == fast
    return taken


async def test_a_fast_stranger_draws_a_cost_client_but_only_its_share_of_private_ones() -> None:
    """Two replicas, one 3× faster: choosing by cost sends every client to it; the private
    route sends each client there with probability 1/2 (its fraction of the shard)."""
    keys = _keys(2)
    fast = keys[1]
    assert await _first_hops(keys, "cost", fast, 200) == 200
    private = await _first_hops(keys, "private", fast, 200)
    assert 70 <= private <= 130, private  # binomial(200, 1/2): mean 100, sd ~7
    # five replicas, one of them the fast stranger: about a fifth of the clients
    keys = _keys(5)
    private = await _first_hops(keys, "private", keys[0], 400)
    assert 50 <= private <= 110, private  # binomial(400, 1/5): mean 80, sd 8


async def test_the_private_route_keeps_its_guard_for_every_question_and_across_restarts(
    tmp_path: Path,
) -> None:
    keys = _keys(8)  # 4 per shard over 2 shards
    path = tmp_path / "route.json"
    router = _router(keys, "private", guards=Guards(path, MODEL), shards=2)
    first = await router.circuit()
    assert {(await router.circuit()).keys for _ in range(50)} == {first.keys}
    # no move for speed: the guard seen 3× slower than every replica stays
    for i, key in enumerate(keys):
        _seen(router, f"http://127.0.0.1:{9000 + i}", 0.15 if key in first.keys else 0.05)
    router.costs.observe_circuit([n.endpoint for n in first.nodes], 0.5)
    assert router.outpriced(first) == set()
    assert (await router.circuit()).keys == first.keys
    # kept on disk, readable by the user only; a restarted client takes the same nodes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert [g["key"] for g in doc["models"][MODEL].values()] == list(first.keys)
    for seed in range(5):
        again = _router(keys, "private", guards=Guards(path, MODEL), seed=seed + 1, shards=2)
        assert (await again.circuit()).keys == first.keys


async def test_the_private_route_draws_again_when_its_guard_fails_leaves_or_rotates(
    tmp_path: Path,
) -> None:
    keys = _keys(4)
    now = [1_800_000_000.0]
    path = tmp_path / "route.json"
    guards = Guards(path, MODEL, clock=lambda: now[0])
    router = _router(keys, "private", guards=guards)
    first = await router.circuit()
    # the guard fails a question: it cools down and another node, drawn at random, is kept
    replaced = await router.replace(first, [0])
    assert replaced.keys[0] != first.keys[0]
    assert {(await router.circuit()).keys[0] for _ in range(20)} == {replaced.keys[0]}
    assert Guards(path, MODEL).get(0) == replaced.keys[0]
    # the guard leaves the directory (not routable any more): drawn again among the rest
    source: Source = router.source  # type: ignore[assignment]
    source.entries = [e for e in source.entries if e["key"] != replaced.keys[0]]
    after_leave = (await router.circuit()).keys[0]
    assert after_leave not in (replaced.keys[0], first.keys[0])  # the first one still cools
    # rotation: after ROTATE_S each circuit's guard is a fresh uniform draw (then kept)
    drawn = set()
    for _ in range(12):
        now[0] += ROTATE_S
        drawn.add((await router.circuit()).keys[0])
        assert (await router.circuit()).keys[0] in drawn
    assert len(drawn) >= 2


def _file(guards: object) -> bytes:
    return json.dumps({"version": 1, "models": {MODEL: guards}}).encode()


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        json.dumps({"version": 2, "models": {}}).encode(),
        json.dumps({"version": 1, "models": []}).encode(),
        _file([]),
        _file({"0": {"key": "AB" * 32, "drawn_at": 1}}),
        _file({"0": {"key": "ab" * 32, "drawn_at": True}}),
        _file({"0": {"key": "ab" * 32, "drawn_at": -1}}),
        _file({"x": {"key": "ab" * 32, "drawn_at": 1}}),
        _file({"٣": {"key": "ab" * 32, "drawn_at": 1}}),
        _file({"9" * 5000: {"key": "ab" * 32, "drawn_at": 1}}),
        _file({"0": "ab" * 32}),
        b" " * (2 << 20),
    ],
)
def test_a_guards_file_that_does_not_parse_is_not_trusted(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "route.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="node.gateway.guards"):
        guards = Guards(path, MODEL, clock=lambda: 2.0)
    assert guards.get(0) is None
    assert "not trusted" in caplog.text
    guards.keep(0, "cd" * 32)  # a new draw replaces the file
    assert Guards(path, MODEL, clock=lambda: 2.0).get(0) == "cd" * 32


def test_each_model_has_its_own_guards_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "route.json"
    other = "sha256:" + "1" * 64
    Guards(path, other).keep(0, "ab" * 32)
    assert Guards(path, MODEL).get(0) is None  # another model's guard is not this model's
    Guards(path, MODEL).keep(0, "cd" * 32)  # ... and drawing this one keeps the other
    assert Guards(path, other).get(0) == "ab" * 32 and Guards(path, MODEL).get(0) == "cd" * 32


def test_route_flag_only_for_a_personal_client(capsys: pytest.CaptureFixture[str]) -> None:
    from node.cli import gateway as cli
    from planet.main import main

    assert set(cli.ROUTES) == set(ROUTES)
    code = main(["gateway", "serve", "--route", "private"])
    err = capsys.readouterr().err
    assert code != 0 and "--route is a personal client's choice" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as caught:
        main(["gateway", "serve", "--personal", "--route", "fastest"])
    assert caught.value.code == 2
    assert "invalid choice: 'fastest'" in capsys.readouterr().err


async def test_the_uniform_route_draws_afresh_for_every_question_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    """A verifier's client: its challenges reach every routable node, the fast one no more
    often than the others, and no guard is written."""
    keys = _keys(4)
    path = tmp_path / "route.json"
    router = _router(keys, "uniform", guards=Guards(path, MODEL))
    for i, key in enumerate(keys):
        _seen(router, f"http://127.0.0.1:{9000 + i}", 0.05 if key == keys[0] else 0.15)
    picks = [(await router.circuit()).keys[0] for _ in range(400)]
    assert set(picks) == set(keys)
    assert 70 <= picks.count(keys[0]) <= 130, picks.count(keys[0])  # binomial(400, 1/4)
    assert not path.exists()
