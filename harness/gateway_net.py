"""A small real network for the gateway tests and bench/gateway.py, all real processes:

- anvil with the contracts deployed (`deploy.evm.deploy_all`), the model dev-registered in
  ModelRegistry (modelId = the manifest hash's 32 bytes, shard hashes = the shard files');
- one CometBFT validator running the committee app (small epoch, short heartbeat timeout);
- compute nodes (`planet node serve`, int8 shards of SmolLM2), each registered on the committee
  with a signed `register_node` tx (node key + EIP-191 binding of its EVM key), kept SERVING by
  heartbeats from a background thread; "staked" nodes really `stake` on anvil and the validator
  signs `attest_stake` with its consensus key for the amount it reads back from Staking;
- the gateway (`planet gateway serve`) as its own process.

Every port is ephemeral; `GatewayNet.close()` stops every process it started (also on failure).
Logs stay in the run directory (PLANET_KEEP_LOGS=1 prints where).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_utils import keccak
from nacl.signing import SigningKey

from deploy.anvil import ANVIL_DEV_ADDRESS, ANVIL_DEV_KEY, Anvil, rpc_call, start_anvil
from deploy.evm import DeployConfig, compile_contracts, deploy_all
from harness.committee_reads import nodes_of
from harness.ports import ephemeral_port
from harness.shard_cache import prepared_manifest  # noqa: F401  (its importers here)
from node.chain.committee_pages import path_query, read_reputations
from node.chain.evm.account import PlanetChain
from node.keys import create_dev_wallet
from node.model.manifest import Manifest
from node.procs import Child, spawn_process, terminate
from node.server.launcher import (
    NODE_MARKER,
    NodeProcess,
    is_planet_node,
    pid_alive,
    start_node,
    stop_pid,
    wait_healthy,
)
from protocol.committee.envelope import sign
from protocol.committee.registry import (
    AttestStake,
    Heartbeat,
    Leave,
    RegisterNode,
    sign_registration,
)
from protocol.eip712 import ROLE_COMPUTE, address_of, as_bytes32
from protocol.payment import QueryPayment, Voucher, payment_domain, sign_payment, sign_voucher

ROOT = Path(__file__).resolve().parents[1]
COMETBFT = ROOT / ".tools" / "bin" / "cometbft"
ETHER = 10**18
PRICE = 10**12  # wei per token
PASSWORD = "gateway-test-password"
_NONCE_LOCK = threading.Lock()


def http_json(url: str, *, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} within {timeout:g} s")


@dataclass
class Compute:
    """One compute node: its process, ed25519 key and EVM key."""

    process: NodeProcess
    key: SigningKey
    evm_key: bytes
    nonce: int = 1
    left: bool = False
    beating: bool = True  # False: its heartbeats stop (a stalled agent) while it serves on

    @property
    def public(self) -> str:
        return self.key.verify_key.encode().hex()

    def next_nonce(self) -> int:
        with _NONCE_LOCK:
            self.nonce += 1
            return self.nonce


@dataclass
class Committee:
    home: Path
    rpc: str
    proxy: str
    logs: Path
    processes: list[Child] = field(default_factory=list)
    validator_nonce: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, method: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        body = http_json(f"{self.rpc}/{method}?{query}")
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error']}")
        return body["result"]

    def stop(self) -> None:
        """Terminate its processes (CometBFT, then the app), killing any that outlive 10 s: a
        loaded box is no reason to leak a validator."""
        for process in reversed(self.processes):
            terminate(process)

    def height(self) -> int:
        try:
            return int(self.call("status")["sync_info"]["latest_block_height"])
        except (OSError, RuntimeError):
            return 0

    def submit(self, raw: bytes, *, wait: bool = True) -> dict[str, Any]:
        checked = self.call("broadcast_tx_sync", tx="0x" + raw.hex())
        if checked["code"] != 0:
            raise RuntimeError(f"tx refused by CheckTx: {checked}")
        if not wait:
            return checked

        def committed() -> Any:
            try:
                return self.call("tx", hash="0x" + checked["hash"])["tx_result"]
            except (OSError, RuntimeError):
                return None

        result = wait_for(committed, 20, f"tx {checked['hash']} committed")
        if result.get("code", 0) != 0:
            raise RuntimeError(f"tx failed in the block: {result}")
        return result

    def query(self, path: str) -> Any:
        response = self.call("abci_query", path=json.dumps(path))["response"]
        if response.get("code", 0) != 0:
            raise RuntimeError(f"query {path}: {response}")
        return json.loads(base64.b64decode(response["value"]))

    def nodes(self, **filters: Any) -> list[dict[str, Any]]:
        """Every `/nodes` entry matching `filters`, each page followed (`read_nodes`)."""
        return nodes_of(self.query, **filters)

    def reputations(self) -> dict[str, dict[str, Any]]:
        """Every `/reputations` record by node key, each page followed (`read_reputations`)."""

        async def abci_query(path: str) -> Any:
            return self.query(path)

        return asyncio.run(read_reputations(path_query(abci_query)))

    def validator_key(self) -> SigningKey:
        doc = json.loads((self.home / "config" / "priv_validator_key.json").read_text())
        return SigningKey(base64.b64decode(doc["priv_key"]["value"])[:32])

    def validator_sign(self, body: Any) -> bytes:
        with self.lock:
            self.validator_nonce += 1
            return sign(body, self.validator_key(), self.validator_nonce).encode()

    def form_credit_key(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Play the validator's part in the current key period's DKG (what its watcher does:
        `node.watcher.credit_dkg.plan`, its share into `<home>/credit_shares/` where its app
        signs with it) until the period's committee key is formed; its `/credit_period`
        answer. A committee without a watcher needs this before it sells a credit."""
        from node.watcher.credit_dkg import plan  # lazy: only committees that sell credits
        from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore

        store = CreditShareStore(self.home / CREDIT_SHARES_DIR)
        key = self.validator_key()

        def formed() -> dict[str, Any] | None:
            answer = self.query("/credit_period")
            bodies = plan(answer, key, store)  # once formed: the share saved, nothing to send
            if ((answer.get("run") or {}).get("result") or {}).get("key"):
                return answer
            for body in bodies:
                self.submit(self.validator_sign(body))
            return None

        return wait_for(formed, timeout_s, "the credit key period's DKG formed no key")

    def post_partials(self) -> list[str]:
        """One pass of the validator's `MintSigner` (its watcher's job): its partial signatures
        for every funded mint still short of t posted sets, on the chain; the mints posted for.
        A committee without a watcher needs this after funding before a client can combine."""
        from node.watcher.mint_signer import MintSigner  # lazy: only committees selling credits
        from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore

        committee = self

        class Link:
            async def query(self, path: str, **params: Any) -> Any:
                query = urllib.parse.urlencode(params)
                return committee.query(f"{path}?{query}" if params else path)

            async def send(self, body: Any, *, timeout_s: float = 20.0) -> tuple[int, str]:
                try:
                    committee.submit(committee.validator_sign(body))
                except RuntimeError as error:
                    return 1, str(error)
                return 0, ""

        store = CreditShareStore(self.home / CREDIT_SHARES_DIR)
        return asyncio.run(MintSigner(Link(), store).step())


