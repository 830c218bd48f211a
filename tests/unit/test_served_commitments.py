"""Served-work records: what the node keeps (`node.server.served`), the hook in its forward path,
and the agent's commit-reveal of them (`node.agent.commitments`) against an in-process chain."""

from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from abci_app.codes import Code
from abci_app.queries import query
from node.agent.commitments import Committer
from node.chain.committee_rpc import TxRejectedError
from node.client.credit_wallet import CreditWallet
from node.client.paying import CreditPayer
from node.model.fingerprint import fingerprint_bytes
from node.server.app import STATE_KEY, create_app
from node.server.config import ServerConfig
from node.server.served import SERVED_KEY, ServedLog
from protocol.committee.registry import AttestStake, RegisterNode, sign_registration
from protocol.eip712 import address_of
from protocol.frames.sessions import session_tag
from protocol.served import (
    RECORD_BYTES,
    SPOOL_MAGIC,
    decode_records,
    inputs_digests,
    segment_session,
    served_output_hash,
)
from tests.committee_chain import Chain, seeded_evm_key, seeded_key
from tests.doubles.fake_shard import FakeShard
from tests.unit.stream_link import Link

pytestmark = pytest.mark.unit

H = 16


def tag(label: str) -> str:
    """A session tag as the node keys sessions (64 lowercase hex)."""
    return session_tag(f"capability-{label}-0123456789")


def activations(start: int, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed * 1000 + start)
    return rng.standard_normal((1, count, H)).astype(np.float32)


def feed(log: ServedLog, tag: str, chunks: list[int], seed: int = 0) -> tuple[np.ndarray, ...]:
    """Run frames of `chunks` positions through the log; returns all inputs and outputs."""
    start, inputs, outputs = 0, [], []
    for count in chunks:
        hidden = activations(start, count, seed)
        out = hidden * 2 + 1
        log.record(tag, hidden, np.arange(start, start + count), out)
        inputs.append(hidden)
        outputs.append(out)
        start += count
    return np.concatenate(inputs, axis=1), np.concatenate(outputs, axis=1)


def spool(directory: Path) -> list[Any]:
    records = []
    for path in sorted(directory.glob("served-*.bin")):
        data = path.read_bytes()
        assert data.startswith(SPOOL_MAGIC)
        assert (len(data) - len(SPOOL_MAGIC)) % RECORD_BYTES == 0
        records += decode_records(data[len(SPOOL_MAGIC) :])
    return records


# --- the node's log -------------------------------------------------------------------------------


def test_served_log_blocks_of_32_recorded_with_fingerprints_and_inputs(tmp_path: Path) -> None:
    log = ServedLog(tmp_path, shard=2)
    inputs, outputs = feed(log, tag("a"), [40] + [1] * 30)  # prefill 40, decode 30: 70 positions
    records = spool(tmp_path)
    assert [(r.step, r.shard) for r in records] == [(0, 2), (1, 2)]  # block 2 not yet complete
    expected = fingerprint_bytes(torch.from_numpy(outputs[:, :64]), 0)
    chain = inputs_digests(inputs)  # the inputs bound into each block's output hash
    assert records[0].output_hash == served_output_hash(expected[:258], chain[0])
    assert records[1].output_hash == served_output_hash(expected[258:], chain[1])
    assert len({r.salt for r in records}) == 2 and len({r.session for r in records}) == 1
    ticket = log.ticket(records[1].session_hex, 1)
    assert ticket is not None and ticket.start == 32
    assert np.array_equal(ticket.inputs, inputs[:, :64])
    assert ticket.fingerprint == expected[258:]
    assert ticket.record == records[1]
    assert log.ticket(records[1].session_hex, 2) is None
    # closing seals the partial last block; later positions are not recorded
    assert log.seal(tag("a")) is True
    last = spool(tmp_path)[-1]
    assert (last.step, last.shard) == (2, 2)
    tail = fingerprint_bytes(torch.from_numpy(outputs[:, 64:]), 64)
    assert last.output_hash == served_output_hash(tail, chain[2])  # positions 64 … 69
    log.record(tag("a"), activations(70, 1), np.arange(70, 71), activations(70, 1))
    assert len(spool(tmp_path)) == 3
    assert log.stats()["unrecorded_positions"] == 1 and log.stats()["partial_blocks"] == 1


