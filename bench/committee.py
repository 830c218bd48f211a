"""Committee chain throughput: commitment records/s, committed tx/s, block time, latency (one JSON).

For each run (`--runs`, default `binary:1024,binary:1,json:1`), then CometBFT's built-in
`kvstore` as the ceiling of CometBFT itself on this machine, in the same invocation:

1. `init` + `start` a fresh N-validator network on loopback (temporary directory, ports from
   --base-port), exactly as `planet committee init/up` do.
2. Planet only: register one compute node per load worker (ed25519 node key + EVM key) and wait
   until the registrations are committed.
3. Load for --duration seconds: workers each send unique txs with `broadcast_tx_sync` to one
   RPC port (workers spread over all validators), one at a time. Planet txs are `commit`
   batches of BATCH commitments, compact binary (`protocol.commit_batch`, one session per
   worker) or JSON; runs with BATCH > 1 use --batch-concurrency workers and, with --rate, are
   paced to that many offered records/s. kvstore txs are 100-byte `key=value`. A websocket
   `NewBlock` subscription on validator 0 timestamps every block.
4. Drain (bounded), check `block_results` codes, stop the network, delete the directory.

Before the networks, `app_cpu_*` measure one validator's app alone in this process (CPU time,
no CometBFT): µs per record for blocks of ten 1 024-record binary batches, µs per plain tx.

Metrics (first run unsuffixed, every run again as `_<encoding>_<batch>`, the ceiling as
`_kvstore`): committed_tx_s (txs accepted by CheckTx that landed in a block during the load
window / window), commitments_s, block_time_ms (mean interval between NewBlock events under
load) and _max, broadcast_to_commit_ms_p50/_p99 (send start → NewBlock event carrying the tx),
lost_txs (accepted but never in a block), failed_in_block_txs, cpu_ms_per_tx_{app,cometbft,
loadgen} and cpu_cores_busy_* (from /proc during the window), rss_mb_max_*;
ratio_plain_tx_s_{binary,json}_vs_kvstore (batch-1 runs vs kvstore). The machine is shared:
machine.loadavg_1m_at_start and metrics.loadavg_1m_at_end say how busy it was.

    .venv/bin/python bench/committee.py --rate 12000          # ~4 minutes
    .venv/bin/python bench/committee.py --runs binary:1024 --rate 10000 --skip-kvstore --duration 10
    .venv/bin/python bench/committee.py --quick   # one validator, binary:16 for 1 s, no kvstore
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import importlib.metadata
import itertools
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import parse_with_quick
from deploy.committee.cometbft import COMETBFT_VERSION
from deploy.committee.generate import InitOptions, init_network
from deploy.committee.network import Network
from deploy.committee.processes import running_processes, stop_network
from deploy.committee.start import start_network
from node.chain.committee_rpc import CommitteeRpc, decode_block_txs, tx_hash

log = logging.getLogger("bench.committee")


# -- tx factories ------------------------------------------------------------------------------


class KvstoreTxs:
    """Unique `key=value` txs for CometBFT's kvstore (about `size` bytes each)."""

    name = "kvstore"
    commitments_per_tx = 0

    def __init__(self, size: int = 100) -> None:
        self.size = size

    async def prepare(self, rpcs: list[CommitteeRpc], workers: int) -> None:
        return None

    def make(self, worker: int, seq: int) -> bytes:
        key = f"w{worker}-{seq}".encode()
        return key + b"=" + b"v" * max(1, self.size - len(key) - 1)


