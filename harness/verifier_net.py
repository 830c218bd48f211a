"""A network with a verifier, for tests/e2e/test_verifier_network.py and bench/verifier_honest.py.

On top of harness/gateway_net.py (anvil + contracts, one CometBFT validator with the committee
app, staked compute nodes, the gateway; every process real): genesis with the EVM section
(verdicts enabled) and short epochs, optional cheating nodes (a test entry point that takes
`planet node serve`'s arguments plus `--cheat MODE`: tests/doubles/cheating_node.py) and slowed
ones (`--slow-factor FACTOR`: tests/doubles/slow_node.py), and
`planet verifier serve` on the validator's home as its own process, with the validator's
operator keystore (it signs verdicts) and a funded wallet of its own.

    net = VerifierNet.start(run_dir, manifest, honest=[0, 1], cheats=[(1, "substitute-skip:2")],
                            cheating_node=cheating_node.MODULE)
    ...
    net.close()        # stops every process it started (also on failure)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from eth_account import Account

from deploy.anvil import rpc_call
from harness.gateway_net import (
    ETHER,
    PASSWORD,
    ROOT,
    Compute,
    GatewayNet,
    wait_for,
)
from node.keys import create_dev_wallet
from node.procs import Child, spawn_process
from node.server.launcher import wait_healthy


class VerifierNet:
    def __init__(self, net: GatewayNet) -> None:
        self.net = net
        self.honest: list[Compute] = []
        self.cheaters: list[Compute] = []
        self.slowed: list[Compute] = []
        self.verifier: Child | None = None
        self.log = net.run_dir / "verifier.log"

    @classmethod
    def start(
        cls,
        run_dir: Path,
        manifest: Path,
        *,
        honest: list[int],
        cheats: list[tuple[int, str]] = (),  # type: ignore[assignment]  # (shard, mode)
        cheating_node: str = "",  # the module that serves `cheats` (`--cheat MODE`)
        epoch_blocks: int = 50,
        challenges: int = 4,
        verdict_after: int = 1,
        verifier_args: tuple[str, ...] = (),  # more `planet verifier serve` arguments
        slowed: list[tuple[int, float]] = (),  # type: ignore[assignment]  # (shard, factor)
        slow_node: str = "",  # the module that serves `slowed` (`--slow-factor FACTOR`)
    ) -> VerifierNet:
        if cheats and not cheating_node:
            raise ValueError("cheats need the cheating_node module that serves them")
        if slowed and not slow_node:
            raise ValueError("slowed nodes need the slow_node module that serves them")
        net = GatewayNet(run_dir, manifest)
        self = cls(net)
        try:
            self.honest = net.start_nodes(honest, wait=False)
            for shard, mode in cheats:
                self.cheaters += net.start_nodes(
                    [shard], wait=False, extra_args=("--cheat", mode), module=cheating_node
                )
            for shard, factor in slowed:
                self.slowed += net.start_nodes(
                    [shard], wait=False, extra_args=("--slow-factor", str(factor)), module=slow_node
                )
            net.start_chain()
            net.start_committee(epoch_length=epoch_blocks, with_evm=True)
            wait_healthy([c.process for c in net.nodes], timeout_s=240)
            for node in net.nodes:
                net.register(node, stake=True)
            net.start_heartbeats()
            net.start_gateway()
            wait_for(self._all_routable, 60, "the nodes are not all routable")
            self.start_verifier(challenges, verdict_after, verifier_args)
        except BaseException:
            self.close()
            raise
        return self

    def _all_routable(self) -> bool:
        assert self.net.committee is not None
        model = self.net.manifest.model_hash
        nodes = self.net.committee.nodes(model=model)
        return len(nodes) == len(self.net.nodes) and all(n["routable"] for n in nodes)

    def start_verifier(
        self, challenges: int, verdict_after: int, extra_args: tuple[str, ...] = ()
    ) -> None:
        net = self.net
        assert net.committee is not None and net.anvil is not None
        keystore = Account.encrypt(net.operator_key, "", kdf="pbkdf2", iterations=2)
        (net.committee.home / "config" / "operator_key.json").write_text(json.dumps(keystore))
        wallet = net.run_dir / "verifier" / "wallet.json"
        wallet.parent.mkdir(parents=True, exist_ok=True)
        account = create_dev_wallet(wallet, PASSWORD)
        rpc_call(net.anvil.rpc_url, "anvil_setBalance", [account.address, hex(100 * ETHER)])
        argv = [
            sys.executable, "-m", "planet", "verifier", "serve",
            "--home", str(net.committee.home),
            "--manifest", str(net.manifest_path),
            "--gateway", net.gateway_url,
            "--deployment", str(net.deployment_path),
            "--evm-rpc", net.anvil.rpc_url,
            "--committee-rpc", net.committee.rpc,
            "--wallet", str(wallet),
            "--challenges-per-epoch", str(challenges),
            "--verdict-after", str(verdict_after),
            *extra_args,
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.verifier = spawn_process(
                argv,
                log.fileno(),
                cwd=ROOT,
                env={**os.environ, "PLANET_PASSWORD": PASSWORD, "OMP_WAIT_POLICY": "PASSIVE"},
                new_session=False,
            )

    def alive(self) -> None:
        """Raise with the log's tail when the verifier exited."""
        assert self.verifier is not None
        if self.verifier.poll() is not None:
            raise AssertionError("the verifier exited:\n" + self.log.read_text()[-3000:])

    def query(self, path: str) -> Any:
        assert self.net.committee is not None
        return self.net.committee.query(path)

    def reputations(self) -> dict[str, dict[str, Any]]:
        """Every `/reputations` record by node key (every page: `Committee.reputations`)."""
        assert self.net.committee is not None
        return self.net.committee.reputations()

    def close(self) -> None:
        if self.verifier is not None and self.verifier.poll() is None:
            self.verifier.terminate()
            try:
                self.verifier.wait(10)
            except subprocess.TimeoutExpired:
                self.verifier.kill()
        self.net.close()