def test_served_log_keeps_committing_a_session_that_rewinds_every_position_paid_for(
    tmp_path: Path,
) -> None:
    """Speculative decoding rewinds the cache after rejected guesses; the client pays every
    frame's positions (CreditPayer `due` over the positions sent) and the log commits them all,
    each rewind opening the session's next segment (`segment_session`): what is recorded equals
    what was paid, and every block of every segment is a ticket its inputs recompute
    (before: the log stopped at the first rewind: 34 of the 94 positions below committed)."""
    log = ServedLog(tmp_path, shard=0)
    session = tag("a")
    # (start, count) frames: a prefill, then speculative passes, each next frame starting
    # after the last one's first position (its accepted guesses) — a rewind where it starts
    # before the last one's end: back into the block before, onto a block boundary, within one
    frames = [(0, 30), (30, 4), (31, 4), (35, 4), (37, 4), (38, 6), (44, 4), (45, 4), (48, 4)]
    frames += [(52, 4), (53, 4), (56, 6), (62, 4), (64, 6), (66, 6)]
    sequence: dict[int, np.ndarray] = {}  # position → the input the cache holds there
    for number, (start, count) in enumerate(frames):
        hidden = activations(start, count, seed=number)
        for offset in range(count):
            sequence[start + offset] = hidden[0, offset]
        for gone in [p for p in sequence if p >= start + count]:
            del sequence[gone]  # the rewind dropped them
        log.record(session, hidden, np.arange(start, start + count), hidden * 2 + 1)
    paid = CreditPayer(CreditWallet(tmp_path / "credits.json"), {"node": 1}, min_positions=1)
    positions = sum(count for _, count in frames)
    assert paid.due(1, ["node"], positions) == [positions]  # a credit per position at price 1
    stats = log.stats()
    assert stats["positions"] == positions and stats["unrecorded_positions"] == 0
    rewinds = sum(1 for (a, n), (b, _) in pairwise(frames) if b < a + n)
    assert stats["segments"] == rewinds == 9
    log.seal(session)
    records = spool(tmp_path)
    sessions = {r.session for r in records}
    assert len(sessions) == rewinds + 1 and bytes.fromhex(session) in sessions
    assert segment_session(bytes.fromhex(session), 9) in sessions
    assert len({(r.session, r.step) for r in records}) == len(records)  # never twice
    for record in records:  # a verifier's recomputation: out = 2·in + 1 over the ticket
        ticket = log.ticket(record.session_hex, record.step)
        assert ticket is not None and ticket.record == record
        out = torch.from_numpy(ticket.inputs * 2 + 1)
        expected = fingerprint_bytes(out[:, ticket.start :], ticket.start)
        assert ticket.fingerprint == expected
        digest = inputs_digests(ticket.inputs)[record.step]
        assert record.output_hash == served_output_hash(expected, digest)
    # the last segment's inputs are the sequence the cache holds at the end
    last = log.ticket(records[-1].session_hex, records[-1].step)
    assert last is not None
    held = np.stack([sequence[p] for p in range(len(sequence))])
    assert np.array_equal(last.inputs[0], held[: last.inputs.shape[1]])
    assert last.inputs.shape[1] == len(sequence) == 72


