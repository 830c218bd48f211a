"""A network whose nodes commit what they serve and answer spot checks, for
tests/e2e/test_spotcheck_network.py.

On top of harness/verifier_net.py (anvil + contracts, one CometBFT validator with the committee
app, staked compute nodes, the gateway, `planet verifier serve`; every process real): the
committee starts first, then every node runs as `planet node serve --commit-dir DIR --node-key
FILE --committee-rpc URL --spot-check-ppm PPM` (its served-work log is the ticket book; its key
file is the key it is registered with) or, with a cheat mode, as tests/doubles/cheating_node.py
with the same arguments and `--cheat MODE`; the test process commits and reveals each node's
spool with the agent's own `Committer` (the nonce counter is shared with the heartbeat thread,
so the two never reuse a nonce), and the verifier runs with the same `--spot-check-ppm`, which
genesis also names (`spot_check_ppm`), and challenges from the public text
(`--challenge-source corpus`: they only make the traffic the nodes commit).

    net = SpotNet.start(run_dir, manifest, nodes=[(0, ""), (1, "noise:0.5:8")], ppm=10**6)
    ...
    net.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from eth_utils import keccak

from harness.gateway_net import (
    PASSWORD,
    Committee,
    Compute,
    GatewayNet,
    ephemeral_port,
    wait_for,
)
from harness.verifier_net import VerifierNet
from node.agent.commitments import Committer
from node.chain.committee_rpc import TxRejectedError
from node.keys import PASSWORD_ENV, create_node_key
from node.server.launcher import NODE_MARKER, start_node, wait_healthy
from protocol.commit_batch import sign_batch
from protocol.committee.envelope import sign
from tests.doubles import cheating_node


class NodeLink:
    """The committer's link for one test node: signs with the node key and the node's shared
    nonce counter, submits through the validator's RPC."""

    def __init__(self, committee: Committee, node: Compute) -> None:
        self.committee = committee
        self.node = node

    async def submit(self, body: Any, *, binary: bool = False) -> Any:
        nonce = self.node.next_nonce()
        raw = (
            sign_batch(body, self.node.key, nonce).raw
            if binary
            else sign(body, self.node.key, nonce).encode()
        )
        checked = await asyncio.to_thread(
            self.committee.call, "broadcast_tx_sync", tx="0x" + raw.hex()
        )
        if checked["code"] != 0:
            raise TxRejectedError(
                self.committee.rpc, code=int(checked["code"]), log_text=checked.get("log", "")
            )
        return SimpleNamespace(hash=checked["hash"], nonce=nonce)

    async def committed(self, tx_hash: str, *, timeout_s: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = await asyncio.to_thread(self.committee.call, "tx", hash="0x" + tx_hash)
                result = found["tx_result"]
                return SimpleNamespace(
                    code=int(result.get("code", 0)),
                    log=result.get("log", ""),
                    height=int(found["height"]),
                )
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tx {tx_hash[:12]} not committed") from None
                await asyncio.sleep(0.3)


class SpotNet(VerifierNet):
    def __init__(self, net: GatewayNet) -> None:
        super().__init__(net)
        self.spools: list[tuple[Compute, Path]] = []
        self._committing: threading.Thread | None = None
        self._stop = threading.Event()
        self.commit_errors: list[str] = []

    @classmethod
    def start(  # type: ignore[override]
        cls,
        run_dir: Path,
        manifest: Path,
        *,
        nodes: list[tuple[int, str]],  # (shard, cheat mode or "")
        ppm: int,
        epoch_blocks: int = 20,
        challenges: int = 2,
        ticket_deadline_s: int = 20,
    ) -> SpotNet:
        net = GatewayNet(run_dir, manifest)
        self = cls(net)
        try:
            net.start_chain()
            net.start_committee(
                epoch_length=epoch_blocks, with_evm=True, app_state={"spot_check_ppm": ppm}
            )
            for shard, mode in nodes:
                self._start_node(shard, mode, ppm)
            wait_healthy([c.process for c in net.nodes], timeout_s=240)
            for node in net.nodes:
                net.register(node, stake=True)
            net.start_heartbeats()
            net.start_gateway()
            wait_for(self._all_routable, 60, "the nodes are not all routable")
            self._committing = threading.Thread(target=self._commit_forever, daemon=True)
            self._committing.start()
            self.start_verifier(
                challenges,
                1,
                (
                    *("--spot-check-ppm", str(ppm), "--ticket-deadline", str(ticket_deadline_s)),
                    # its challenges only make the traffic the nodes commit: windows of the
                    # public text, not a text its reference writes for every epoch (112
                    # tokens, ~8 CPU-s: longer than a 20-block epoch, so it never idled)
                    *("--challenge-source", "corpus"),
                ),
            )
        except BaseException:
            self.close()
            raise
        return self

    def _start_node(self, shard: int, mode: str, ppm: int) -> Compute:
        net = self.net
        assert net.committee is not None
        node_dir = net.run_dir / f"node-{len(net.nodes)}"
        node_dir.mkdir(parents=True)
        key_file, spool = node_dir / "node_key.json", node_dir / "served"
        key = create_node_key(key_file, PASSWORD)
        cheat = cheating_node.cheat_args(mode) if mode else ()
        process = start_node(
            manifest=net.manifest_path,
            shard=shard,
            port=ephemeral_port(),
            run_dir=node_dir,
            extra_args=(
                *("--threads", "1", "--commit-dir", str(spool), "--node-key", str(key_file)),
                *("--committee-rpc", net.committee.rpc, "--spot-check-ppm", str(ppm), *cheat),
                "--private-next-hops",  # every registered endpoint is on loopback here
            ),
            extra_env={PASSWORD_ENV: PASSWORD},
            module=cheating_node.MODULE if mode else NODE_MARKER,
        )
        compute = Compute(process, key, keccak(text=secrets.token_hex(16)))
        net.nodes.append(compute)
        (self.cheaters if mode else self.honest).append(compute)
        self.spools.append((compute, spool))
        return compute

    def _commit_forever(self) -> None:
        asyncio.run(self._commit_loop())

    async def _commit_loop(self) -> None:
        committee = self.net.committee
        assert committee is not None
        length = int(committee.query("/params")["genesis"]["epoch_length"])
        committers = [Committer(spool, NodeLink(committee, node)) for node, spool in self.spools]
        while not self._stop.is_set():
            try:
                height = await asyncio.to_thread(committee.height)
                for committer in committers:
                    await committer.step(height, length)
            except Exception as error:  # a test helper keeps going; the test reads the list
                self.commit_errors.append(repr(error)[:300])
            await asyncio.sleep(0.5)

    def committed(self, node: Compute) -> list[dict[str, Any]]:
        return self.query(f"/commitments?node={node.public}")["commitments"]

    def close(self) -> None:
        self._stop.set()
        if self._committing is not None:
            with contextlib.suppress(RuntimeError):
                self._committing.join(10)
        super().close()
