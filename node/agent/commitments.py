"""The agent's half of commit-reveal: commit what the compute node served, reveal after the epoch.

The compute node (`node.server.served`) appends one `protocol.served.ServedRecord` per block
of 32 positions it served to spool files in its commit directory. Each `step()` the agent

1. reads new whole records from the spool files (in file-name order, then record order);
2. commits them: records grouped by session, compact binary `commit` batches of at most
   `max_batch` (`protocol.commit_batch`), up to `PIPELINE` in flight, and waits for them to be
   in blocks (their heights);
3. reveals every committed record whose commitment's epoch has closed (current height past
   the end of that epoch), in binary `reveal` batches, and no later than
   `retention_epochs` epochs after it (the chain prunes the commitment then: such records are
   dropped, counted in `expired`).

Progress is kept per spool file in `<commit dir>/agent-state.json` (`committed`, `revealed`
record counts), so a restarted agent neither commits twice nor forgets salts; records that
were committed before a restart are revealed as if committed at the restart height (later,
never earlier). A fully revealed spool file that the node has rotated away from (it reached
`SPOOL_FILE_BYTES`) is deleted.

Chain answers: DUPLICATE_COMMITMENT means an earlier try landed (counted as committed);
ALREADY_REVEALED likewise for reveals; UNKNOWN_COMMITMENT (pruned, or never landed) drops the
batch's records from the reveal queue (logged). Any other refusal leaves the records queued for
the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from node.chain.committee_rpc import TxRejectedError
from protocol import served as spool_format
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.served import (
    RECORD_BYTES,
    SPOOL_MAGIC,
    SPOOL_PREFIX,
    SPOOL_SUFFIX,
    ServedRecord,
    SpoolError,
    check_magic,
    decode_records,
)

log = logging.getLogger(__name__)

STATE_FILE = "agent-state.json"
OK, DUPLICATE_COMMITMENT, UNKNOWN_COMMITMENT, ALREADY_REVEALED = 0, 16, 17, 18
MAX_COMMIT_BATCH = 1024
MAX_REVEAL_BATCH = 800
PIPELINE = 16  # commit batches in flight before waiting for their blocks


class Link(Protocol):
    async def submit(self, body: Any, *, binary: bool = False) -> Any: ...
    async def committed(self, tx_hash: str, *, timeout_s: float = ...) -> Any: ...


@dataclass
class _File:
    path: Path
    records: list[ServedRecord] = field(default_factory=list)
    committed: int = 0
    revealed: int = 0
    heights: list[int] = field(default_factory=list)  # commit height per committed record
    # sizes of the batches sent but not yet seen in a block, from `committed` / `revealed` on:
    # re-sent exactly as they were, so a DUPLICATE/ALREADY_REVEALED answer (the whole tx is
    # refused when any record repeats) means every record of it is on chain, never a new one
    commit_inflight: list[int] = field(default_factory=list)
    reveal_inflight: list[int] = field(default_factory=list)


class Committer:
    """Commits and reveals a node's served records from its spool directory."""

    def __init__(
        self,
        spool_dir: Path,
        link: Link,
        *,
        max_batch: int = MAX_COMMIT_BATCH,
        commit_timeout_s: float = 15.0,
    ) -> None:
        self.dir = Path(spool_dir)
        self.link = link
        self.max_batch = min(max_batch, MAX_COMMIT_BATCH)
        self.commit_timeout_s = commit_timeout_s
        self._files: dict[str, _File] = {}
        self._loaded = False
        self.counters = {"committed": 0, "revealed": 0, "commit_txs": 0, "reveal_txs": 0}
        self.counters.update({"expired": 0, "dropped": 0, "bad_files": 0})

    # -- spool ---------------------------------------------------------------------------------

    def _load_state(self, height: int) -> None:
        path = self.dir / STATE_FILE
        try:
            saved = json.loads(path.read_text())
        except FileNotFoundError:
            saved = {}
        except (OSError, ValueError) as error:
            log.warning("ignoring unreadable %s: %s", path, error)
            saved = {}
        entries = saved.get("files", {}) if isinstance(saved, dict) else {}
        for name, entry in entries.items() if isinstance(entries, dict) else ():
            if not (isinstance(name, str) and isinstance(entry, dict)):
                continue
            committed, revealed = entry.get("committed"), entry.get("revealed")
            if type(committed) is int and type(revealed) is int and 0 <= revealed <= committed:
                tracked = _File(self.dir / name, committed=committed, revealed=revealed)
                tracked.heights = [height] * committed  # conservative: as if committed now
                tracked.commit_inflight = _sizes(entry.get("commit_inflight"))
                tracked.reveal_inflight = _sizes(entry.get("reveal_inflight"))
                self._files[name] = tracked
        self._loaded = True

    def _save_state(self) -> None:
        state = {
            "files": {
                name: {
                    "committed": f.committed,
                    "revealed": f.revealed,
                    "commit_inflight": f.commit_inflight,
                    "reveal_inflight": f.reveal_inflight,
                }
                for name, f in sorted(self._files.items())
            }
        }
        temporary = self.dir / (STATE_FILE + ".tmp")
        temporary.write_text(json.dumps(state, sort_keys=True) + "\n")
        os.replace(temporary, self.dir / STATE_FILE)

    def read_spool(self) -> int:
        """Take in new whole records; returns how many arrived."""
        arrived = 0
        if not self.dir.is_dir():
            return 0
        for path in sorted(self.dir.glob(f"{SPOOL_PREFIX}*{SPOOL_SUFFIX}")):
            tracked = self._files.setdefault(path.name, _File(path))
            try:
                with path.open("rb") as handle:
                    check_magic(handle.read(len(SPOOL_MAGIC)), path.name)
                    handle.seek(len(SPOOL_MAGIC) + len(tracked.records) * RECORD_BYTES)
                    fresh = decode_records(handle.read())
            except SpoolError as error:
                self.counters["bad_files"] += 1
                log.warning("skipping spool file: %s", error.message)
                del self._files[path.name]
                continue
            except OSError as error:
                log.warning("cannot read spool file %s: %s", path, error)
                continue
            tracked.records.extend(fresh)
            arrived += len(fresh)
        for name in [n for n, f in self._files.items() if not f.path.exists()]:
            del self._files[name]
        return arrived

    # -- commit and reveal ---------------------------------------------------------------------

    async def step(self, height: int, epoch_length: int, retention_epochs: int = 10) -> None:
        """One round: read the spool, commit what is new, reveal what is due."""
        try:
            if not self._loaded:
                self._load_state(height)
            self.read_spool()
            await self._commit_new()
            await self._reveal_due(height, epoch_length, retention_epochs)
            self._delete_finished()
        except OSError as error:  # a full disk or a removed directory: never fatal
            log.warning("commit-reveal step: %s", error)

    async def _commit_new(self) -> None:
        """Pipelined: up to `PIPELINE` batches of a file go out (consecutive nonces) before
        waiting for their blocks; progress stops at the first batch not committed (a later one
        that did land answers DUPLICATE_COMMITMENT when re-sent, which counts as committed)."""
        for tracked in list(self._files.values()):
            while tracked.committed < len(tracked.records):
                chunks: list[list[ServedRecord]] = []
                position = tracked.committed
                for size in tracked.commit_inflight:  # re-send unconfirmed batches as they were
                    if position + size > len(tracked.records):
                        break  # not this spool's batches (a replaced file): forget them
                    chunks.append(tracked.records[position : position + size])
                    position += size
                while position < len(tracked.records) and len(chunks) < PIPELINE:
                    chunk = _one_session(tracked.records, position, self.max_batch)
                    chunks.append(chunk)
                    position += len(chunk)
                tracked.commit_inflight = [len(chunk) for chunk in chunks]
                self._save_state()  # before sending: a restart re-sends the same batches
                bodies = [_commit_body(chunk) for chunk in chunks]
                heights = await self._send_many(bodies, (OK, DUPLICATE_COMMITMENT))
                confirmed = 0
                for chunk, height in zip(chunks, heights, strict=False):
                    if height is None:
                        break
                    confirmed += 1
                    tracked.committed += len(chunk)
                    tracked.heights.extend([height] * len(chunk))
                    self.counters["committed"] += len(chunk)
                    self.counters["commit_txs"] += 1
                # still unconfirmed: the batches that went out (a CheckTx refusal ends the list)
                tracked.commit_inflight = tracked.commit_inflight[confirmed : len(heights)]
                self._save_state()
                if confirmed < len(chunks):
                    return  # refused or unanswered: try again next step

    async def _send_many(self, bodies: list[Any], accept: tuple[int, ...]) -> list[int | None]:
        """Submit `bodies` in order (stopping at the first CheckTx refusal), then wait for all:
        per submitted body its block height when accepted, else None."""
        hashes: list[str] = []
        for body in bodies:
            try:
                hashes.append((await self.link.submit(body, binary=True)).hash)
            except TxRejectedError as error:
                log.warning(
                    "%s refused code=%d log=%s; retrying later",
                    body.TYPE,
                    error.tx_code,
                    error.log_text[:200],
                )
                break
        results = await asyncio.gather(
            *(self.link.committed(h, timeout_s=self.commit_timeout_s) for h in hashes),
            return_exceptions=True,
        )
        heights: list[int | None] = []
        for body, result in zip(bodies, results, strict=False):
            if isinstance(result, BaseException):
                log.warning("%s not seen committed: %s; retrying later", body.TYPE, result)
                heights.append(None)
            elif result.code in accept:
                heights.append(result.height)
            else:
                log.warning(
                    "%s refused code=%d log=%s; retrying later",
                    body.TYPE,
                    result.code,
                    result.log[:200],
                )
                heights.append(None)
        return heights

    async def _reveal_due(self, height: int, epoch_length: int, retention_epochs: int) -> None:
        for tracked in list(self._files.values()):
            while tracked.revealed < tracked.committed:
                first = tracked.revealed
                commit_epoch = _epoch(tracked.heights[first], epoch_length)
                if height <= commit_epoch * epoch_length:
                    break  # that epoch has not closed yet
                if _epoch(height, epoch_length) > commit_epoch + retention_epochs:
                    tracked.revealed += 1  # the chain has pruned it: too late
                    self.counters["expired"] += 1
                    continue
                if tracked.reveal_inflight and first + tracked.reveal_inflight[0] <= (
                    tracked.committed
                ):  # re-send an unconfirmed batch as it was
                    chunk = tracked.records[first : first + tracked.reveal_inflight[0]]
                else:
                    chunk = _one_session(
                        tracked.records, first, MAX_REVEAL_BATCH, tracked.committed
                    )
                    chunk = [
                        r
                        for offset, r in enumerate(chunk)
                        if _epoch(tracked.heights[first + offset], epoch_length) == commit_epoch
                    ]
                    tracked.reveal_inflight = [len(chunk)]
                    self._save_state()
                body = RevealBatch(
                    tuple(
                        RevealRecord(
                            r.session_hex,
                            r.step,
                            r.shard,
                            "0x" + r.output_hash.hex(),
                            "0x" + r.salt.hex(),
                        )
                        for r in chunk
                    )
                )
                done = await self._send(body, (OK, ALREADY_REVEALED), drop=(UNKNOWN_COMMITMENT,))
                if done is None:
                    return
                tracked.reveal_inflight = []
                if done < 0:
                    self.counters["dropped"] += len(chunk)
                else:
                    self.counters["revealed"] += len(chunk)
                    self.counters["reveal_txs"] += 1
                tracked.revealed += len(chunk)
                self._save_state()

    async def _send(
        self, body: Any, accept: tuple[int, ...], drop: tuple[int, ...] = ()
    ) -> int | None:
        """Submit and wait: the block height when accepted, -1 when the chain says drop it,
        None when refused for now."""
        try:
            submitted = await self.link.submit(body, binary=True)
            result = await self.link.committed(submitted.hash, timeout_s=self.commit_timeout_s)
            code, text, height = result.code, result.log, result.height
        except TxRejectedError as error:
            code, text, height = error.tx_code, error.log_text, 0
        if code in accept:
            return height
        if code in drop:
            log.warning("%s dropped by the chain code=%d log=%s", body.TYPE, code, text[:200])
            return -1
        log.warning("%s refused code=%d log=%s; retrying later", body.TYPE, code, text[:200])
        return None

    def _delete_finished(self) -> None:
        for name, tracked in list(self._files.items()):
            done = tracked.revealed == len(tracked.records) == tracked.committed
            try:
                rotated = tracked.path.stat().st_size >= spool_format.SPOOL_FILE_BYTES
            except OSError:
                continue
            if done and rotated:
                tracked.path.unlink(missing_ok=True)
                del self._files[name]
                self._save_state()

    def pending(self) -> dict[str, int]:
        """Records not yet committed, and committed but not yet revealed."""
        return {
            "uncommitted": sum(len(f.records) - f.committed for f in self._files.values()),
            "unrevealed": sum(f.committed - f.revealed for f in self._files.values()),
        }


def _sizes(value: Any) -> list[int]:
    """In-flight batch sizes from the state file (anything odd: none)."""
    if isinstance(value, list) and all(type(v) is int and 0 < v <= MAX_COMMIT_BATCH for v in value):
        return list(value)
    return []


def _commit_body(chunk: list[ServedRecord]) -> CommitBatch:
    return CommitBatch(
        tuple(
            CommitmentRecord(r.session_hex, r.step, r.shard, "0x" + r.commitment().hex())
            for r in chunk
        )
    )


def _epoch(height: int, epoch_length: int) -> int:
    """The epoch a block height belongs to (docs/committee.md: heights (e−1)·L+1 … e·L)."""
    return max(1, (height - 1) // epoch_length + 1)


def _one_session(
    records: list[ServedRecord], start: int, limit: int, end: int | None = None
) -> list[ServedRecord]:
    """The run of records from `start` that share its session (at most `limit`, before `end`)."""
    stop = len(records) if end is None else end
    session = records[start].session
    out = []
    for record in records[start:stop]:
        if record.session != session or len(out) == limit:
            break
        out.append(record)
    return out