def test_served_log_spool_private_and_session_is_the_tag(tmp_path: Path) -> None:
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [32])
    feed(log, tag("b"), [32])
    log.record("not-a-tag", activations(0, 32), np.arange(32), activations(0, 32))
    [path] = list(tmp_path.glob("served-*.bin"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    a, b = spool(tmp_path)
    assert (a.session_hex, b.session_hex) == ("0x" + tag("a"), "0x" + tag("b"))
    assert log.stats()["unrecorded_positions"] == 32


def test_served_log_idle_sessions_sealed(tmp_path: Path) -> None:
    now = [0.0]
    log = ServedLog(tmp_path, shard=0, seal_idle_s=10, clock=lambda: now[0])
    feed(log, tag("a"), [5])
    now[0] = 9.0
    assert log.seal_idle() == 0
    now[0] = 10.5
    assert log.seal_idle() == 1
    [record] = spool(tmp_path)
    assert record.step == 0


def test_served_log_memory_cap_evicts_oldest_session_counted(tmp_path: Path) -> None:
    per_session = 64 * H * 4  # inputs of 64 positions
    log = ServedLog(tmp_path, shard=0, max_bytes=int(2.5 * per_session) + 2000)
    for label in ("a", "b", "c"):
        feed(log, tag(label), [64], seed=ord(label))
    stats = log.stats()
    assert stats["sessions"] == 2 and stats["evicted_sessions"] == 1
    assert stats["bytes"] <= stats["max_bytes"]
    first = spool(tmp_path)[0]
    assert log.ticket(first.session_hex, 0) is None  # dropped whole; its record stays
    assert len(spool(tmp_path)) == 6
    # a dropped session that continues is not recorded again
    log.record(tag("a"), activations(64, 1), np.arange(64, 65), activations(64, 1))
    assert log.stats()["unrecorded_positions"] == 1


# --- the hook in the node's forward path ----------------------------------------------------------


async def test_node_with_commit_dir_records_what_it_served(aiohttp_client, tmp_path: Path) -> None:
    config = ServerConfig(
        manifest_path=Path("unused.json"), shard_id=1, commit_dir=tmp_path / "served"
    )
    app = create_app(config, FakeShard(shard_id=1, hidden_size=H))
    client = await aiohttp_client(app)
    session = "session-capability-xyz-0001"
    x = activations(0, 40)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, session, 1)
    await link.forward(1, 0, x)
    assert [r.step for r in spool(tmp_path / "served")] == [0]
    assert (await link.close(1))["op"] == "closed"
    served = app[SERVED_KEY]
    served.seal_idle(lambda t: t in app[STATE_KEY].store)  # what the sealer runs every second
    records = spool(tmp_path / "served")
    assert [r.step for r in records] == [0, 1]  # the closed session's partial block, sealed
    assert {r.session_hex for r in records} == {"0x" + session_tag(session)}
    ticket = served.ticket(records[1].session_hex, 1)
    assert np.array_equal(ticket.inputs, x)
    expected = fingerprint_bytes(torch.from_numpy(x[:, 32:] + np.float32(2)), 32)  # h + shard + 1
    assert ticket.fingerprint == expected


async def test_node_without_commit_dir_records_nothing(aiohttp_client) -> None:
    config = ServerConfig(manifest_path=Path("unused.json"), shard_id=1)
    app = create_app(config, FakeShard(shard_id=1, hidden_size=H))
    client = await aiohttp_client(app)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, "session-capability-xyz-0002", 1)
    await link.forward(1, 0, activations(0, 33))
    assert SERVED_KEY not in app and app[STATE_KEY].forward_hooks == []


# --- the agent: commit, then reveal after the epoch, against the in-process chain -----------------


@dataclass
class Sent:
    hash: str


class ChainLink:
    """The agent's link, answered by `tests.committee_chain.Chain` (one block per submitted tx)."""

    def __init__(self, chain: Chain, key: Any) -> None:
        self.chain, self.key, self.results = chain, key, {}

    async def submit(self, body: Any, *, binary: bool = False) -> Sent:
        raw = self.chain.batch_tx(body, self.key) if binary else self.chain.tx(body, self.key)
        check = self.chain.machine.check_tx(raw)
        if check.code != Code.OK:
            raise TxRejectedError("chain", code=int(check.code), log_text=check.log)
        [result] = self.chain.block([raw])
        name = hashlib.sha256(raw).hexdigest()
        self.results[name] = (result, self.chain.state.height)
        return Sent(name)

    async def committed(self, tx_hash: str, *, timeout_s: float = 15.0) -> Any:
        result, height = self.results[tx_hash]

        @dataclass
        class Result:
            code: int
            log: str
            height: int

        return Result(int(result.code), result.log, height)


