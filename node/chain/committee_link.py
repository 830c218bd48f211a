"""`CommitteeLink`: a signer's connection to the committee chain through one or more validators.

Used by the node agent and the stake watcher. It keeps the signer's nonce (read from
`/nonce` once, then counted locally; re-read after a BAD_NONCE answer), moves on to the next
validator RPC when one is unreachable, and turns answers into typed values:

    link = CommitteeLink(["http://127.0.0.1:27001", ...], signing_key)
    height = await link.height()
    view = await link.node(key)            # None when not registered
    outcome = await link.submit(body)      # CheckTx passed; outcome.hash
    code = await link.committed_code(outcome.hash, timeout_s=10)
    code, text = await link.send(body)  # submit, wait for the block, re-sign a lost nonce
    hash = await link.broadcast(raw)       # bytes the caller signed (it keeps the nonces)
    found = await link.find_tx(hash)       # None until a block holds it

Two processes signing with one key — a validator's stake watcher and its verifier both sign
with the consensus key — share one nonce sequence through `nonce_file` (in the validator's
home, `signer_nonce_file(home)`): each nonce is taken from it under an exclusive lock held until
the tx is through CheckTx, so the two never sign the same nonce and their txs reach the mempool
in nonce order. Without the file, `send` still recovers a nonce the other process took.

Every failure is a `PlanetError`: `UnavailableError` when no validator answers,
`TxRejectedError` when CheckTx refuses a tx, `RemoteError` for an app error answer.
Callers decide whether to retry (see `node.retry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from nacl.signing import SigningKey

from node.chain.committee_pages import read_nodes
from node.chain.committee_rpc import CommitteeRpc, TxRejectedError, TxResult, tx_hash
from protocol.commit_batch import sign_batch
from protocol.committee.envelope import sign
from protocol.committee.registry import ROLES
from protocol.committee.relays import RELAY_ROLE
from protocol.errors import RemoteError, UnavailableError

log = logging.getLogger(__name__)

BAD_NONCE = 3
NOT_FOUND_QUERY = "query_42"
# CometBFT's answer when the same tx bytes are already in its mempool cache: an earlier try
# (whose answer was lost to a timeout) got through, which is success for the sender.
IN_CACHE = "tx already exists in cache"
SEND_TRIES = 3  # a tx whose nonce another signer took is signed again (send)
LANDED_POLL_S = 0.25  # send: how often it looks for its tx and the signer's committed nonce
LANDED_GRACE_POLLS = 4  # ... and how long the tx index may lag a used nonce (4 × 0.25 s)
NONCE_LOCK_POLL_S = 0.005  # how often a signer retries the shared nonce file's lock


def signer_nonce_file(home: Path) -> Path:
    """The nonce file the processes signing with a validator's consensus key share."""
    return home / "data" / "planet_signer_nonce"


