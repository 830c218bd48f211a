"""The committee chain end to end: 4 real CometBFT validators, each with its own Planet ABCI app
process, driven only through `planet committee …` (subprocesses) and CometBFT's RPC.

The tests run in file order on one network (module fixture) and build on each other:

1. start-up: all 8 processes alive (kill -0), peers connected, blocks committed;
2. signed txs (node registrations, batched commitments) committed and visible through queries;
   vote extensions are on (the block after the first epoch's end starts with the extended-commit
   tx; checked after the txs, by when the chain has passed that block);
3. one validator killed (cometbft and app, SIGKILL) under load (6 accounts send commit batches
   at every height until the survivors have committed 4 more blocks, the dead one's turn to
   propose among them): blocks keep coming and every tx that CheckTx accepted on a surviving
   node is in a block, with code 0 — or BAD_NONCE when gossip brought one signer's consecutive
   txs to the proposer out of order (refused, never applied; seen once in a CI run) — (a
   crashed node's own mempool is volatile: load goes to the survivors);
4. a second validator killed: the chain halts (2 of 4 < 2/3) and the survivors agree on every
   block hash (no fork);
5. `planet committee up` restarts both: they catch up and every app reports the same app hash
   as the chain's headers at the same height;
6. one app process killed: its cometbft stops with it (CometBFT cannot reconnect to a new app),
   `up` restarts both, the app replays from its SQLite state to the same app hash;
7. grammar junk txs (issue #13) sent to every validator: named codes, one app hash;
8. validator 3 restarted with the test-only Byzantine app (`tests/byzantine_app.py`: junk
   proposals, junk vote extensions): once the other three have refused both, they keep
   committing across the next epoch end with one app hash.

Ports: the first free block of 40 from 27100 on (step 100). Every wait is bounded; the fixture
stops every process even on failure.

Its own network, not the shared devnet (tests/e2e/conftest.py): it kills validators, halts
the chain and restarts one with a Byzantine app, which would stop every other scenario.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.extensions import VX_PREFIX
from node.chain.committee_link import CommitteeLink
from node.chain.committee_rpc import CommitteeRpc, TxRejectedError, decode_block_txs
from node.procs import run_captured
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.envelope import sign
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration

pytestmark = pytest.mark.e2e


def _free_base_port(first: int = 27100, last: int = 29900, span: int = 40) -> int:
    """The first base port (step 100) whose `span` ports are all free (other engineers' and
    CI's devnets use 27000-27139 too)."""
    for base in range(first, last, 100):
        free = True
        for port in range(base, base + span):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    free = False
                    break
        if free:
            return base
    raise RuntimeError("no free block of 40 ports in 27100-29939")


BASE_PORT = _free_base_port()
VALIDATORS = 4
EPOCH_LENGTH = 10  # epochs close (and vote extensions are injected) every ~4 s
HOSTILE_TXS_PER_VALIDATOR = 250
LOAD_BURST = 5  # commit batches each of the 6 accounts sends at every height under load


def _planet_command() -> list[str]:
    """`python -m planet` (the console script's code): forked by the session's zygote."""
    return [sys.executable, "-m", "planet"]


def planet(directory: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `planet committee <args> --dir <directory>`; fails the test with its stderr."""
    command = [*_planet_command(), "committee", *args, "--dir", str(directory)]
    done = run_captured(command, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}"
    return done


def status(directory: Path) -> dict[str, Any]:
    return json.loads(planet(directory, "status", "--json", timeout=30).stdout)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"pid {pid} survived SIGKILL"


def rpc_url(index: int) -> str:
    return f"http://127.0.0.1:{BASE_PORT + 10 * index + 1}"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@dataclass
class Account_:
    """A registered compute node: its ed25519 key and next nonce."""

    key: SigningKey
    nonce: int = 1
    steps: int = 0
    session: str = field(default_factory=lambda: "0x" + os.urandom(32).hex())

    @property
    def hex(self) -> str:
        return self.key.verify_key.encode().hex()

    def next_nonce(self) -> int:
        self.nonce += 1
        return self.nonce

    def registration(self, index: int) -> bytes:
        evm = Account.from_key(hashlib.sha256(self.key.encode() + b"/evm").digest())
        body = RegisterNode(
            evm_address=evm.address,
            evm_signature=sign_registration(evm.key, self.hex),
            role="compute",
            model="smollm2-135m",
            shards=(index % 3,),
            endpoint=f"http://127.0.0.1:{28000 + index}",
            capacity=4,
        )
        return sign(body, self.key, 1).encode()

    def commit_batch(self, size: int) -> bytes:
        records = []
        for _ in range(size):
            self.steps += 1
            digest = hashlib.sha256(f"{self.session}/{self.steps}".encode()).hexdigest()
            records.append(
                CommitmentRecord(
                    session=self.session, step=self.steps, shard=0, commitment="0x" + digest
                )
            )
        return sign(CommitBatch(tuple(records)), self.key, self.next_nonce()).encode()


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("committee") / "net"
    try:
        planet(
            directory,
            "init",
            "--validators",
            str(VALIDATORS),
            "--base-port",
            str(BASE_PORT),
            "--timeout-commit",
            "300ms",
            "--epoch-length",
            str(EPOCH_LENGTH),
        )
        planet(directory, "up", "--timeout", "90", timeout=150)
        yield directory
    finally:
        run_captured(
            [*_planet_command(), "committee", "down", "--dir", str(directory)],
            timeout=60,
            check=False,
        )
        for pid_file in (directory / "run").glob("*.pid"):  # belt and braces
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if alive(pid) and str(directory) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)
        logs = directory / "logs"
        if logs.is_dir():
            keep = Path(os.environ.get("PLANET_TEST_ARTIFACTS", "test-artifacts")) / "committee"
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(logs, keep)


@pytest.fixture(scope="module")
def accounts() -> list[Account_]:
    return [Account_(SigningKey(os.urandom(32))) for _ in range(6)]


async def _heights() -> list[int | None]:
    async def one(index: int) -> int | None:
        async with CommitteeRpc(rpc_url(index), timeout_s=2) as rpc:
            try:
                return (await rpc.status()).latest_block_height
            except Exception:
                return None

    return list(await asyncio.gather(*(one(i) for i in range(VALIDATORS))))


async def _wait_height(indexes: list[int], height: int, timeout_s: float) -> None:
    for index in indexes:
        async with CommitteeRpc(rpc_url(index), timeout_s=3) as rpc:
            await rpc.wait_for_height(height, timeout_s=timeout_s)


async def _assert_all_committed(
    hashes: list[str], via: int, timeout_s: float, *, reordered_ok: bool = False
) -> None:
    """Every hash is in a block with code 0, looked up (indexed txs) on validator `via`.
    `reordered_ok`: one signer's consecutive txs sent without waiting for their blocks may reach
    the proposer out of order (gossiped along two paths), and the later nonce then refuses the
    earlier one in its block (BAD_NONCE, which changes nothing); such a tx is in a block, not
    lost, and is accepted here — any other code fails the test."""
    found: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    async with CommitteeRpc(rpc_url(via), timeout_s=10) as rpc:
        while True:
            missing = [h for h in hashes if h not in found]
            for start in range(0, len(missing), 50):
                chunk = missing[start : start + 50]
                for h, result in zip(
                    chunk, await asyncio.gather(*(rpc.tx(h) for h in chunk)), strict=True
                ):
                    if result is not None:
                        found[h] = result
            if len(found) == len(hashes) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    lost = [h for h in hashes if h not in found]
    assert not lost, f"{len(lost)} of {len(hashes)} accepted txs never committed, e.g. {lost[0]}"
    failed = [
        r
        for r in found.values()
        if r.code != 0 and not (reordered_ok and r.code == Code.BAD_NONCE and "≤ last" in r.log)
    ]
    assert not failed, f"{len(failed)} txs failed in blocks, first: {failed[0]}"


async def _app_hash_matches_chain(index: int, reference: int, timeout_s: float = 30) -> int:
    """The app of validator `index` reports (h, hash); the chain's header h+1 (from validator
    `reference`) must carry the same app hash. Returns h."""
    async with (
        CommitteeRpc(rpc_url(index), timeout_s=5) as rpc,
        CommitteeRpc(rpc_url(reference), timeout_s=5) as ref,
    ):
        info = await rpc.abci_info()
        height = info["last_block_height"]
        await ref.wait_for_height(height + 1, timeout_s=timeout_s)
        header = (await ref.block(height + 1))["block"]["header"]
    assert header["app_hash"] == info["last_block_app_hash"], (
        f"validator{index}'s app has app hash {info['last_block_app_hash']} at height {height}, "
        f"the chain says {header['app_hash']}"
    )
    return height


def test_committee_up_all_processes_alive_and_connected(net: Path) -> None:
    body = status(net)
    assert len(body["validators"]) == VALIDATORS
    for row in body["validators"]:
        assert alive(row["app_pid"]), f"app of validator{row['validator']} is not running"
        assert alive(row["cometbft_pid"]), f"cometbft of validator{row['validator']} is down"
        assert row["error"] is None
        assert row["height"] >= 1
        assert row["peers"] == VALIDATORS - 1
        assert row["catching_up"] is False
    run(_wait_height(list(range(VALIDATORS)), max(r["height"] for r in body["validators"]) + 2, 20))


def test_committee_txs_registration_and_commit_batches_committed(
    net: Path, accounts: list[Account_]
) -> None:
    async def scenario() -> None:
        rpcs = [CommitteeRpc(rpc_url(i), timeout_s=10) for i in range(VALIDATORS)]
        try:
            sent = [
                await rpcs[i % VALIDATORS].broadcast_tx_sync(a.registration(i))
                for i, a in enumerate(accounts)
            ]
            await _assert_all_committed([s.hash for s in sent], via=0, timeout_s=30)
            # the validators attest the nodes' stake (as their stake watchers would): unstaked
            # registrations expire after registration_ttl blocks (docs/committee.md)
            codes = await _attest_stake(net, [a.hex for a in accounts])
            assert codes == [0] * (3 * len(accounts)), codes
            # validator 0 found them committed; validator 1 may still be a block behind
            node = await rpcs[0].abci_query(f"/node?key={accounts[0].hex}")
            assert node["stake"] == str(10**18)
            batches = [
                await rpcs[i % VALIDATORS].broadcast_tx_sync(a.commit_batch(8))
                for i, a in enumerate(accounts)
            ]
            # websocket path: one Tx-event subscription per hash on validator 1
            committed = await asyncio.gather(
                *(rpcs[1].wait_for_tx(b.hash, timeout_s=30) for b in batches)
            )
            assert [c.code for c in committed] == [0] * len(batches)
            assert all(c.height > 0 for c in committed)
            # validators commit each block on their own clock: the ones queried below may be a
            # block behind validator 1, so wait until they have committed the last batch's block
            top = max(c.height for c in committed)
            for rpc in rpcs[2:]:
                await rpc.wait_for_height(top, timeout_s=30)
            node = await rpcs[2].abci_query(f"/node?key={accounts[0].hex}")
            assert (node["key"], node["role"], node["status"]) == (
                accounts[0].hex,
                "compute",
                "JOIN",
            )
            recorded = await rpcs[3].abci_query(
                f"/commitments?node={accounts[1].hex}&session={accounts[1].session}"
            )
            assert len(recorded["commitments"]) == 8
            # a tx reusing a committed nonce is refused by CheckTx
            stale = sign(Heartbeat(), accounts[0].key, 1).encode()
            with pytest.raises(TxRejectedError) as raised:
                await rpcs[0].broadcast_tx_sync(stale)
            assert raised.value.tx_code == Code.BAD_NONCE
        finally:
            for rpc in rpcs:
                await rpc.close()

    run(scenario())


def test_committee_vote_extensions_enabled_extended_commit_follows_epoch_end(net: Path) -> None:
    async def first_txs() -> list[bytes]:
        async with CommitteeRpc(rpc_url(0), timeout_s=5) as rpc:
            await rpc.wait_for_height(EPOCH_LENGTH + 1, timeout_s=30)
            return decode_block_txs((await rpc.block(EPOCH_LENGTH + 1))["block"])

    block_txs = run(first_txs())
    assert block_txs, "the block after the first epoch's end has no txs"
    assert block_txs[0].startswith(VX_PREFIX)


async def _attest_stake(directory: Path, nodes: list[str]) -> list[int]:
    """Validators 0-2 each attest 10**18 wei for every node, as their stake watchers do: through
    `CommitteeLink.send`, one tx at a time, each waited for in its block (a burst of one signer's
    txs can reach the proposer out of nonce order along two gossip paths, and the later nonce
    then refuses the earlier one). The validators send side by side; the block codes come back."""

    async def one_validator(index: int) -> list[int]:
        doc = json.loads(
            (directory / f"node{index}" / "config" / "priv_validator_key.json").read_text()
        )
        key = SigningKey(base64.b64decode(doc["priv_key"]["value"])[:32])
        link = CommitteeLink([rpc_url(index)], key)
        try:
            return [
                (await link.send(AttestStake(node=node, amount=10**18), timeout_s=30))[0]
                for node in nodes
            ]
        finally:
            await link.close()

    per_validator = await asyncio.gather(*(one_validator(i) for i in range(3)))
    return [code for codes in per_validator for code in codes]


async def _load(
    accounts: list[Account_], targets: list[int], stop: asyncio.Event, accepted: list[str]
) -> int:
    """Each account sends LOAD_BURST commit batches, one at a time, to its target validator at
    every new height it sees, until `stop`: a steady stream in every block (back to back, the
    senders took whatever CPU the box had: 2,000-6,000 txs in 8 s, their cost and count set by
    the machine's load)."""
    rejected = 0

    async def worker(account: Account_, target: int) -> None:
        nonlocal rejected
        async with CommitteeRpc(rpc_url(target), timeout_s=10) as rpc:
            height = (await rpc.status()).latest_block_height
            while not stop.is_set():
                for _ in range(LOAD_BURST):
                    answer = await rpc.broadcast_tx_sync(account.commit_batch(4), check=False)
                    if answer.code == 0:
                        accepted.append(answer.hash)
                    else:
                        rejected += 1
                height = await rpc.wait_for_height(height + 1, timeout_s=60)

    await asyncio.gather(*(worker(a, targets[i % len(targets)]) for i, a in enumerate(accounts)))
    return rejected


def test_committee_one_validator_killed_under_load_keeps_committing_no_tx_lost(
    net: Path, accounts: list[Account_]
) -> None:
    victim = status(net)["validators"][3]
    accepted: list[str] = []

    async def scenario() -> tuple[int, int, int]:
        stop = asyncio.Event()
        load = asyncio.create_task(_load(accounts, [0, 1, 2], stop, accepted))
        while len(accepted) < 10 and not load.done():  # the load is flowing: kill under it
            await asyncio.sleep(0.1)
        kill(victim["cometbft_pid"])
        kill(victim["app_pid"])
        after_kill = max(h for h in await _heights() if h is not None)
        # the load goes on until the survivors have committed 4 more blocks (a round-robin
        # turn: the dead validator's turn to propose passes under it)
        try:
            await _wait_height([0, 1, 2], after_kill + 4, timeout_s=90)
        finally:
            stop.set()
        rejected = await load
        return after_kill, rejected, len(accepted)

    after_kill, rejected, count = run(scenario())
    assert count > 20, f"only {count} txs accepted under load"
    assert rejected == 0
    run(_assert_all_committed(accepted, via=0, timeout_s=60, reordered_ok=True))
    rows = status(net)["validators"]
    assert not rows[3]["cometbft_alive"] and not rows[3]["app_alive"]
    assert all(rows[i]["height"] >= after_kill + 3 for i in range(3))


def test_committee_two_validators_killed_halts_without_fork(net: Path) -> None:
    victim = status(net)["validators"][2]
    kill(victim["cometbft_pid"])
    kill(victim["app_pid"])
    time.sleep(3.0)  # let a block that was already in flight finish
    before = run(_heights())
    time.sleep(5.0)
    after = run(_heights())
    assert before[:2] == after[:2], (
        f"heights moved with 2 of 4 validators down: {before} -> {after}"
    )
    assert after[2] is None and after[3] is None

    async def hashes() -> tuple[dict[int, str], dict[int, str]]:
        async with (
            CommitteeRpc(rpc_url(0), timeout_s=10) as a,
            CommitteeRpc(rpc_url(1), timeout_s=10) as b,
        ):
            top = min(h for h in after[:2] if h is not None)
            return await a.block_hashes(1, top), await b.block_hashes(1, top)

    first, second = run(hashes())
    assert len(first) == min(h for h in after[:2] if h is not None)
    assert first == second


def test_committee_restarted_validators_catch_up_with_identical_app_hash(net: Path) -> None:
    halted = max(h for h in run(_heights()) if h is not None)
    planet(net, "up", "--timeout", "90", timeout=150)
    rows = status(net)["validators"]
    assert all(alive(r["app_pid"]) and alive(r["cometbft_pid"]) for r in rows)
    run(_wait_height(list(range(VALIDATORS)), halted + 3, timeout_s=60))
    for index in range(VALIDATORS):
        run(_app_hash_matches_chain(index, reference=(index + 1) % VALIDATORS))

    async def common_block() -> set[str]:
        hashes = set()
        for index in range(VALIDATORS):
            async with CommitteeRpc(rpc_url(index), timeout_s=5) as rpc:
                hashes.add((await rpc.block(halted + 2))["block_id"]["hash"])
        return hashes

    assert len(run(common_block())) == 1


def test_committee_app_killed_and_restarted_replays_to_same_app_hash(net: Path) -> None:
    row = status(net)["validators"][1]
    before = run(_app_hash_matches_chain(1, reference=0))
    kill(row["app_pid"])
    deadline = time.monotonic() + 20
    while alive(row["cometbft_pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    cometbft_stopped_by_itself = not alive(row["cometbft_pid"])
    planet(net, "up", "--timeout", "90", timeout=150)
    rows = status(net)["validators"]
    assert rows[1]["app_pid"] != row["app_pid"] and alive(rows[1]["app_pid"])
    assert rows[1]["cometbft_pid"] != row["cometbft_pid"] and alive(rows[1]["cometbft_pid"])
    run(_wait_height([1], before + 3, timeout_s=60))
    after = run(_app_hash_matches_chain(1, reference=0))
    assert after > before
    assert cometbft_stopped_by_itself, "cometbft kept running without its app"


def test_committee_hostile_txs_to_every_validator_keep_one_app_hash(net: Path) -> None:
    """Grammar junk (tests/integration/test_abci_fuzz.py) sent to all 4 validators' RPC: every
    answer is a named code, all processes stay up, and the 4 apps keep one app hash."""
    from abci_app.codes import Code as Codes
    from tests.integration.test_abci_fuzz import NAMED, Grammar, over_rpc

    grammar = Grammar(1313)
    for index in range(VALIDATORS):
        calls = [
            ("broadcast_tx_sync", {"tx": base64.b64encode(grammar.tx()).decode()})
            for _ in range(HOSTILE_TXS_PER_VALIDATOR)
        ]
        for reply in over_rpc(rpc_url(index), calls):
            if "error" not in reply:  # CometBFT's own refusals never reach the app
                assert reply["result"]["code"] in NAMED - {int(Codes.OK)}, reply
    start = max(h for h in run(_heights()) if h is not None)
    run(_wait_height(list(range(VALIDATORS)), start + 3, timeout_s=60))
    for index in range(VALIDATORS):
        run(_app_hash_matches_chain(index, reference=(index + 1) % VALIDATORS))
    rows = status(net)["validators"]
    assert all(alive(r["app_pid"]) and alive(r["cometbft_pid"]) for r in rows)


def _spawn_byzantine(directory: Path, index: int) -> None:
    """Restart validator `index` with the test-only Byzantine app (`tests/byzantine_app.py`:
    junk proposals and junk vote extensions) in place of its app; pid files let `planet
    committee down` stop it as usual."""
    from deploy.committee.network import load_network
    from deploy.committee.start import app_command, cometbft_command, wait_port_open

    network = load_network(directory)
    validator = network.validators[index]
    root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath}
    if os.environ.get("PLANET_BYZANTINE_PYTHONPATH"):  # to run the attacker from other code
        env["PYTHONPATH"] = os.environ["PLANET_BYZANTINE_PYTHONPATH"]
    python, _, module, *arguments = app_command(validator)
    assert module == "abci_app", module
    commands = [
        ("app", [python, "-m", "tests.byzantine_app", *arguments]),
        ("cometbft", cometbft_command(network, validator)),
    ]
    for process, argv in commands:
        with open(network.log_path(process, index), "ab") as log_file:
            log_file.write(b"\n=== byzantine start\n")
            log_file.flush()
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=validator.home,
                start_new_session=True,
                env=env,
            )
        network.pid_path(process, index).write_text(f"{child.pid}\n")
        if process == "app":  # cometbft connects once the app listens
            wait_port_open(validator.abci_port, child.pid, f"byzantine app{index}",
                           network.log_path("app", index), timeout_s=60)  # fmt: skip


def _rejections(directory: Path, index: int) -> tuple[int, int]:
    text = (directory / "logs" / f"app{index}.log").read_text(errors="replace")
    return text.count("process_proposal rejected"), text.count("vote extension rejected")


def test_committee_one_byzantine_validator_cannot_stop_or_fork_the_others(net: Path) -> None:
    """Validator 3 proposes junk txs and extends junk votes (floats, deep nesting, NaN,
    duplicate keys, bad UTF-8) at every height: the other three reject them and keep
    committing, across an epoch end (an extended commit) after both junk kinds were refused,
    with one app hash."""
    planet(net, "down", "--only", "3", timeout=60)
    _spawn_byzantine(net, 3)
    rows = status(net)["validators"]
    assert alive(rows[3]["app_pid"]) and alive(rows[3]["cometbft_pid"])
    before = [_rejections(net, i) for i in range(3)]
    # until validator 3 has extended a vote and proposed (round robin), rejected by the others
    deadline = time.monotonic() + 150
    while True:
        after = [_rejections(net, i) for i in range(3)]
        proposals = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        extensions = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
        if (proposals > 0 and extensions > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert extensions > 0, f"no junk extension (heights {run(_heights())})"
    assert proposals > 0, f"no junk proposal (heights {run(_heights())})"
    # then across the next epoch end (an extended commit) with it in the set
    seen = max(h for h in run(_heights())[:3] if h is not None)
    run(_wait_height([0, 1, 2], (seen // EPOCH_LENGTH + 1) * EPOCH_LENGTH + 2, timeout_s=150))
    for index in range(3):
        run(_app_hash_matches_chain(index, reference=(index + 1) % 3))
    # the Byzantine validator's own app still executes the agreed blocks to the same hash
    run(_app_hash_matches_chain(3, reference=0))
    rows = status(net)["validators"]
    assert all(alive(rows[i]["app_pid"]) and alive(rows[i]["cometbft_pid"]) for i in range(4))