def ask(chain: Chain, path: str) -> Any:
    code, value, text = query(chain.state, path, b"")
    assert code == Code.OK, text
    return json.loads(value)


def registered_chain(staked: bool = True) -> tuple[Chain, Any]:
    """A chain with the node registered (and `staked`: only staked nodes commit)."""
    chain = Chain()  # epoch length 5
    key = seeded_key("served-node")
    evm = seeded_evm_key("served-node")
    body = RegisterNode(
        address_of(evm), sign_registration(evm, key.verify_key.encode().hex()),
        "compute", "m", (0,), "http://n", 2,
    )  # fmt: skip
    assert chain.block([chain.tx(body, key)])[0].code == Code.OK
    if staked:
        stake(chain, key)
    return chain, key


def stake(chain: Chain, key: Any) -> None:
    node = key.verify_key.encode().hex()
    attests = [chain.tx(AttestStake(node, 10**18), v.key) for v in chain.validators[:3]]
    assert {r.code for r in chain.block(attests)} == {Code.OK}


async def test_agent_keeps_records_queued_while_unstaked_and_commits_them_once_staked(
    tmp_path: Path,
) -> None:
    """The chain refuses an unstaked node's commit (NOT_STAKED, abci_app/commitments.py): the
    agent keeps the records queued and commits them once the node is staked, none lost."""
    chain, key = registered_chain(staked=False)
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [64])  # 2 blocks
    committer = Committer(tmp_path, ChainLink(chain, key))
    epoch_length = chain.state.genesis.epoch_length
    await committer.step(chain.state.height, epoch_length)
    assert committer.pending() == {"uncommitted": 2, "unrevealed": 0}
    assert ask(chain, "/commitments")["commitments"] == []
    stake(chain, key)
    await committer.step(chain.state.height, epoch_length)
    assert committer.pending() == {"uncommitted": 0, "unrevealed": 2}
    assert len(ask(chain, "/commitments")["commitments"]) == 2


