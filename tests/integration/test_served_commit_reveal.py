"""Commit-reveal of served work on real processes: a 1-validator committee (app + CometBFT), two
real SmolLM2 node processes (int8, 2 shards), shard 0 recording what it serves
(`--commit-dir`) and its agent committing and revealing.

A question is answered through the circuit → shard 0 spooled one record per block of 32
positions → its agent committed them in compact binary batches (on chain, as the node's key) →
after the epoch closed it revealed them → every reveal matches its commitment, no evidence.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.committee.generate import InitOptions, init_network
from deploy.committee.processes import stop_network
from deploy.committee.start import start_network
from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.keys import create_dev_wallet, create_node_key
from node.net import port_is_free
from node.procs import spawn_piped
from node.server.launcher import free_ports, start_node, stop_pid, wait_healthy
from protocol.committee.envelope import sign
from protocol.committee.registry import AttestStake
from protocol.fingerprint import BLOCK_POSITIONS
from protocol.served import SPOOL_MAGIC, decode_records
from tests.integration.test_abci_cometbft import validator_key

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# anvil's account 2 (public dev key of the default mnemonic): only signs the registration here
OPERATOR_KEY = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"
EPOCH_LENGTH = 4
MAX_NEW_TOKENS = 40


def _free(start: int, count: int = 1, step: int = 1) -> int:
    for base in range(start, start + 2000, step):
        if all(port_is_free(p) for p in range(base, base + count)):
            return base
    pytest.skip(f"no free ports from {start}")


def _query(rpc: str, path: str, **params: str) -> Any:
    full = path + ("?" + urllib.parse.urlencode(params) if params else "")
    url = f"{rpc}/abci_query?path=" + urllib.parse.quote(json.dumps(full))
    with urllib.request.urlopen(url, timeout=10) as answer:
        response = json.load(answer)["result"]["response"]
    if response.get("code", 0):
        return None
    return json.loads(base64.b64decode(response["value"]))


def _wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _attest_stake(committee: Any, node_key: str) -> None:
    """The single validator attests `node_key`'s stake, as its stake watcher would (no EVM
    here): only staked nodes commit (abci_app/commitments.py, NOT_STAKED)."""
    validator = committee.validators[0]
    key = validator_key(Path(validator.home))
    account = key.verify_key.encode().hex()
    nonce = _query(validator.rpc_url, "/nonce", account=account)["nonce"] + 1
    raw = sign(AttestStake(node_key, 10**18), key, nonce).encode()
    url = f"{validator.rpc_url}/broadcast_tx_sync?tx=0x{raw.hex()}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert json.load(answer)["result"]["code"] == 0


@pytest.fixture(scope="module")
def committee(tmp_path_factory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("served-committee")
    network = init_network(
        InitOptions(
            directory=root / "committee",
            validators=1,
            base_port=_free(23400, 10, 10),
            epoch_length=EPOCH_LENGTH,
        )
    )
    try:
        start_network(network, timeout_s=90)
        yield network
    finally:
        stop_network(network)


def test_node_commits_what_it_served_and_reveals_after_the_epoch(committee, tmp_path) -> None:
    from node.model.prepare import prepare

    rpc = committee.validators[0].rpc_url
    home = tmp_path / "operator"
    create_dev_wallet(home / "wallet.json", "pw", OPERATOR_KEY)
    node_key = create_node_key(home / "node_key.json", "pw").verify_key.encode().hex()
    manifest = Path(prepare(parts=2, quant="int8", progress=lambda _m: None))
    spool_dir = home / "run" / "served"
    ports = free_ports(2, 21700, 21800)
    nodes = [
        start_node(
            manifest=manifest,
            shard=0,
            port=ports[0],
            run_dir=home / "run",
            extra_args=[
                "--commit-dir",
                str(spool_dir),
                "--next-hops",
                f"http://127.0.0.1:{ports[1]}",
            ],
        ),
        start_node(manifest=manifest, shard=1, port=ports[1], run_dir=tmp_path / "plain"),
    ]
    agent = None
    log_path = home / "agent.log"
    try:
        wait_healthy(nodes, timeout_s=240)
        with open(log_path, "wb") as log_file:
            agent = spawn_piped(
                [
                    sys.executable, "-m", "node.agent", "--home", str(home),
                    "--manifest", str(manifest), "--shard", "0",
                    "--endpoint", nodes[0].url, "--committee-rpc", rpc,
                    "--commit-dir", str(spool_dir),
                ],
                env={**os.environ, "PLANET_PASSWORD": "pw"},
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait(lambda: _query(rpc, "/node", key=node_key), 60, f"registration ({log_path})")
        _attest_stake(committee, node_key)
        _wait(
            lambda: (_query(rpc, "/node", key=node_key) or {}).get("stake") == str(10**18),
            30,
            "the stake attested",
        )

        from node.model.head import ClientHead

        head = ClientHead.load(manifest, device="cpu")
        ids = head.chat_ids([{"role": "user", "content": "Name three rivers in Europe."}])

        async def ask() -> list[int]:
            hops = [Hop(url=n.url, shard=n.shard) for n in nodes]
            async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
                return [t async for t in client.generate(head, ids, max_new_tokens=MAX_NEW_TOKENS)]

        tokens = asyncio.run(ask())
        # shard 0 computed the prompt and the generated tokens fed back (all but the last one,
        # or all of them when an end-of-sequence token, never fed back, stopped the answer)
        least = -(-(len(ids) + len(tokens) - 1) // BLOCK_POSITIONS)

        def spooled() -> list[Any]:
            records = []
            for path in sorted(spool_dir.glob("served-*.bin")):
                records += decode_records(path.read_bytes()[len(SPOOL_MAGIC) :])
            return records

        # the client closed its session, so the last partial block is sealed at once
        records = _wait(lambda: len(spooled()) >= least and spooled(), 30, "the sealed block")
        blocks = len(records)
        assert least <= blocks <= -(-(len(ids) + len(tokens)) // BLOCK_POSITIONS)
        assert [(r.step, r.shard) for r in records] == [(b, 0) for b in range(blocks)]
        assert len({r.session for r in records}) == 1

        session = records[0].session_hex
        on_chain = _wait(
            lambda: (
                len(c := _query(rpc, "/commitments", node=node_key)["commitments"]) == blocks and c
            ),
            60,
            f"{blocks} commitments on chain ({log_path})",
        )
        assert {c["session"] for c in on_chain} == {session}
        by_step = {r.step: r for r in records}
        for item in on_chain:
            assert item["commitment"] == "0x" + by_step[item["step"]].commitment().hex()

        def all_revealed() -> list[dict[str, Any]] | None:
            items = _query(rpc, "/commitments", node=node_key)["commitments"]
            return items if all("match" in item for item in items) else None

        revealed = _wait(all_revealed, 90, f"the reveals after the epoch closed ({log_path})")
        assert [c["match"] for c in revealed] == [True] * blocks
        for item in revealed:
            assert item["output_hash"] == "0x" + by_step[item["step"]].output_hash.hex()
            assert item["revealed_height"] > EPOCH_LENGTH * (
                (item["height"] - 1) // EPOCH_LENGTH + 1
            )  # after the commitment's epoch closed
        assert _query(rpc, "/evidence")["evidence"] == []
        assert agent.poll() is None, log_path.read_text()[-2000:]
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        for node in nodes:
            stop_pid(node.pid, grace_s=5)


def test_hostile_binary_batches_refused_by_name_through_cometbft(committee) -> None:
    """Malformed binary batches sent to a real validator's RPC get CheckTx code 1 (named), a
    forged one code 2, and the validator keeps committing blocks."""
    from nacl.signing import SigningKey

    from node.chain.committee_rpc import CommitteeRpc
    from protocol import commit_batch as cb

    key = SigningKey(b"\x07" * 32)
    raw = cb.encode_batch(cb.KIND_COMMIT, b"\x01" * 32, [(1, 0, b"\x02" * 32)], key, 1)
    forged = raw[:-1] + bytes([raw[-1] ^ 1])
    hostile = {
        "truncated": (raw[:-1], 1, "truncated"),
        "trailing": (raw + b"\x00", 1, "after the signature"),
        "unknown kind": (raw[:4] + b"\x09" + raw[5:], 1, "unknown kind"),
        "count zero": (raw[:77] + b"\x00\x00" + raw[79:], 1, "count 0"),
        "forged": (forged, 2, "signature"),
    }

    async def send() -> dict[str, Any]:
        async with CommitteeRpc(committee.validators[0].rpc_url) as rpc:
            answers = {
                name: await rpc.broadcast_tx_sync(tx, check=False)
                for name, (tx, _, _) in hostile.items()
            }
            height = (await rpc.status()).latest_block_height
            await rpc.wait_for_height(height + 2, timeout_s=30)
            return answers

    answers = asyncio.run(send())
    for name, (_, code, words) in hostile.items():
        assert answers[name].code == code, (name, answers[name])
        assert words in answers[name].log, (name, answers[name].log)