class PlanetTxs:
    """Signed `commit` batches from one registered compute node per worker."""

    name = "planet"

    def __init__(self, batch: int, run_id: str, encoding: str = "json") -> None:
        from nacl.signing import SigningKey

        self.batch = batch
        self.encoding = encoding
        self.name = f"planet-{encoding}"
        self.commitments_per_tx = batch
        self.run_id = run_id
        self._keys: list[SigningKey] = []
        self._signers: list[str] = []
        self._sessions: list[str] = []
        self._domain = b""
        self._signing_key = SigningKey
        # the validators' homes (their priv_validator_key.json): `prepare` has them attest the
        # nodes' stake, as their stake watchers would (only staked nodes commit: NOT_STAKED)
        self.validator_homes: list[Path] = []

    async def prepare(self, rpcs: list[CommitteeRpc], workers: int) -> None:
        from eth_account import Account

        from protocol.committee.envelope import SIGN_DOMAIN, sign
        from protocol.committee.registry import RegisterNode, sign_registration

        registrations = []
        for worker in range(workers):
            seed = hashlib.sha256(f"{self.run_id}/node/{worker}".encode()).digest()
            key = self._signing_key(seed)
            self._keys.append(key)
            evm = Account.from_key(hashlib.sha256(seed + b"/evm").digest())
            node_hex = key.verify_key.encode().hex()
            body = RegisterNode(
                evm_address=evm.address,
                evm_signature=sign_registration(evm.key, node_hex),
                role="compute",
                model="smollm2-135m",
                shards=(worker % 3,),
                endpoint=f"http://127.0.0.1:{20000 + worker}",
                capacity=8,
            )
            registrations.append(sign(body, key, 1).encode())
        sent = await asyncio.gather(
            *(rpcs[i % len(rpcs)].broadcast_tx_sync(tx) for i, tx in enumerate(registrations))
        )
        results = await asyncio.gather(*(rpcs[0].wait_for_tx(r.hash, timeout_s=60) for r in sent))
        failed = [r for r in results if r.code != 0]
        if failed:
            raise RuntimeError(f"{len(failed)} registrations failed: {failed[0].log}")
        log.info("registered nodes=%d", workers)
        await self._attest_stake([rpc.url for rpc in rpcs])
        self._domain = SIGN_DOMAIN
        self._signers = [key.verify_key.encode().hex() for key in self._keys]
        self._sessions = [
            "0x" + hashlib.sha256(f"{self.run_id}/s/{w}".encode()).hexdigest()
            for w in range(workers)
        ]
        if self.encoding == "json" and self.make(0, 10**6) != self.make_reference(0, 10**6):
            raise RuntimeError("the load generator's tx bytes differ from protocol.committee's")

    async def _attest_stake(self, urls: list[str]) -> None:
        """Every validator attests 1 ETH for every node, one tx at a time (each waited for in
        its block: a burst of one signer's txs may reach the proposer out of nonce order), the
        validators side by side."""
        from node.chain.committee_link import CommitteeLink
        from protocol.committee.registry import AttestStake

        nodes = [key.verify_key.encode().hex() for key in self._keys]

        async def one_validator(index: int, home: Path) -> None:
            doc = json.loads((home / "config" / "priv_validator_key.json").read_text())
            key = self._signing_key(base64.b64decode(doc["priv_key"]["value"])[:32])
            link = CommitteeLink([urls[index % len(urls)]], key)
            try:
                for node in nodes:
                    code, text = await link.send(AttestStake(node, 10**18), timeout_s=60)
                    if code != 0:
                        raise RuntimeError(f"attest_stake refused: {code} {text}")
            finally:
                await link.close()

        await asyncio.gather(*(one_validator(i, h) for i, h in enumerate(self.validator_homes)))
        log.info("staked nodes=%d", len(nodes))

    def make(self, worker: int, seq: int) -> bytes:
        if self.encoding == "binary":
            return self.make_binary(worker, seq)
        return self.make_json(worker, seq)

    def make_binary(self, worker: int, seq: int) -> bytes:
        """A compact binary `commit` batch (`protocol.commit_batch`), one session per worker."""
        from protocol import commit_batch

        prefix = f"{self.run_id}/{worker}/{seq}/".encode()
        rows = [
            (seq * self.batch + item, worker % 3, hashlib.sha256(prefix + b"%d" % item).digest())
            for item in range(self.batch)
        ]
        return commit_batch.encode_batch(
            commit_batch.KIND_COMMIT, self._sessions[worker], rows, self._keys[worker], seq + 2
        )

    def make_json(self, worker: int, seq: int) -> bytes:
        """A signed `commit` tx, its canonical JSON written out by hand with the keys in sorted
        order (the load generator must be cheap); `prepare` checks that the bytes equal
        `protocol.committee`'s own encoding."""
        session = self._sessions[worker]
        shard = worker % 3
        prefix = f"{self.run_id}/{worker}/{seq}/"
        records = ",".join(
            '{{"commitment":"0x{}","session":"{}","shard":{},"step":{}}}'.format(
                hashlib.sha256(f"{prefix}{item}".encode()).hexdigest(),
                session,
                shard,
                seq * self.batch + item,
            )
            for item in range(self.batch)
        )
        head = f'{{"body":{{"commitments":[{records}]}},"nonce":{seq + 2}'
        signer = f'"signer":"{self._signers[worker]}","type":"commit"}}'
        message = self._domain + f"{head},{signer}".encode()
        signature = self._keys[worker].sign(message).signature.hex()
        return f'{head},"sig":"{signature}",{signer}'.encode()

    def make_reference(self, worker: int, seq: int) -> bytes:
        """The same tx through `protocol.committee`'s dataclasses (slow; for the check)."""
        from protocol.committee.commitments import CommitBatch, CommitmentRecord
        from protocol.committee.envelope import sign

        records = tuple(
            CommitmentRecord(
                session=self._sessions[worker],
                step=seq * self.batch + item,
                shard=worker % 3,
                commitment="0x"
                + hashlib.sha256(f"{self.run_id}/{worker}/{seq}/{item}".encode()).hexdigest(),
            )
            for item in range(self.batch)
        )
        return sign(CommitBatch(records), self._keys[worker], seq + 2).encode()