def start_committee(
    run_dir: Path,
    operator: str,
    *,
    epoch_length: int = 10,
    evm: dict[str, Any] | None = None,
    app_state: dict[str, Any] | None = None,  # more genesis parameters
    rpc_port: int | None = None,  # chosen before the nodes start (their --committee-rpc)
) -> Committee:
    if not COMETBFT.exists():
        raise FileNotFoundError(f"{COMETBFT} missing: run bash deploy/setup.sh")
    home = run_dir / "validator"
    subprocess.run([str(COMETBFT), "init", "--home", str(home)], check=True, capture_output=True)
    p2p, rpc, proxy = ephemeral_port(), rpc_port or ephemeral_port(), ephemeral_port()
    genesis_path = home / "config" / "genesis.json"
    genesis = json.loads(genesis_path.read_text())
    address = genesis["validators"][0]["address"]
    genesis["consensus_params"]["abci"] = {"vote_extensions_enable_height": "1"}
    genesis["app_state"] = {
        "epoch_length": epoch_length,
        "heartbeat_timeout": 60,
        "validators": {address: operator},
        **({"evm": evm} if evm else {}),
        **(app_state or {}),
    }
    genesis_path.write_text(json.dumps(genesis, indent=1))
    config_path = home / "config" / "config.toml"
    config = config_path.read_text()
    for old, new in [
        ('proxy_app = "tcp://127.0.0.1:26658"', f'proxy_app = "tcp://127.0.0.1:{proxy}"'),
        ('laddr = "tcp://127.0.0.1:26657"', f'laddr = "tcp://127.0.0.1:{rpc}"'),
        ('laddr = "tcp://0.0.0.0:26656"', f'laddr = "tcp://127.0.0.1:{p2p}"'),
        ('timeout_commit = "1s"', 'timeout_commit = "200ms"'),
    ]:
        if old not in config:
            raise RuntimeError(f"cometbft config has no {old!r}")
        config = config.replace(old, new)
    config_path.write_text(config)
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    committee = Committee(home, f"http://127.0.0.1:{rpc}", f"tcp://127.0.0.1:{proxy}", logs)
    app_log = open(logs / "abci-app.log", "wb")  # noqa: SIM115
    committee.processes.append(
        spawn_process(
            [sys.executable, "-m", "abci_app", "--home", str(home), "--listen", committee.proxy],
            app_log.fileno(),
            env=os.environ,
            cwd=ROOT,
            new_session=False,
        )
    )

    def listening() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", proxy)) == 0

    wait_for(listening, 30, "the ABCI app did not listen")
    node_log = open(logs / "cometbft.log", "wb")  # noqa: SIM115
    committee.processes.append(
        subprocess.Popen(
            [str(COMETBFT), "start", "--home", str(home)], stdout=node_log, stderr=subprocess.STDOUT
        )
    )
    wait_for(lambda: committee.height() >= 2, 60, "the committee did not reach height 2")
    return committee


