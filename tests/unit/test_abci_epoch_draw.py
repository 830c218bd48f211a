"""The epoch boundary's challenge draw (and `/pool_health`'s routable counts) come from the
staked pools (`pool/<model>/<key>`, registry.py `staked_serving`), never from a scan of every
registration:
registering and heartbeating cost nothing, so a stranger's free nodes must neither make the
boundary (FinalizeBlock of every validator) read more nor dilute the challenges that staked
nodes receive. docs/committee.md *Epochs*."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from nacl.signing import SigningKey

from abci_app import coverage, epochs, settlement, verdicts
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.registry import AttestStake, Heartbeat, Leave
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import ask, hexkey, make_routable, register_body

pytestmark = pytest.mark.unit

SEED = b"\x07" * 32
STAKE = 10**18
# the epoch-boundary rules that EndBlock runs at height e·L (abci_app/machine.py `end_block`)
BOUNDARY: tuple[tuple[Any, str], ...] = (
    (settlement, "close"),
    (coverage, "close"),
    (verdicts, "settle_accusations"),
    (epochs, "close_epoch"),
)


def boundary_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The (namespace, key) of every record `State` reads from the store (lookups and range-scan
    rows) while an epoch-boundary rule runs."""
    reads: list[tuple[str, str]] = []
    active = [False]
    committed, items = State.committed, State.committed_items

    def counted(state: State, ns: str, key: str) -> Any:
        if active[0]:
            reads.append((ns, key))
        return committed(state, ns, key)

    def counted_items(state: State, ns: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for key, value in items(state, ns, *args, **kwargs):
            if active[0]:
                reads.append((ns, key))
            yield key, value

    def watched(rule: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            active[0] = True
            try:
                return rule(*args, **kwargs)
            finally:
                active[0] = False

        return run

    monkeypatch.setattr(State, "committed", counted)
    monkeypatch.setattr(State, "committed_items", counted_items)
    for module, name in BOUNDARY:
        monkeypatch.setattr(module, name, watched(getattr(module, name)))
    return reads


def stake(chain: Chain, keys: list[SigningKey]) -> None:
    txs = [
        chain.tx(AttestStake(hexkey(k), STAKE), v.key) for k in keys for v in chain.validators[:3]
    ]
    assert {r.code for r in chain.block(txs)} == {Code.OK}


def join(chain: Chain, labels: list[str]) -> list[SigningKey]:
    """Register `labels` as compute nodes of model m, all in one block."""
    keys = [seeded_key(label) for label in labels]
    results = chain.block(
        [chain.tx(register_body(x), k) for x, k in zip(labels, keys, strict=True)]
    )
    assert {r.code for r in results} == {Code.OK}
    return keys


def beat(chain: Chain, keys: list[SigningKey]) -> None:
    assert {r.code for r in chain.block([chain.tx(Heartbeat(), k) for k in keys])} == {Code.OK}


def challenged(chain: Chain, epoch: int) -> list[str]:
    [record] = ask(chain, f"/epochs?epoch={epoch}")["epochs"]
    return [c["node"] for c in record["challenges"]]


def closed_with_strangers(strangers: int, reads: list[tuple[str, str]]) -> tuple[Chain, list]:
    """3 staked SERVING nodes; `strangers` free registrations heartbeating (SERVING, unstaked)
    when epoch 2 closes at height 10 (epoch_length 5); returns the chain and what that close
    read (`reads`: the `boundary_reads` recorder)."""
    chain = Chain(genesis={"models": {"m": {"shards": 1}}, "heartbeat_timeout": 1000})
    staked = join(chain, ["s1", "s2", "s3"])  # height 1
    for key in staked:
        make_routable(chain, key)  # heights 2-4
    free = join(chain, [f"x/{i}" for i in range(strangers)]) if strangers else []  # height 5
    if free:
        beat(chain, free)  # height 6
    chain.advance_to(9)
    reads.clear()
    chain.block(block_hash=SEED)  # height 10 closes epoch 2, fixes epoch 3
    return chain, list(reads)


def test_free_nodes_cost_the_epoch_boundary_no_read_and_are_never_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = boundary_reads(monkeypatch)
    flooded, reads = closed_with_strangers(40, recorder)
    strangers = {hexkey(seeded_key(f"x/{i}")) for i in range(40)}
    statuses = {ask(flooded, f"/node?key={k}")["status"] for k in strangers}
    assert statuses == {"SERVING"}  # in the registry, serving, unstaked
    touched = [(ns, key) for ns, key in reads if any(s in key for s in strangers)]
    assert touched == []  # was 80: each stranger's registry row and its node record
    staked = sorted(hexkey(seeded_key(label)) for label in ("s1", "s2", "s3"))
    assert challenged(flooded, 3) == staked
    # the close reads exactly as much as on the same chain without a single stranger
    bare, bare_reads = closed_with_strangers(0, recorder)
    assert len(reads) == len(bare_reads)
    assert challenged(bare, 3) == staked


def draw_chain(limit: int, seed: bytes = SEED) -> tuple[Chain, dict[str, SigningKey]]:
    """Staked SERVING a-d; staked e gone DOWN by the close; staked f that left; unstaked g
    SERVING; epoch 2 closes at height 10 with block hash `seed`."""
    chain = Chain(genesis={"challenges_per_epoch": limit})  # heartbeat_timeout 4
    labels = list("abcdefg")
    keys = dict(zip(labels, join(chain, labels), strict=True))  # height 1
    stake(chain, [keys[x] for x in "abcdef"])  # 2
    beat(chain, [keys["e"]])  # 3: e's last heartbeat, DOWN at 8
    assert chain.block([chain.tx(Leave(), keys["f"])])[0].code == Code.OK  # 4
    chain.advance_to(8)
    beat(chain, [keys[x] for x in "abcdg"])  # 9
    chain.block(block_hash=seed)  # 10
    return chain, keys


def expected_draw(keys: list[str], limit: int, seed: bytes) -> list[str]:
    """docs/committee.md *Epochs*: ordered by sha256("planet/challenge" ‖ S ‖ key), the first
    `limit` (all when 0), listed by key."""
    ordered = sorted(
        keys, key=lambda k: hashlib.sha256(b"planet/challenge" + seed + bytes.fromhex(k)).digest()
    )
    return sorted(ordered[:limit] if limit else ordered)


@pytest.mark.parametrize("limit", [0, 2])
def test_the_draw_is_among_the_staked_serving_nodes_as_before(limit: int) -> None:
    chain, keys = draw_chain(limit)
    status = {x: ask(chain, f"/node?key={hexkey(k)}")["status"] for x, k in keys.items()}
    assert status == dict(
        zip("abcdefg", ["SERVING"] * 4 + ["DOWN", "LEFT", "SERVING"], strict=True)
    )
    serving_staked = [hexkey(keys[x]) for x in "abcd"]
    drawn = challenged(chain, 3)
    assert drawn == expected_draw(serving_staked, limit, SEED)
    assert len(drawn) == (limit or 4)
    assert hexkey(keys["g"]) not in drawn  # SERVING, but unstaked
    [record] = ask(chain, "/epochs?epoch=3")["epochs"]
    for entry in record["challenges"]:
        node = bytes.fromhex(entry["node"])
        tag = (3).to_bytes(8, "big")
        prompt = hashlib.sha256(b"planet/prompt" + SEED + node + tag).hexdigest()
        assert entry["prompt_seed"] == prompt


def test_the_draw_is_deterministic() -> None:
    chain, _ = draw_chain(2)
    twin, _ = draw_chain(2)
    assert ask(twin, "/epochs?epoch=3") == ask(chain, "/epochs?epoch=3")
    assert twin.state.app_hash == chain.state.app_hash
    # another block hash orders the same staked nodes anew, by the same rule
    other, keys = draw_chain(2, b"\x08" * 32)
    serving_staked = [hexkey(keys[x]) for x in "abcd"]
    assert challenged(other, 3) == expected_draw(serving_staked, 2, b"\x08" * 32)


def test_pool_health_counts_the_staked_serving_nodes() -> None:
    """/pool_health (read by placement; the close counted the same for the scarcity bonus until
    issue 42) counts SERVING, staked, trusted, not flagged nodes: a-d, not e (DOWN), f (LEFT)
    nor g (unstaked)."""
    chain, _ = draw_chain(0)
    assert ask(chain, "/pool_health?model=m")["routable_per_shard"] == [4]