# -- the load ----------------------------------------------------------------------------------


@dataclass
class LoadResult:
    start: float = 0.0
    end: float = 0.0
    sent: dict[str, float] = field(default_factory=dict)  # accepted tx hash -> send time
    rejected: int = 0
    reject_logs: list[str] = field(default_factory=list)
    errors: int = 0
    blocks: list[tuple[int, float, list[str]]] = field(default_factory=list)  # height, t, hashes


async def _watch_blocks(rpc: CommitteeRpc, result: LoadResult, stop: asyncio.Event) -> None:
    async with rpc.subscribe("tm.event='NewBlock'") as events:
        async for event in events:
            now = time.monotonic()
            block = event["data"]["value"]["block"]
            hashes = [tx_hash(tx) for tx in decode_block_txs(block)]
            result.blocks.append((int(block["header"]["height"]), now, hashes))
            if stop.is_set():
                return


async def _worker(
    rpc: CommitteeRpc,
    worker: int,
    make: Callable[[int, int], bytes],
    result: LoadResult,
    interval_s: float = 0.0,
) -> None:
    """Send txs one at a time; with `interval_s` > 0 at most one per interval (paced load)."""
    seq = 0
    while time.monotonic() < result.end:
        if interval_s > 0:
            due = result.start + (seq + worker / 64) * interval_s
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            if time.monotonic() >= result.end:
                break
        tx = make(worker, seq)
        seq += 1
        started = time.monotonic()
        try:
            answer = await rpc.broadcast_tx_sync(tx, check=False)
        except Exception as error:  # counted: a load generator keeps going
            result.errors += 1
            log.warning("broadcast failed worker=%d error=%s", worker, error)
            await asyncio.sleep(0.05)
            continue
        if answer.code == 0:
            result.sent[answer.hash] = started
        else:
            result.rejected += 1
            if len(result.reject_logs) < 5:
                result.reject_logs.append(f"{answer.code}: {answer.log}")