class GatewayNet:
    """See the module docstring. Build with `GatewayNet.start(...)`; always `close()`."""

    def __init__(self, run_dir: Path, manifest: Path) -> None:
        self.run_dir = run_dir
        self.manifest_path = manifest
        self.manifest = Manifest.load(manifest)
        self.model_id = as_bytes32(self.manifest.model_hash, "model_hash")
        self.operator_key = keccak(text="gateway-net operator")
        self.anvil: Anvil | None = None
        self.committee: Committee | None = None
        self.nodes: list[Compute] = []
        self.gateway: Child | None = None
        self.gateway_url = ""
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._beating = threading.Lock()  # held while a heartbeat round signs and sends
        self.deployment_path = run_dir / "deployment.json"
        # the committee's RPC port, fixed before the nodes start: they ask it which next hops
        # (routable nodes) a circuit's `open` may make them dial (`--next-hops committee`)
        self.committee_rpc_port = ephemeral_port()

    # --- set-up ---------------------------------------------------------------------------------

    def start_chain(self) -> None:
        compile_contracts()
        port = ephemeral_port()
        self.anvil = start_anvil(port, log_path=self.run_dir / "anvil.log")
        config = DeployConfig.devnet(
            committee=[(address_of(self.operator_key), 1)],
            challenge_window_s=60,
            refund_timeout_s=600,  # >= the gateway's derived refund margin (timeline.py)
            dev_owner=ANVIL_DEV_ADDRESS,
        )
        self.deployment = deploy_all(
            self.anvil.rpc_url, ANVIL_DEV_KEY, config, progress=lambda _line: None
        )
        self.deployment.save(self.deployment_path)
        owner = PlanetChain(self.deployment, ANVIL_DEV_KEY)
        owner.registry.dev_register(
            self.model_id,
            self.model_id,
            [as_bytes32(s.hash, "shard hash") for s in self.manifest.shards],
        )

    def start_committee(
        self,
        *,
        epoch_length: int = 10,
        with_evm: bool = False,
        app_state: dict[str, Any] | None = None,
    ) -> None:
        """The one-validator committee on the RPC port the nodes were given; `with_evm`: it
        knows this chain's Committee and FraudProofs contracts (verdicts, payout roots)."""
        evm = None
        if with_evm:
            evm = {
                "chain_id": self.deployment.chain_id,
                "committee_address": self.deployment.address("Committee"),
                "fraud_proofs_address": self.deployment.address("FraudProofs"),
            }
        self.committee = start_committee(
            self.run_dir,
            address_of(self.operator_key),
            epoch_length=epoch_length,
            evm=evm,
            app_state=app_state,
            rpc_port=self.committee_rpc_port,
        )

    def account(self, label: str, ether: int = 100) -> PlanetChain:
        """A fresh funded EVM account as a chain client."""
        assert self.anvil is not None
        key = keccak(text=f"gateway-net {label} {secrets.token_hex(8)}")
        rpc_call(self.anvil.rpc_url, "anvil_setBalance", [address_of(key), hex(ether * ETHER)])
        return PlanetChain(self.deployment, key)

    def start_nodes(
        self,
        shards: list[int],
        *,
        wait: bool = True,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
        module: str = NODE_MARKER,  # what serves them (start_node): the planet CLI by default
    ) -> list[Compute]:
        started = []
        for index, shard in enumerate(shards):
            process = start_node(
                manifest=self.manifest_path,
                shard=shard,
                port=ephemeral_port(),
                run_dir=self.run_dir / f"node-{len(self.nodes) + index}",
                extra_args=(
                    *("--threads", "1"),
                    *("--committee-rpc", f"http://127.0.0.1:{self.committee_rpc_port}"),
                    "--private-next-hops",  # every registered endpoint is on loopback here
                    *extra_args,
                ),
                extra_env=extra_env,
                module=module,
            )
            started.append(
                Compute(process, SigningKey.generate(), keccak(text=secrets.token_hex(16)))
            )
        self.nodes.extend(started)
        if wait:
            wait_healthy([c.process for c in started], timeout_s=240)
        return started

    def register(self, node: Compute, *, stake: bool) -> None:
        assert self.committee is not None
        body = RegisterNode(
            evm_address=address_of(node.evm_key),
            evm_signature=sign_registration(node.evm_key, node.public),
            role="compute",
            model=self.manifest.model_hash,
            shards=(node.process.shard,),
            endpoint=node.process.url,
            capacity=64,
        )
        self.committee.submit(sign(body, node.key, 1).encode())
        self.committee.submit(sign(Heartbeat(), node.key, node.next_nonce()).encode())
        if stake:
            assert self.anvil is not None
            rpc_call(
                self.anvil.rpc_url, "anvil_setBalance", [address_of(node.evm_key), hex(10 * ETHER)]
            )
            chain = PlanetChain(self.deployment, node.evm_key)
            chain.staking.stake(ROLE_COMPUTE, ETHER)
            observed = chain.staking.stake_of()  # what the validator reads on the EVM chain
            self.committee.submit(self.committee.validator_sign(AttestStake(node.public, observed)))

    def leave(self, node: Compute) -> None:
        """Send `leave` (retried: a concurrent heartbeat may have taken a higher nonce)."""
        assert self.committee is not None
        node.left = True
        with self._beating:  # a round under way has sent its heartbeat: no nonce race with it
            pass
        for _ in range(5):
            try:
                self.committee.submit(sign(Leave(), node.key, node.next_nonce()).encode())
                return
            except RuntimeError:
                time.sleep(0.5)
        raise RuntimeError("leave was refused five times")

    def _beat(self) -> None:
        while not self._stop.wait(2.0):
            with self._beating:
                for node in list(self.nodes):
                    if node.left or not node.beating or self.committee is None:
                        continue
                    try:
                        raw = sign(Heartbeat(), node.key, node.next_nonce()).encode()
                        self.committee.submit(raw, wait=False)
                    except (OSError, RuntimeError):
                        continue

    def start_heartbeats(self) -> None:
        self._heartbeats = threading.Thread(target=self._beat, daemon=True)
        self._heartbeats.start()

    def start_gateway(self, extra_args: tuple[str, ...] = ()) -> None:
        assert self.anvil is not None and self.committee is not None
        port = ephemeral_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        wallet = self.run_dir / "gateway" / "wallet.json"
        if not wallet.exists():  # a cheap KDF: scrypt cost ~1.2 CPU-s here, ~1.8 each start
            create_dev_wallet(wallet, PASSWORD)
        log = open(self.run_dir / "gateway.log", "ab")  # noqa: SIM115  (a restart appends)
        self.gateway = spawn_process(
            [
                sys.executable,
                "-m",
                "planet",
                "-v",
                "gateway",
                "serve",
                "--evm-rpc",
                self.anvil.rpc_url,
                "--deployment",
                str(self.deployment_path),
                "--committee-rpc",
                self.committee.rpc,
                "--manifest",
                str(self.manifest_path),
                "--wallet",
                str(wallet),
                "--price-wei-per-token",
                str(PRICE),
                "--port",
                str(port),
                "--private-endpoints",  # every registered endpoint is on loopback here
                *extra_args,
            ],
            log.fileno(),
            cwd=ROOT,
            env={**os.environ, "PLANET_PASSWORD": PASSWORD, "OMP_WAIT_POLICY": "PASSIVE"},
            new_session=False,
        )

        def ready() -> bool:
            if self.gateway is not None and self.gateway.poll() is not None:
                tail = (self.run_dir / "gateway.log").read_text()[-2000:]
                raise RuntimeError(f"the gateway exited: {tail}")
            try:
                return http_json(f"{self.gateway_url}/health", timeout=2)["status"] == "ok"
            except (OSError, ValueError):
                return False

        wait_for(ready, 120, "the gateway did not become healthy", interval=0.3)

    @classmethod
    def start(cls, run_dir: Path, manifest: Path, staked: list[int], unstaked: list[int]) -> Any:
        net = cls(run_dir, manifest)
        try:
            # nodes load their shards while the chains start
            staked_nodes = net.start_nodes(staked, wait=False)
            unstaked_nodes = net.start_nodes(unstaked, wait=False)
            net.start_chain()
            net.start_committee()
            wait_healthy([c.process for c in net.nodes], timeout_s=240)
            for node in staked_nodes:
                net.register(node, stake=True)
            for node in unstaked_nodes:
                net.register(node, stake=False)
            net.start_heartbeats()
            net.start_gateway()
        except BaseException:
            net.close()
            raise
        return net

    # --- paying ---------------------------------------------------------------------------------

    def pools(self) -> dict[str, Any]:
        return http_json(f"{self.gateway_url}/v1/pools")["data"][0]

    def pay(
        self,
        user: PlanetChain,
        amount_wei: int,
        *,
        fee_cap: int | None = None,
        signer_key: bytes | None = None,
        model_id: bytes | None = None,
        gateway: str | None = None,
    ) -> tuple[str, bytes]:
        """Deposit `amount_wei` for a fresh query id, bound to this network's gateway (or to
        `gateway`, to test a deposit made for another one); (API key, query id)."""
        query_id = secrets.token_bytes(32)
        pool = self.pools()
        user.escrow.deposit(
            query_id, model_id or self.model_id, gateway or pool["gateway"], amount_wei
        )
        domain = payment_domain(pool["chain_id"], pool["escrow"])
        payment = QueryPayment(query_id, self.model_id, pool["gateway"], fee_cap or amount_wei)
        key = signer_key if signer_key is not None else bytes(user.account.key)
        return sign_payment(key, payment, domain), query_id

    def fund_balance(
        self, payer: PlanetChain, amount_wei: int, *, gateway: str | None = None
    ) -> int:
        """Deposit `amount_wei` on `payer`'s prepaid balance at this network's gateway (or at
        `gateway`); returns the balance there."""
        at = gateway or self.pools()["gateway"]
        payer.escrow.deposit_balance(at, amount_wei)
        return payer.escrow.prepaid_of(payer.address, at)["balance"]

    def balance_at_gateway(
        self, payer: PlanetChain, *, gateway: str | None = None
    ) -> dict[str, int]:
        """{balance, withdrawable_at} of `payer`'s prepaid balance at this network's gateway."""
        return payer.escrow.prepaid_of(payer.address, gateway or self.pools()["gateway"])

    def voucher(
        self, payer: PlanetChain, fee_cap: int, *, expires_in_s: int = 600
    ) -> tuple[str, bytes]:
        """A prepaid voucher of `payer` for a fresh query id (no transaction); (API key, id)."""
        query_id = secrets.token_bytes(32)
        pool = self.pools()
        domain = payment_domain(pool["chain_id"], pool["escrow"])
        expiry = int(time.time()) + expires_in_s
        voucher = Voucher(pool["gateway"], query_id, self.model_id, fee_cap, expiry, pool["escrow"])
        return sign_voucher(bytes(payer.account.key), voucher, domain), query_id

    # --- tear-down ------------------------------------------------------------------------------

    def kill_node(self, node: Compute) -> None:
        os.kill(node.process.pid, signal.SIGKILL)

    def close(self) -> None:
        self._stop.set()
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.terminate()
            try:
                self.gateway.wait(10)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
        for node in self.nodes:  # SIGTERM all first (our own node pids only), then wait
            if pid_alive(node.process.pid) and is_planet_node(
                node.process.pid, node.process.module
            ):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.process.pid, signal.SIGTERM)
        for node in self.nodes:
            stop_pid(node.process.pid, grace_s=3, module=node.process.module)
        if self.committee is not None:
            self.committee.stop()
        if self.anvil is not None:
            self.anvil.stop()
        if os.environ.get("PLANET_KEEP_LOGS"):
            print(f"gateway net logs in {self.run_dir}", file=sys.stderr)
