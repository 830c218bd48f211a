"""`planet join --model M` without `--shard` against a real committee: one CometBFT v0.38
validator with the committee app (real processes, real txs, CometBFT's `abci_query`).

Three operators join in turn. Each asks the committee for the pool the way `planet join` does
(`operator.place`: `/nodes?model=M&role=compute` through a `CommitteeLink`, parsed, weakest
shard chosen), then registers its node on the chosen shard as its agent would (`register_node`,
a heartbeat) and the validator attests its stake, so it is routable before the next operator
asks. The three cover shards 0, 1 and 2 without being told; a fourth doubles up on shard 0; a
node of another model and a registered node that is not routable yet do not fill a shard; the
already registered key of operator 1 keeps its shard 1. EVM staking and the compute node
processes are left out (the devnet e2e covers them): the committee's answer is what placement
reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from harness.gateway_net import Committee, start_committee, wait_for
from node.cli import operator
from node.config import resolve_config
from protocol.committee.envelope import sign
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of

pytestmark = pytest.mark.integration

MODEL = "sha256:" + hashlib.sha256(b"auto-shard model").hexdigest()
OTHER_MODEL = "sha256:" + hashlib.sha256(b"another model").hexdigest()
SHARDS = 3


@pytest.fixture(scope="module")
def committee(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Committee]:
    root = tmp_path_factory.mktemp("auto-shard")
    chain = start_committee(
        root,
        address_of(hashlib.sha256(b"auto-shard operator").digest()),
        # nodes here send one heartbeat: keep them SERVING and registered for the whole test
        app_state={"heartbeat_timeout": 100_000, "registration_ttl": 100_000},
    )
    try:
        yield chain
    finally:
        chain.stop()


def _operator_key(name: str) -> SigningKey:
    return SigningKey(hashlib.sha256(b"auto-shard node/" + name.encode()).digest())


def _register(
    committee: Committee, name: str, model: str, shard: int, *, routable: bool = True
) -> str:
    """What a joined node's agent sends (register_node, heartbeat) and, when `routable`, the
    validator's stake attestation; returns once the committee lists the node as asked."""
    key = _operator_key(name)
    public = key.verify_key.encode().hex()
    evm_key = hashlib.sha256(b"auto-shard evm/" + name.encode()).digest()
    body = RegisterNode(
        evm_address=address_of(evm_key),
        evm_signature=sign_registration(evm_key, public),
        role="compute",
        model=model,
        shards=(shard,),
        endpoint=f"http://10.9.0.{len(name)}:8000",
        capacity=8,
    )
    assert committee.submit(sign(body, key, 1).encode())["code"] == 0
    if routable:
        assert committee.submit(sign(Heartbeat(), key, 2).encode())["code"] == 0
        assert committee.submit(committee.validator_sign(AttestStake(public, 10**18)))["code"] == 0
    wait_for(
        lambda: committee.query(f"/node?key={public}")["routable"] is routable,
        20,
        f"{name} did not become {'routable' if routable else 'registered'}",
    )
    return public


def _place(committee: Committee, home: Path, key: str) -> Any:
    """`planet join`'s placement step, as the CLI runs it for an operator home."""
    config = resolve_config({"home": home, "committee_rpc": committee.rpc}, env={})
    return operator.place(config, MODEL, SHARDS, key)


def test_three_nodes_joined_with_model_only_cover_every_shard(
    committee: Committee, tmp_path: Path
) -> None:
    # not filling any shard of MODEL: another model's node, and one registered but not routable
    _register(committee, "elsewhere", OTHER_MODEL, 0)
    _register(committee, "unstaked-shard-2", MODEL, 2, routable=False)

    chosen, reasons = [], []
    for i in range(4):
        name = f"operator-{i}"
        own = _operator_key(name).verify_key.encode().hex()
        placement = _place(committee, tmp_path / name, own)
        chosen.append(placement.shard)
        reasons.append(placement.reason)
        _register(committee, name, MODEL, placement.shard)

    assert chosen == [0, 1, 2, 0], reasons
    assert reasons[0] == (
        "shard 0 of 3: it has 0 routable nodes (shard 1 has 0, shard 2 has 0 + 1 joining)"
        "; ties go to the lowest shard index"
    )
    assert reasons[2] == (
        "shard 2 of 3: it has 0 routable nodes + 1 joining (shards 0 and 1 have 1 each)"
    )
    assert reasons[3] == (
        "shard 0 of 3: it has 1 routable node (shard 1 has 1, shard 2 has 1 + 1 joining)"
        "; ties go to the lowest shard index"
    )
    health = committee.query(f"/pool_health?model={MODEL}&shards={SHARDS}")
    assert health["routable_per_shard"] == [2, 1, 1]

    # operator 1 joins again from its home: its key is registered for shard 1, it stays there
    again = _place(
        committee, tmp_path / "operator-1", _operator_key("operator-1").verify_key.encode().hex()
    )
    assert again.shard == 1 and "already registered" in again.reason