async def run_load(
    network: Network,
    factory: Any,
    *,
    duration_s: float,
    concurrency: int,
    drain_s: float,
    interval_s: float = 0.0,
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        rpcs = [CommitteeRpc(v.rpc_url, session=session, timeout_s=20) for v in network.validators]
        await factory.prepare(rpcs, concurrency)
        result = LoadResult()
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_blocks(rpcs[0], result, stop))
        await asyncio.sleep(0.5)
        cpu_before = _cpu_seconds(network)
        result.start = time.monotonic()
        result.end = result.start + duration_s
        await asyncio.gather(
            *(
                _worker(rpcs[w % len(rpcs)], w, factory.make, result, interval_s)
                for w in range(concurrency)
            )
        )
        sent_done = time.monotonic()
        cpu_after = _cpu_seconds(network)
        rss = _rss_mb(network)
        deadline = sent_done + drain_s
        while time.monotonic() < deadline:
            seen = {h for _, _, hashes in result.blocks for h in hashes}
            if all(h in seen for h in result.sent):
                break
            await asyncio.sleep(0.2)
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(watcher, timeout=5)
        watcher.cancel()
        failed_in_block = await _failed_in_block(rpcs[0], result)
    metrics = _metrics(result, factory, duration_s, failed_in_block, sent_done)
    metrics.update(rss)
    window_txs = max(1, metrics["committed_tx_s"] * duration_s)
    for group in ("app", "cometbft", "loadgen"):
        used = cpu_after[group] - cpu_before[group]
        metrics[f"cpu_ms_per_tx_{group}"] = round(used * 1000 / window_txs, 3)
        metrics[f"cpu_cores_busy_{group}"] = round(used / duration_s, 2)
    return metrics


def _rss_mb(network: Network) -> dict[str, float]:
    """Largest resident memory (MB) among the apps and among the cometbft nodes right now."""
    out = {"rss_mb_max_app": 0.0, "rss_mb_max_cometbft": 0.0}
    for name, pid in running_processes(network).items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    key = f"rss_mb_max_{name.rstrip('0123456789')}"
                    out[key] = max(out[key], round(int(line.split()[1]) / 1024, 1))
    return out


def _cpu_seconds(network: Network) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the apps, the cometbft nodes and this process."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {"app": 0.0, "cometbft": 0.0}
    for name, pid in running_processes(network).items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            used[name.rstrip("0123456789")] += (int(fields[11]) + int(fields[12])) / ticks
    own = os.times()
    return {**used, "loadgen": own.user + own.system}


async def _failed_in_block(rpc: CommitteeRpc, result: LoadResult) -> int:
    """Txs of ours that are in blocks but whose FinalizeBlock code is not 0."""
    ours = set(result.sent)
    failed = 0
    for height, _t, hashes in result.blocks:
        if not any(h in ours for h in hashes):
            continue
        answer = await rpc.block_results(height)
        for h, tx_result in zip(hashes, answer.get("txs_results") or [], strict=False):
            if h in ours and int(tx_result.get("code") or 0) != 0:
                failed += 1
    return failed


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _metrics(
    result: LoadResult, factory: Any, duration_s: float, failed_in_block: int, sent_done: float
) -> dict[str, Any]:
    committed_at: dict[str, float] = {}
    for _height, at, hashes in result.blocks:
        for h in hashes:
            if h in result.sent and h not in committed_at:
                committed_at[h] = at
    in_window = sum(1 for at in committed_at.values() if result.start <= at <= result.end)
    window_blocks = [at for _h, at, _x in result.blocks if result.start <= at <= result.end]
    intervals = [b - a for a, b in itertools.pairwise(window_blocks)]
    latencies = [(committed_at[h] - result.sent[h]) * 1000 for h in committed_at]
    committed_tx_s = in_window / duration_s
    return {
        "committed_tx_s": round(committed_tx_s, 1),
        "commitments_s": round(committed_tx_s * factory.commitments_per_tx, 1),
        "block_time_ms": round(statistics.fmean(intervals) * 1000, 1) if intervals else None,
        "block_time_ms_max": round(max(intervals) * 1000, 1) if intervals else None,
        "broadcast_to_commit_ms_p50": round(_percentile(latencies, 0.5), 1),
        "broadcast_to_commit_ms_p99": round(_percentile(latencies, 0.99), 1),
        "accepted_txs": len(result.sent),
        "committed_txs": len(committed_at),
        "lost_txs": len(result.sent) - len(committed_at),
        "failed_in_block_txs": failed_in_block,
        "rejected_by_checktx": result.rejected,
        "broadcast_errors": result.errors,
        "blocks_in_window": len(window_blocks),
        "txs_per_block_max": max((len(x) for _h, _t, x in result.blocks), default=0),
        "reject_logs": result.reject_logs,
    }