async def test_agent_commits_then_reveals_after_the_epoch(tmp_path: Path) -> None:
    chain, key = registered_chain()
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [100])  # 3 full blocks
    feed(log, tag("b"), [32], seed=1)  # 1 block of another session
    committer = Committer(tmp_path, ChainLink(chain, key))
    epoch_length = chain.state.genesis.epoch_length
    await committer.step(chain.state.height, epoch_length)
    commitments = ask(chain, "/commitments")["commitments"]
    assert len(commitments) == 4 and all("match" not in c for c in commitments)
    assert committer.counters["commit_txs"] == 2  # one binary batch per session
    records = {(r.session_hex, r.step): r for r in spool(tmp_path)}
    for c in commitments:
        assert c["commitment"] == "0x" + records[(c["session"], c["step"])].commitment().hex()
    await committer.step(chain.state.height, epoch_length)  # same epoch: nothing to reveal
    assert committer.pending() == {"uncommitted": 0, "unrevealed": 4}
    chain.advance_to((chain.state.height // epoch_length + 1) * epoch_length + 1)
    await committer.step(chain.state.height, epoch_length)
    commitments = ask(chain, "/commitments")["commitments"]
    assert [c["match"] for c in commitments] == [True] * 4
    assert ask(chain, "/evidence")["evidence"] == []
    assert committer.pending() == {"uncommitted": 0, "unrevealed": 0}


async def test_agent_restart_neither_commits_twice_nor_forgets(tmp_path: Path) -> None:
    chain, key = registered_chain()
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [64])
    link = ChainLink(chain, key)
    epoch_length = chain.state.genesis.epoch_length
    await Committer(tmp_path, link).step(chain.state.height, epoch_length)
    feed(log, tag("b"), [32], seed=2)
    again = Committer(tmp_path, link)  # a restarted agent
    await again.step(chain.state.height, epoch_length)
    assert again.counters["committed"] == 1  # only the new record
    assert len(ask(chain, "/commitments")["commitments"]) == 3
    chain.advance_to(chain.state.height + 2 * epoch_length)
    await again.step(chain.state.height, epoch_length)
    assert [c["match"] for c in ask(chain, "/commitments")["commitments"]] == [True] * 3
    assert ask(chain, "/evidence")["evidence"] == []


async def test_agent_skips_foreign_spool_files(tmp_path: Path) -> None:
    chain, key = registered_chain()
    (tmp_path / "served-0000-1.bin").write_bytes(b"not a spool at all")
    committer = Committer(tmp_path, ChainLink(chain, key))
    await committer.step(chain.state.height, chain.state.genesis.epoch_length)
    assert committer.counters["bad_files"] == 1 and committer.counters["committed"] == 0


def test_topk_rows_numpy_equals_torch_bit_for_bit() -> None:
    from node.model.fingerprint import topk_rows, topk_rows_numpy

    rng = np.random.default_rng(7)
    cases = [
        rng.standard_normal((1, 40, 576)).astype(np.float32),
        (rng.standard_normal((1, 9, 64)) * 1e5).astype(np.float32),  # saturates at ±65504
        (rng.standard_normal((1, 9, 64)) * 1e-6).astype(np.float32),  # fp16 subnormals
        np.round(rng.standard_normal((1, 12, 32)) * 2).astype(np.float32),  # many |x| ties
        np.array([[[0.0, -0.0, 1.0, -1.0, 1.0, 0.5, -0.5, 2.0]]], dtype=np.float32),
    ]
    for case in cases:
        assert topk_rows_numpy(case) == topk_rows(torch.from_numpy(case))
        assert topk_rows_numpy(case[0]) == topk_rows(torch.from_numpy(case[0]))


async def test_agent_too_late_to_reveal_counts_expired_and_sends_nothing(tmp_path: Path) -> None:
    chain, key = registered_chain()
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [32])
    link = ChainLink(chain, key)
    committer = Committer(tmp_path, link)
    epoch_length = chain.state.genesis.epoch_length
    await committer.step(chain.state.height, epoch_length, retention_epochs=2)
    chain.advance_to(chain.state.height + 4 * epoch_length)  # past the window of 2 epochs
    sent = len(link.results)
    await committer.step(chain.state.height, epoch_length, retention_epochs=2)
    assert committer.counters["expired"] == 1 and committer.counters["revealed"] == 0
    assert len(link.results) == sent  # no reveal tx
    assert committer.pending() == {"uncommitted": 0, "unrevealed": 0}


async def test_agent_deletes_rotated_spool_files_once_all_revealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from protocol import served as spool_format

    monkeypatch.setattr(spool_format, "SPOOL_FILE_BYTES", 8 + 2 * RECORD_BYTES)  # 2 per file
    chain, key = registered_chain()
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [32 * 5])  # 5 blocks: files of 2, 2 and 1 record
    assert len(list(tmp_path.glob("served-*.bin"))) == 3
    committer = Committer(tmp_path, ChainLink(chain, key))
    epoch_length = chain.state.genesis.epoch_length
    await committer.step(chain.state.height, epoch_length)
    assert len(list(tmp_path.glob("served-*.bin"))) == 3  # committed, not yet revealed
    chain.advance_to(chain.state.height + 2 * epoch_length)
    await committer.step(chain.state.height, epoch_length)
    assert [c["match"] for c in ask(chain, "/commitments")["commitments"]] == [True] * 5
    left = list(tmp_path.glob("served-*.bin"))
    assert len(left) == 1  # the node may still append to its current (short) file
    state = json.loads((tmp_path / "agent-state.json").read_text())
    assert list(state["files"]) == [left[0].name]


class FlakyLink(ChainLink):
    """Loses the answer for the `lose`-th submitted tx (it still lands on chain)."""

    def __init__(self, chain: Chain, key: Any, lose: int) -> None:
        super().__init__(chain, key)
        self.lose, self.submitted, self.lost = lose, 0, set()

    async def submit(self, body: Any, *, binary: bool = False) -> Sent:
        sent = await super().submit(body, binary=binary)
        self.submitted += 1
        if self.submitted == self.lose:
            self.lost.add(sent.hash)
        return sent

    async def committed(self, tx_hash: str, *, timeout_s: float = 15.0) -> Any:
        if tx_hash in self.lost:
            self.lost.discard(tx_hash)
            raise TimeoutError("answer lost")
        return await super().committed(tx_hash, timeout_s=timeout_s)


