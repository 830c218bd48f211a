"""An in-process committee chain for tests and benchmarks (no sockets, no CometBFT).

`Chain` owns a `StateMachine` (and its `State`) over a SQLite store, deterministic ed25519
validator keys and secp256k1 operator keys, and runs blocks the way CometBFT drives the app:
PrepareProposal → ProcessProposal → FinalizeBlock → Commit. Keys come from fixed seeds so every
run (and every test) sees the same addresses and hashes. `ReportingLink` is a gateway's
`CommitteeLink` (broadcast, find by hash, committed nonce) over such a chain, with a mempool.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from abci_app import extensions
from abci_app.codes import Code
from abci_app.machine import StateMachine, TxResult
from abci_app.queries import query
from abci_app.state import State, validator_address
from abci_app.store import Store
from node.chain.committee_rpc import TxRejectedError, tx_hash
from node.chain.committee_rpc import TxResult as CommittedTx
from protocol.commit_batch import sign_batch
from protocol.committee.envelope import SignedTx, sign
from protocol.eip712 import address_of
from protocol.errors import RemoteError, UnavailableError

CHAIN_ID = "planet-test"
COMMITTEE_ADDRESS = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
FRAUD_PROOFS_ADDRESS = "0xa16E02E87b7454126E5E10d957A927A7F5B5d2be"
EVM_CHAIN_ID = 31337


class ProposalRejected(Exception):
    """ProcessProposal refused a block the harness proposed (a bug in the app or the test)."""


def seeded_key(label: str) -> SigningKey:
    """A deterministic ed25519 key from a label."""
    return SigningKey(hashlib.sha256(b"planet-test-key/" + label.encode()).digest())


def seeded_evm_key(label: str) -> bytes:
    """A deterministic secp256k1 private key (32 bytes) from a label."""
    return hashlib.sha256(b"planet-test-evm/" + label.encode()).digest()


@dataclass
class Validator:
    key: SigningKey
    operator_key: bytes
    power: int

    @property
    def pubkey(self) -> bytes:
        return self.key.verify_key.encode()

    @property
    def address(self) -> str:
        return validator_address(self.pubkey)

    @property
    def operator(self) -> str:
        return address_of(self.operator_key)


def seeded_validators(powers: tuple[int, ...]) -> list[Validator]:
    """The deterministic validator set `Chain` uses (also for tests that drive a real app)."""
    return [
        Validator(seeded_key(f"validator-{i}"), seeded_evm_key(f"operator-{i}"), power)
        for i, power in enumerate(powers)
    ]


@dataclass
class Chain:
    """A committee chain in one process; `db` is a path or ":memory:"."""

    db: str | Path = ":memory:"
    powers: tuple[int, ...] = (10, 10, 10, 10)
    genesis: dict[str, Any] = field(default_factory=dict)
    ve_enable_height: int = 1
    validators: list[Validator] = field(init=False)
    machine: StateMachine = field(init=False)
    state: State = field(init=False)
    nonces: dict[str, int] = field(init=False, default_factory=dict)
    time_s: int = 0  # header time of the next blocks (unix seconds; tests move it)

    def __post_init__(self) -> None:
        self.validators = seeded_validators(self.powers)
        self.machine = StateMachine(State(Store(self.db)))
        self.state = self.machine.state
        if self.state.height == 0 and not self.state.chain_id:
            app_state = {
                "epoch_length": 5,
                "heartbeat_timeout": 4,
                "evm": {
                    "chain_id": EVM_CHAIN_ID,
                    "committee_address": COMMITTEE_ADDRESS,
                    "fraud_proofs_address": FRAUD_PROOFS_ADDRESS,
                },
                "validators": {v.address: v.operator for v in self.validators},
                **self.genesis,
            }
            self.machine.init_chain(
                CHAIN_ID,
                [(v.pubkey, v.power) for v in self.validators],
                json.dumps(app_state).encode(),
                self.ve_enable_height,
            )

    def reopen(self) -> Chain:
        """A new `Chain` over the same database file (simulates a restarted app)."""
        self.state.store.close()
        return Chain(db=self.db, powers=self.powers, genesis=self.genesis)

    def tx(self, body: Any, key: SigningKey, nonce: int | None = None) -> bytes:
        """Sign `body` with `key`, using the next nonce for that key unless given."""
        signer = key.verify_key.encode().hex()
        if nonce is None:
            nonce = self.nonces.get(signer, 0) + 1
        self.nonces[signer] = max(nonce, self.nonces.get(signer, 0))
        signed: SignedTx = sign(body, key, nonce)
        return signed.encode()

    def batch_tx(self, body: Any, key: SigningKey, nonce: int | None = None) -> bytes:
        """`body` (a one-session CommitBatch or RevealBatch) as a compact binary batch
        (`protocol.commit_batch`), signed with the next nonce for `key` unless given."""
        signer = key.verify_key.encode().hex()
        if nonce is None:
            nonce = self.nonces.get(signer, 0) + 1
        self.nonces[signer] = max(nonce, self.nonces.get(signer, 0))
        return sign_batch(body, key, nonce).raw

    def extended_commit(
        self,
        height: int,
        scores: dict[int, dict[str, int]] | None = None,
        invalid: dict[int, tuple[str, ...]] | None = None,
        speeds: dict[int, dict[str, int]] | None = None,
    ) -> bytes:
        """The extended-commit tx a proposer injects at `height + 1`, every validator signing
        `scores[validator index]`, `invalid[validator index]` and `speeds[validator index]`
        (empty report when absent)."""
        epoch_length = self.state.genesis.epoch_length
        votes = []
        for index, validator in enumerate(self.validators):
            extension = b""
            if height % epoch_length == 0:
                extension = extensions.encode_extension(
                    height // epoch_length,
                    (scores or {}).get(index, {}),
                    (invalid or {}).get(index, ()),
                    (speeds or {}).get(index),
                )
            sign_bytes = extensions.vote_extension_sign_bytes(CHAIN_ID, height, 0, extension)
            votes.append(
                extensions.ExtVote(
                    address=validator.address,
                    power=validator.power,
                    extension=extension,
                    signature=validator.key.sign(sign_bytes).signature,
                    flag=extensions.BLOCK_ID_FLAG_COMMIT,
                )
            )
        votes.sort(key=lambda v: v.address)
        return extensions.ExtendedCommit(height=height, round=0, votes=tuple(votes)).encode()

    def block(
        self,
        txs: list[bytes] | None = None,
        scores: dict[int, dict[str, int]] | None = None,
        block_hash: bytes | None = None,
        invalid: dict[int, tuple[str, ...]] | None = None,
        speeds: dict[int, dict[str, int]] | None = None,
    ) -> list[TxResult]:
        """Propose, validate, finalize and commit the next block; returns the tx results."""
        machine = self.machine
        height = self.state.height + 1
        vx = None
        if machine.vx_required(height):
            vx = self.extended_commit(height - 1, scores, invalid, speeds)
        proposal = machine.prepare_proposal(height, list(txs or []), 1 << 22, vx)
        ok, reason = machine.process_proposal(height, proposal)
        if not ok:
            raise ProposalRejected(f"proposal rejected at height {height}: {reason}")
        digest = block_hash or hashlib.sha256(b"block/%d" % height).digest()
        machine.begin_block(height, digest, self.time_s)
        results = [machine.deliver_tx(raw, i) for i, raw in enumerate(proposal)]
        machine.end_block()
        machine.commit()
        if vx is not None:
            results = results[1:]
        return results

    def advance_to(self, height: int) -> None:
        while self.state.height < height:
            self.block()


@dataclass
class ReportingLink:
    """`CommitteeLink`'s reporting calls over an in-process `Chain`: CheckTx on broadcast, a
    mempool that the next `committed` wait turns into a block, the tx index by hash. `down`
    makes every call unreachable; `full` answers broadcasts with CometBFT's mempool error;
    `lose` drops broadcasts on the floor (accepted, never in a block)."""

    chain: Chain
    key: SigningKey
    mempool: list[bytes] = field(default_factory=list)
    index: dict[str, CommittedTx] = field(default_factory=dict)
    broadcasts: list[str] = field(default_factory=list)
    mined: list[bytes] = field(default_factory=list)
    down: bool = False
    full: bool = False
    lose: bool = False

    @property
    def signer(self) -> str:
        return self.key.verify_key.encode().hex()

    def _reachable(self) -> None:
        if self.down:
            raise UnavailableError("committee rpc down (test)")

    async def broadcast(self, raw: bytes) -> str:
        self._reachable()
        self.broadcasts.append(tx_hash(raw))
        if self.full:
            raise RemoteError("rpc", "rpc_-32603", "mempool is full: number of txs 5000")
        checked = self.chain.machine.check_tx(raw)
        if checked.code != Code.OK:
            raise TxRejectedError("rpc", code=int(checked.code), log_text=checked.log)
        if not self.lose and raw not in self.mempool:
            self.mempool.append(raw)
        return tx_hash(raw)

    async def find_tx(self, hash_hex: str) -> CommittedTx | None:
        self._reachable()
        return self.index.get(hash_hex)

    async def committed_nonce(self) -> int:
        self._reachable()
        return self.chain.state.committed("acct", self.signer) or 0

    def mine(self, extra: list[bytes] | None = None) -> None:
        """One block of the mempool (and `extra`), indexed by hash."""
        txs, self.mempool = [*self.mempool, *(extra or [])], []
        self.mined.extend(txs)
        height = self.chain.state.height + 1
        for index, (raw, result) in enumerate(zip(txs, self.chain.block(txs), strict=True)):
            events = [
                {"type": kind, "attributes": [{"key": k, "value": v} for k, v in attrs]}
                for kind, attrs in result.events
            ]
            self.index[tx_hash(raw)] = CommittedTx(
                tx_hash(raw), height, index, int(result.code), result.log, events
            )

    async def committed(self, hash_hex: str, *, timeout_s: float = 15.0) -> CommittedTx:
        self._reachable()
        if any(tx_hash(raw) == hash_hex for raw in self.mempool):
            self.mine()
        found = self.index.get(hash_hex)
        if found is None:
            raise UnavailableError(f"tx {hash_hex[:16]} not committed within {timeout_s:g} s")
        return found

    async def query(self, path: str, **params: Any) -> Any:
        full = path + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
        code, value, log = query(self.chain.state, full, b"")
        assert code == Code.OK, log
        return json.loads(value)