# -- one app in process (CPU time, steady on a busy box) ------------------------------------------


def app_cpu_per_record(batches_per_block: int = 10, blocks: int = 4) -> dict[str, float]:
    """CPU µs per commitment record in ONE validator's app, without CometBFT: CheckTx (decode +
    signature), ProcessProposal (cached), FinalizeBlock and Commit on an on-disk store, for
    blocks of `batches_per_block` binary batches of 1 024 records (fresh txs: each is decoded
    and verified once, as for txs arriving by gossip), and the same for plain one-record txs."""
    from protocol import commit_batch
    from protocol.committee.registry import AttestStake, RegisterNode, sign_registration
    from protocol.eip712 import address_of
    from tests.committee_chain import Chain, seeded_evm_key, seeded_key

    with tempfile.TemporaryDirectory(prefix="planet-bench-app-") as directory:
        chain = Chain(db=Path(directory) / "app.sqlite", genesis={"epoch_length": 10_000})
        keys = [seeded_key(f"bench-{i}") for i in range(64)]
        registrations = []
        for i, key in enumerate(keys):
            evm = seeded_evm_key(f"bench-{i}")
            body = RegisterNode(
                address_of(evm), sign_registration(evm, key.verify_key.encode().hex()),
                "compute", "m", (0,), "http://bench", 8,
            )  # fmt: skip
            registrations.append(chain.tx(body, key))
        chain.block(registrations)
        # staked (3 of the 4 validators attest): only staked nodes commit (NOT_STAKED otherwise)
        chain.block(
            [
                chain.tx(AttestStake(key.verify_key.encode().hex(), 10**18), v.key)
                for key in keys
                for v in chain.validators[:3]
            ]
        )
        state = chain.state
        state_machine = chain.machine

        phases: dict[str, list[float]] = {"checktx": [], "deliver": [], "digest": [], "store": []}

        def run(txs: list[bytes]) -> float:
            clock = time.process_time
            began = clock()
            for raw in txs:
                if state_machine.check_tx(raw).code != 0:
                    raise RuntimeError("bench tx refused by CheckTx")
            checked = clock()
            height = state.height + 1
            ok, reason = state_machine.process_proposal(height, txs)
            if not ok:
                raise RuntimeError(reason)
            state_machine.begin_block(height, hashlib.sha256(b"%d" % height).digest())
            results = [state_machine.deliver_tx(raw, i) for i, raw in enumerate(txs)]
            delivered = clock()
            state_machine.end_block()
            digested = clock()
            state_machine.commit()
            done = clock()
            if any(r.code != 0 for r in results):
                raise RuntimeError("bench tx refused in FinalizeBlock")
            if len(txs) == batches_per_block:  # the big-batch blocks: per-phase figures
                records = 1024 * batches_per_block
                for name, span in (
                    ("checktx", checked - began),
                    ("deliver", delivered - checked),
                    ("digest", digested - delivered),
                    ("store", done - digested),
                ):
                    phases[name].append(span / records)
            return done - began

        nonce = 2
        big, plain = [], []
        for _ in range(blocks):
            txs = []
            for b in range(batches_per_block):
                session = hashlib.sha256(b"bench/%d/%d" % (nonce, b)).digest()
                rows = [
                    (s, 0, hashlib.sha256(b"%d/%d/%d" % (nonce, b, s)).digest())
                    for s in range(1024)
                ]
                txs.append(
                    commit_batch.encode_batch(
                        commit_batch.KIND_COMMIT, session, rows, keys[b], nonce
                    )
                )
            big.append(run(txs) / (1024 * batches_per_block))
            txs = []
            for i, key in enumerate(keys):
                session = hashlib.sha256(b"plain/%d/%d" % (nonce, i)).digest()
                rows = [(0, 0, hashlib.sha256(b"p/%d/%d" % (nonce, i)).digest())]
                txs.append(
                    commit_batch.encode_batch(
                        commit_batch.KIND_COMMIT, session, rows, key, nonce + 1
                    )
                )
            plain.append(run(txs) / len(keys))
            nonce += 2
    return {
        **{
            f"app_cpu_us_per_record_{name}": round(1e6 * statistics.median(spans), 2)
            for name, spans in phases.items()
        },
        "app_cpu_us_per_record_binary_1024": round(1e6 * statistics.median(big), 2),
        "app_cpu_us_per_tx_binary_1": round(1e6 * statistics.median(plain), 1),
    }