async def test_agent_pipelined_commits_survive_a_lost_answer(tmp_path: Path) -> None:
    chain, key = registered_chain()
    log = ServedLog(tmp_path, shard=0)
    for label in "abc":  # three sessions: three batches in one pipelined round
        feed(log, tag(label), [64], seed=ord(label))
    link = FlakyLink(chain, key, lose=2)  # the second batch lands, its answer is lost
    committer = Committer(tmp_path, link)
    epoch_length = chain.state.genesis.epoch_length
    await committer.step(chain.state.height, epoch_length)
    assert committer.pending()["uncommitted"] == 4  # progress stops at the lost answer
    assert len(ask(chain, "/commitments")["commitments"]) == 6  # yet all three landed
    await committer.step(chain.state.height, epoch_length)  # re-sent: DUPLICATE = committed
    assert committer.pending() == {"uncommitted": 0, "unrevealed": 6}
    chain.advance_to(chain.state.height + 2 * epoch_length)
    await committer.step(chain.state.height, epoch_length)
    assert [c["match"] for c in ask(chain, "/commitments")["commitments"]] == [True] * 6
    assert ask(chain, "/evidence")["evidence"] == []


async def test_agent_resends_a_lost_batch_exactly_even_when_its_session_grew(
    tmp_path: Path,
) -> None:
    chain, key = registered_chain()
    log = ServedLog(tmp_path, shard=0)
    feed(log, tag("a"), [64])  # blocks 0, 1
    link = FlakyLink(chain, key, lose=1)  # the batch lands, its answer is lost
    committer = Committer(tmp_path, link)
    epoch_length = chain.state.genesis.epoch_length
    await committer.step(chain.state.height, epoch_length)
    assert committer.pending()["uncommitted"] == 2
    # the session goes on: blocks 2, 3 follow in the same run of the spool
    log.record(tag("a"), activations(64, 64), np.arange(64, 128), activations(64, 64))
    restarted = Committer(tmp_path, link)  # also across a restart
    await restarted.step(chain.state.height, epoch_length)
    assert restarted.pending() == {"uncommitted": 0, "unrevealed": 4}
    assert len(ask(chain, "/commitments")["commitments"]) == 4  # none marked without landing
    chain.advance_to(chain.state.height + 2 * epoch_length)
    await restarted.step(chain.state.height, epoch_length)
    assert [c["match"] for c in ask(chain, "/commitments")["commitments"]] == [True] * 4


async def test_spot_check_tickets_come_from_the_served_log(aiohttp_client, tmp_path: Path) -> None:
    """With --commit-dir the node's tickets (node.server.tickets) are cut from the served-work
    log: the salt a ticket carries is the one the agent commits and reveals; no second
    recorder runs."""
    from nacl.signing import SigningKey

    from node.server.tickets import ServedLogTickets, StaticPolicy, install
    from protocol.tickets import decode_ticket

    config = ServerConfig(
        manifest_path=Path("unused.json"), shard_id=1, commit_dir=tmp_path / "served"
    )
    app = create_app(config, FakeShard(shard_id=1, hidden_size=H))
    source = install(app, None, SigningKey(b"\x05" * 32), StaticPolicy(set(), [], 1_000_000))
    assert isinstance(source, ServedLogTickets)
    assert app[STATE_KEY].forward_hooks == [app[SERVED_KEY].hook]  # one recorder only
    client = await aiohttp_client(app)
    session = "session-capability-xyz-0003"
    x = activations(0, 64)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, session, 1)
    await link.forward(1, 0, x)
    [_, record] = spool(tmp_path / "served")
    ticket = decode_ticket(source.ticket_bytes(session_tag(session), 1))
    assert ticket.salt == record.salt and ticket.block == 1
    digest = inputs_digests(ticket.inputs)[-1]
    assert served_output_hash(ticket.fingerprint, digest) == record.output_hash
    assert np.array_equal(ticket.inputs, x)