class _SharedNonce:
    """The nonce file, open and locked: the last nonce any process took from it (0 when none
    yet), and `take` to record the next one."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        self.last = int(text) if text.isdigit() else 0

    def take(self, nonce: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(nonce).encode(), 0)
        self.last = nonce


@dataclass(frozen=True)
class Submitted:
    """A tx CheckTx accepted: its hash and the nonce it used."""

    hash: str
    nonce: int


class CommitteeLink:
    """Signed submissions and queries over a list of validator RPC URLs (failover in order)."""

    def __init__(
        self,
        urls: Sequence[str],
        key: SigningKey | None = None,
        *,
        timeout_s: float = 10.0,
        nonce_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("at least one committee RPC URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.key = key
        self.nonce_file = nonce_file
        self.signer = key.verify_key.encode().hex() if key is not None else ""
        self.timeout_s = timeout_s
        self._clients = [CommitteeRpc(u, timeout_s=timeout_s) for u in self.urls]
        self._current = 0
        self._next_nonce: int | None = None
        self._submitting = asyncio.Lock()
        self._clock = clock  # the deadline of `committed` (injectable for tests)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

    async def _each(self, what: str, call: Any) -> Any:
        """Run `call(client)` on the current validator, then the others; the first answer wins.
        Only unreachability moves on: an error answer is returned to the caller."""
        errors = []
        for offset in range(len(self._clients)):
            index = (self._current + offset) % len(self._clients)
            try:
                result = await call(self._clients[index])
            except UnavailableError as error:
                errors.append(error.message)
                continue
            if index != self._current:
                log.info(
                    "committee rpc failover from=%s to=%s",
                    self.urls[self._current],
                    self.urls[index],
                )
                self._current = index
            return result
        raise UnavailableError(
            f"no committee validator answered {what} ({'; '.join(errors)[:400]})",
            hint="is the committee running? check `planet committee status` or --committee-rpc",
        )

    # -- queries -------------------------------------------------------------------------------

    async def query(self, path: str, **params: Any) -> Any:
        full = path + ("?" + urlencode(params) if params else "")
        return await self._each(full, lambda c: c.abci_query(full))

    async def node(self, key: str) -> dict[str, Any] | None:
        """The committee's view of node `key`, or None when it is not registered."""
        try:
            return dict(await self.query("/node", key=key))
        except RemoteError as error:
            if error.code == NOT_FOUND_QUERY:
                return None
            raise

    async def nodes(self, **filters: Any) -> list[dict[str, Any]]:
        """Every `/nodes` entry (each page followed: `read_nodes`; `BadPage` or `TooManyPages`
        when the list is malformed or too long to read) that has the shape the committee app
        writes (others are dropped with a warning: a validator RPC is a peer, not a trusted
        source of well-formed data)."""
        entries = await read_nodes(self.query, **filters)
        valid = [e for e in entries if well_formed_node(e)]
        if len(valid) != len(entries):
            log.warning("dropped %d malformed /nodes entries", len(entries) - len(valid))
        return valid

    async def params(self) -> dict[str, Any]:
        return dict(await self.query("/params"))

    async def height(self) -> int:
        status = await self._each("status", lambda c: c.status())
        return int(status.latest_block_height)

    # -- transactions --------------------------------------------------------------------------

    async def _fetch_nonce(self) -> int:
        answer = await self.query("/nonce", account=self.signer)
        return int(answer["nonce"]) + 1

    async def submit(self, body: Any, *, binary: bool = False) -> Submitted:
        """Sign `body` with the next nonce and pass it through CheckTx (one retry on BAD_NONCE).
        `binary`: a one-session CommitBatch/RevealBatch as a compact binary batch
        (`protocol.commit_batch`) instead of JSON."""
        if self.key is None:
            raise ValueError("this link has no signing key")
        async with self._submitting:  # one nonce per tx, also for concurrent callers
            return await self._submit(body, binary)

    @contextlib.asynccontextmanager
    async def _shared_nonce(self) -> AsyncIterator[_SharedNonce | None]:
        """With a nonce file: hold its lock (polled, so the event loop runs) and yield it open;
        otherwise yield None."""
        if self.nonce_file is None:
            yield None
            return
        self.nonce_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.nonce_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(NONCE_LOCK_POLL_S)
            yield _SharedNonce(fd)
        finally:
            os.close(fd)  # releases the lock

    async def _submit(self, body: Any, binary: bool) -> Submitted:
        async with self._shared_nonce() as shared:
            return await self._submit_locked(body, binary, shared)

    async def _submit_locked(
        self, body: Any, binary: bool, shared: _SharedNonce | None
    ) -> Submitted:
        for attempt in (1, 2):
            if self._next_nonce is None:
                self._next_nonce = await self._fetch_nonce()
            if shared is not None:  # another process may have signed since
                self._next_nonce = max(self._next_nonce, shared.last + 1)
                shared.take(self._next_nonce)
            nonce = self._next_nonce
            if binary:
                raw = sign_batch(body, self.key, nonce).raw
            else:
                raw = sign(body, self.key, nonce).encode()
            try:
                result = await self._each(
                    f"broadcast {body.TYPE}", lambda c, raw=raw: c.broadcast_tx_sync(raw)
                )
            except TxRejectedError as error:
                if error.tx_code == BAD_NONCE and attempt == 1:
                    self._next_nonce = None
                    continue
                raise
            except RemoteError as error:
                if IN_CACHE not in error.message:
                    raise
                log.info("tx %s was already in the mempool (an earlier try landed)", body.TYPE)
                self._next_nonce = nonce + 1
                return Submitted(hash=tx_hash(raw), nonce=nonce)
            except UnavailableError:
                self._next_nonce = None  # it may or may not have landed: read it again
                raise
            self._next_nonce = nonce + 1
            return Submitted(hash=result.hash, nonce=nonce)
        raise AssertionError("unreachable")

    async def broadcast(self, raw: bytes) -> str:
        """Pass already signed tx bytes through CheckTx (the caller keeps its own nonces);
        returns the tx hash. The same bytes already in the mempool count as accepted."""
        try:
            result = await self._each("broadcast", lambda c: c.broadcast_tx_sync(raw))
        except RemoteError as error:
            if isinstance(error, TxRejectedError) or IN_CACHE not in error.message:
                raise
            return tx_hash(raw)
        return result.hash

    async def find_tx(self, hash_hex: str) -> TxResult | None:
        """The committed result of a tx, or None when no block holds it (yet)."""
        return await self._each(f"tx {hash_hex[:12]}", lambda c: c.tx(hash_hex))

    async def committed_nonce(self) -> int:
        """The signer's last committed nonce (0 before its first tx)."""
        return int((await self.query("/nonce", account=self.signer))["nonce"])

    async def committed(self, tx_hash: str, *, timeout_s: float = 15.0) -> TxResult:
        """The FinalizeBlock result of a submitted tx once it is in a block (with its height),
        within `timeout_s` in all. The validator that answers waits for it; one tried after
        an unreachable or timed-out one waits only what is left, and once the time is spent
        the others are each asked once whether their index holds it. (Each waiting the whole
        `timeout_s` made a tx that never lands — dropped from the mempool when another signer
        took its nonce — cost `timeout_s` × the number of validators before the caller could
        sign it again.)"""
        deadline = self._clock() + timeout_s

        async def wait(client: CommitteeRpc) -> TxResult:
            left = deadline - self._clock()
            if left > 0:
                return await client.wait_for_tx(tx_hash, timeout_s=left)
            found = await client.tx(tx_hash)
            if found is None:
                raise UnavailableError(
                    f"{client.url}: tx {tx_hash[:16]} not committed within {timeout_s:g} s",
                    hint="the chain may be halted or the tx dropped: check `planet committee "
                    "status`",
                )
            return found

        return await self._each(f"tx {tx_hash[:12]}", wait)

    async def committed_code(self, tx_hash: str, *, timeout_s: float = 15.0) -> tuple[int, str]:
        """(FinalizeBlock code, log) of a submitted tx once it is in a block (`committed`)."""
        result = await self.committed(tx_hash, timeout_s=timeout_s)
        return result.code, result.log

    async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]:
        """Submit `body` and wait for its block: (FinalizeBlock code, log).

        Another process signing with the same key — a validator's stake watcher and its
        verifier both sign with the consensus key — can take this tx's nonce: the tx is then
        refused in its block with BAD_NONCE, or dropped from the mempool on recheck and never
        committed. Either way it changed nothing, so it is signed again with a nonce read
        afresh (at most SEND_TRIES times). `UnavailableError` when it is not committed and its
        nonce not used within `timeout_s`."""
        for _ in range(SEND_TRIES):
            sent = await self.submit(body)
            landed = await self._landed(sent, timeout_s)
            if landed is not None and landed.code != BAD_NONCE:
                return landed.code, landed.log
            log.info("tx %s lost nonce %d to another signer: signed again", body.TYPE, sent.nonce)
            async with self._submitting:
                if self._next_nonce is not None and self._next_nonce <= sent.nonce + 1:
                    self._next_nonce = None
        return BAD_NONCE, f"{body.TYPE}: nonce taken by another signer {SEND_TRIES} times"

    async def _landed(self, sent: Submitted, timeout_s: float) -> TxResult | None:
        """The block result of `sent`, or None once its nonce is used by another tx."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            found = await self.find_tx(sent.hash)
            if found is not None:
                return found
            if await self.committed_nonce() >= sent.nonce:
                # used: by this tx (the tx index can lag the state a moment) or another one
                for _ in range(LANDED_GRACE_POLLS):
                    await asyncio.sleep(LANDED_POLL_S)
                    found = await self.find_tx(sent.hash)
                    if found is not None:
                        return found
                return None
            if loop.time() >= deadline:
                raise UnavailableError(
                    f"tx {sent.hash[:16]} not committed within {timeout_s:g} s",
                    hint="the chain may be halted: check `planet committee status`",
                )
            await asyncio.sleep(LANDED_POLL_S)


_KEY = re.compile(r"[0-9a-f]{64}\Z")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}\Z")
STATUSES = ("JOIN", "SERVING", "DOWN", "LEFT")


def well_formed_node(entry: Any) -> bool:
    """A node view with a hex key, an EVM address, a known status and role."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("key"), str)
        and bool(_KEY.match(entry["key"]))
        and isinstance(entry.get("evm_address"), str)
        and bool(_ADDRESS.match(entry["evm_address"]))
        and entry.get("status") in STATUSES
        and (entry.get("role") in ROLES or entry.get("role") == RELAY_ROLE)
    )


def describe(view: dict[str, Any] | None) -> str:
    """One line for logs: status, stake and routability of a node view."""
    if view is None:
        return "not registered"
    return json.dumps(
        {k: view.get(k) for k in ("status", "stake", "reputation", "routable")}, sort_keys=True
    )