# -- one network -------------------------------------------------------------------------------


def bench_app(
    app: str,
    args: argparse.Namespace,
    base_port: int,
    batch: int = 1,
    encoding: str = "json",
    concurrency: int | None = None,
    rate_records_s: float = 0.0,
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"planet-bench-committee-{app}-"))
    network = init_network(
        InitOptions(
            directory=workdir,
            validators=args.validators,
            base_port=base_port,
            timeout_commit=args.timeout_commit,
            app=app,
            epoch_length=args.epoch_length,
        )
    )
    try:
        start_network(network, timeout_s=90, progress=lambda line: log.info("%s: %s", app, line))
        factory = (
            PlanetTxs(batch, run_id=os.urandom(8).hex(), encoding=encoding)
            if app == "planet"
            else KvstoreTxs(args.kv_tx_bytes)
        )
        if isinstance(factory, PlanetTxs):
            factory.validator_homes = [Path(v.home) for v in network.validators]
        workers = concurrency or args.concurrency
        # paced: each worker sends one tx per interval, so the offered load is the rate
        interval = workers * batch / rate_records_s if rate_records_s > 0 else 0.0
        log.info(
            "%s: load for %.0f s with %d workers (%s)",
            factory.name,
            args.duration,
            workers,
            f"{rate_records_s:.0f} records/s offered" if interval else "as fast as accepted",
        )
        return asyncio.run(
            run_load(
                network,
                factory,
                duration_s=args.duration,
                concurrency=workers,
                drain_s=args.drain,
                interval_s=interval,
            )
        )
    finally:
        stop_network(network)
        if args.keep:
            log.info("kept %s", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _machine() -> dict[str, Any]:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": None,
        "torch": torch_version,
        "device": "cpu",
        "cometbft": COMETBFT_VERSION,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0, help="load seconds per app")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent broadcasters")
    parser.add_argument(
        "--runs",
        default="binary:1024,binary:1,json:1",
        help="Planet runs, comma-separated ENCODING:BATCH (encoding binary = compact batches of "
        "protocol.commit_batch, json = JSON commit txs); the first gives the unsuffixed metrics, "
        "each gets `_<encoding>_<batch>` metrics (default %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="offered commitment records/s for runs with batch > 1 (0: as fast as CheckTx "
        "accepts; default %(default)s)",
    )
    parser.add_argument(
        "--batch-concurrency",
        type=int,
        default=16,
        help="workers (registered nodes) for runs with batch > 1 (default %(default)s)",
    )
    parser.add_argument("--kv-tx-bytes", type=int, default=100)
    parser.add_argument("--timeout-commit", default="300ms")
    parser.add_argument("--epoch-length", type=int, default=100)
    parser.add_argument("--drain", type=float, default=20.0, help="max seconds to drain")
    parser.add_argument("--base-port", type=int, default=24000)
    parser.add_argument("--skip-kvstore", action="store_true")
    parser.add_argument("--skip-planet", action="store_true")
    parser.add_argument(
        "--skip-in-process", action="store_true", help="skip the one-app CPU measurement"
    )
    parser.add_argument("--keep", action="store_true", help="keep the network directories")
    # --quick: one 1-validator network, one binary run, 1 s of load (the kvstore ceiling is
    # CometBFT's own code, not Planet's: not started)
    quick = {
        "validators": 1, "duration": 1.0, "concurrency": 4, "runs": "binary:16",
        "batch_concurrency": 2, "drain": 3.0, "skip_in_process": True, "skip_kvstore": True,
    }  # fmt: skip
    args = parse_with_quick(parser, quick, argv)
    logging.basicConfig(
        level=os.environ.get("PLANET_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )

    runs = []
    for spec in str(args.runs).split(","):
        encoding, _, size = spec.strip().partition(":")
        if encoding not in ("binary", "json") or not size.isascii() or not size.isdigit():
            parser.error(f"--runs: {spec!r} is not ENCODING:BATCH (binary:1024, json:1)")
        runs.append((encoding, int(size)))
    machine = _machine()  # before this bench loads the machine
    metrics: dict[str, Any] = {}
    reject_logs: dict[str, list[str]] = {}  # beside the metrics: the first CheckTx refusals
    if not args.skip_in_process:
        metrics.update(app_cpu_per_record())
    if not args.skip_planet:
        for index, (encoding, batch) in enumerate(runs):
            big = batch > 1
            result = bench_app(
                "planet",
                args,
                args.base_port,
                batch,
                encoding,
                concurrency=args.batch_concurrency if big else args.concurrency,
                rate_records_s=args.rate if big else 0.0,
            )
            reject_logs[f"{encoding}_{batch}"] = result.pop("reject_logs")
            if index == 0:
                metrics.update(result)
            for key in (
                "committed_tx_s",
                "commitments_s",
                "block_time_ms",
                "block_time_ms_max",
                "broadcast_to_commit_ms_p50",
                "broadcast_to_commit_ms_p99",
                "lost_txs",
                "failed_in_block_txs",
                "cpu_ms_per_tx_app",
                "cpu_cores_busy_app",
                "cpu_cores_busy_cometbft",
            ):
                metrics[f"{key}_{encoding}_{batch}"] = result[key]
    if not args.skip_kvstore:
        kv = bench_app("kvstore", args, args.base_port + 100)
        reject_logs["kvstore"] = kv.pop("reject_logs")
        metrics.update({f"{k}_kvstore": v for k, v in kv.items()})
        for encoding in ("binary", "json"):
            plain = metrics.get(f"committed_tx_s_{encoding}_1")
            if plain is not None and kv["committed_tx_s"]:
                metrics[f"ratio_plain_tx_s_{encoding}_vs_kvstore"] = round(
                    plain / kv["committed_tx_s"], 3
                )
    metrics["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(
        json.dumps(
            {
                "bench": "committee",
                "machine": machine,
                "config": {
                    "validators": args.validators,
                    "quick": args.quick,
                    "duration_s": args.duration,
                    "concurrency": args.concurrency,
                    "batch_concurrency": args.batch_concurrency,
                    "runs": [f"{e}:{b}" for e, b in runs],
                    "rate_records_s": args.rate,
                    "kv_tx_bytes": args.kv_tx_bytes,
                    "timeout_commit": args.timeout_commit,
                    "load": "broadcast_tx_sync, one tx in flight per worker, workers spread over "
                    "all validators' RPC ports; NewBlock websocket on validator 0",
                },
                "metrics": metrics,
                "reject_logs": reject_logs,
                "targets": {
                    "commitments_s": {"op": ">=", "value": 10000},
                    "block_time_ms": {"op": "<=", "value": 1000},
                    "ratio_plain_tx_s_binary_vs_kvstore": {"op": ">=", "value": 0.5},
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
