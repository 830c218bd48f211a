"""The committee chain's deterministic state machine over a `State` (no I/O besides its store).

What CometBFT asks of the app, without protobuf (`app.py` adapts the messages):

    init_chain        install genesis, open epoch 1; returns app_hash(0)
    check_tx          mempool admission: decode, ed25519 (and EIP-191 for registrations)
                      signatures, nonce against committed state only; a mint whose payer
                      already holds its bound of unfunded mints (credits.admit_mint); a
                      credit lock of a credit locked by another node or spent
                      (credit_locks.admit_lock); a commit by a registered compute node
                      outside the staked pools (commitments.admit_commit: NOT_STAKED)
    prepare_proposal  the extended-commit tx first when due, then txs up to the byte and work
                      budgets (`MAX_PROPOSAL_WORK`)
    process_proposal  only well-formed, correctly signed txs, the extended-commit tx exactly
                      where required
    begin_block → deliver_tx … → end_block (height-driven rules; returns the app hash and
                      leaves the block's validator updates in `state.validator_updates`) → commit

`deliver_tx` decodes, checks the nonce, runs the tx's rule (`dispatch.HANDLERS`) and keeps its
writes only when it succeeds (every rule is atomic); the nonce is consumed as soon as signature
and nonce are valid. Decoded, verified txs are cached by their bytes so ProcessProposal and
FinalizeBlock do not verify twice.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from abci_app import (
    commitments,
    coverage,
    credit_dkg,
    credit_locks,
    credits,
    epochs,
    extensions,
    mint_partials,
    numerics,
    registry,
    retention,
    schema,
    settlement,
    speeds,
    validator_set,
    verdicts,
)
from abci_app.codes import Code, Rejected
from abci_app.dispatch import HANDLERS
from abci_app.encoding import proto_tx_size
from abci_app.state import Event, State
from protocol.commit_batch import decode_tx, is_batch
from protocol.committee.commitments import CommitBatch
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditMint
from protocol.committee.envelope import SignedTx, TxSignatureError
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import RegisterNode, recover_registration
from protocol.committee.relays import RegisterRelay
from protocol.committee.settlement import WorkReport
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

# The parsed-tx cache is bounded in bytes: each entry is accounted as 5x its raw size + 1 KiB,
# an upper bound of raw bytes + parsed objects (tracemalloc: a 62 715-byte commit batch parses
# into 137 KiB of Python objects, a 253-byte heartbeat into 1.5 KiB).
TX_CACHE_BYTES = 64 * 1024 * 1024

# The most work one block may carry, counted as 1 per tx + 1 per commit/reveal record
# (`tx_work`): PrepareProposal stops filling there and ProcessProposal rejects a block above it.
# It keeps blocks short under overload (without it a proposer took 22 MB of binary batches from
# the mempool at once: 3.4 s blocks; FinalizeBlock costs ~15-25 µs per record per validator
# here) and bounds the state one block can add: binary batches carry a record in 44 bytes that
# becomes ≤ ~900 bytes of state (docs/committee.md "What state costs").
MAX_PROPOSAL_WORK = 12_288


def tx_cache_cost(raw: bytes) -> int:
    if is_batch(raw):
        # binary batches are denser: a 45 199-byte commit batch of 1 024 records parses into
        # 216 KiB of objects (4.9x, tracemalloc), plus the raw bytes themselves
        return 8 * len(raw) + 1024
    return 5 * len(raw) + 1024


def tx_work(tx: Any) -> int:
    """The proposal budget a decoded tx uses: 1 + its commit/reveal records (or report items:
    each is judged and written on its own)."""
    body = tx.body
    if isinstance(body, WorkReport):
        return 1 + body.items
    records = (
        getattr(body, "commitments", None)
        or getattr(body, "reveals", None)
        or getattr(body, "locks", None)  # credit_lock: one entry written per credit
        or ()
    )
    return 1 + len(records)


@dataclass(frozen=True, slots=True)
class TxResult:
    code: Code
    log: str = ""
    events: tuple[Event, ...] = ()
    data: bytes = b""


class RegistrationSignatureError(ProtocolError):
    """The EIP-191 signature of a registration does not recover to its EVM address."""

    code = "bad_evm_signature"


class StateMachine:
    """The committee state machine over a `State`."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._cache: OrderedDict[bytes, tuple[SignedTx, int]] = OrderedDict()
        self._cache_bytes = 0

    # --- genesis ------------------------------------------------------------------------------

    def init_chain(
        self,
        chain_id: str,
        validators: list[tuple[bytes, int]],
        app_state: bytes,
        ve_enable_height: int,
    ) -> bytes:
        """Install genesis; returns app_hash(0). The writes persist with the first Commit."""
        state = self.state
        state.install_genesis(chain_id, validators, app_state, ve_enable_height)
        epochs.open_first_epoch(state)
        app_hash = state.seal_genesis()
        log.info(
            "init_chain chain_id=%s validators=%d app_hash=%s",
            chain_id,
            len(state.validators),
            app_hash.hex(),
        )
        return app_hash

    # --- stateless checks (CheckTx, proposals) ------------------------------------------------

    def decode_verified(self, raw: bytes) -> SignedTx:
        """Decode and check signatures (cached by bytes); raises ProtocolError subclasses."""
        cached = self._cache.get(raw)
        if cached is not None:
            self._cache.move_to_end(raw)
            return cached[0]
        tx = decode_tx(raw)  # a JSON tx or a binary commit/reveal batch
        tx.verify()
        if isinstance(tx.body, RegisterNode | RegisterRelay):
            try:
                signer = recover_registration(tx.signer, tx.body.evm_signature)
            except ProtocolError as error:
                raise RegistrationSignatureError(str(error)) from None
            if signer.lower() != tx.body.evm_address.lower():
                raise RegistrationSignatureError(f"recovered {signer}, not {tx.body.evm_address}")
        self._cache_put(raw, tx)
        return tx

    def _cache_put(self, raw: bytes, tx: SignedTx) -> None:
        """Keep a verified tx, evicting the least recently used beyond `TX_CACHE_BYTES`."""
        cost = tx_cache_cost(raw)
        if cost > TX_CACHE_BYTES:
            return
        self._cache[raw] = (tx, cost)
        self._cache_bytes += cost
        while self._cache_bytes > TX_CACHE_BYTES:
            _, (_, dropped) = self._cache.popitem(last=False)
            self._cache_bytes -= dropped

    def _cache_drop(self, raw: bytes) -> None:
        entry = self._cache.pop(raw, None)
        if entry is not None:
            self._cache_bytes -= entry[1]

    @property
    def tx_cache_bytes(self) -> int:
        """Accounted bytes of the parsed-tx cache (≤ `TX_CACHE_BYTES`)."""
        return self._cache_bytes

    def check_tx(self, raw: bytes) -> TxResult:
        """Mempool admission: format, signatures, nonce vs committed state."""
        if extensions.is_vx_tx(raw):
            return TxResult(
                Code.RESERVED_TX, "the extended-commit tx is injected by proposers only"
            )
        try:
            tx = self.decode_verified(raw)
        except ProtocolError as error:
            return TxResult(_code_of(error), error.message)
        last = self.state.committed(schema.NONCE, tx.signer) or 0
        if tx.nonce <= last:
            return TxResult(Code.BAD_NONCE, f"nonce {tx.nonce} ≤ last committed nonce {last}")
        if isinstance(tx.body, CreditMint):
            refused = credits.admit_mint(self.state, tx.body)
            if refused is not None:
                return TxResult(Code.MINT_PENDING_LIMIT, refused)
        if isinstance(tx.body, CreditLock):
            lock_refused = credit_locks.admit_lock(self.state, tx.signer, tx.body)
            if lock_refused is not None:
                return TxResult(*lock_refused)
        if isinstance(tx.body, CommitBatch):
            unstaked = commitments.admit_commit(self.state, tx.signer)
            if unstaked is not None:
                return TxResult(Code.NOT_STAKED, unstaked)
        return TxResult(Code.OK)

    # --- proposals ----------------------------------------------------------------------------

    def vx_required(self, height: int) -> bool:
        """Whether block `height` must start with the extended-commit tx: the previous height
        closed an epoch and had vote extensions enabled."""
        state = self.state
        previous = height - 1
        return (
            state.ve_enable_height > 0
            and previous >= state.ve_enable_height
            and previous >= 1
            and previous % state.genesis.epoch_length == 0
        )

    def prepare_proposal(
        self, height: int, txs: list[bytes], max_bytes: int, vx: bytes | None
    ) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        if vx is not None and self.vx_required(height):
            out.append(vx)
            size += proto_tx_size(vx)
        work = 0
        for raw in txs:
            if extensions.is_vx_tx(raw):
                continue
            try:
                tx = self.decode_verified(raw)
            except ProtocolError:
                continue
            if size + proto_tx_size(raw) > max_bytes:
                break
            weight = tx_work(tx)
            if work + weight > MAX_PROPOSAL_WORK:
                break  # the rest waits for the next block (keeps blocks short under load)
            out.append(raw)
            size += proto_tx_size(raw)
            work += weight
        return out

    def process_proposal(self, height: int, txs: list[bytes]) -> tuple[bool, str]:
        """Accept only well-formed, correctly signed txs, with the extended-commit tx exactly
        where required (first) and carrying ≥ 2/3 power of valid extension signatures."""
        state = self.state
        body = txs
        if self.vx_required(height):
            if not txs or not extensions.is_vx_tx(txs[0]):
                return False, "missing extended-commit tx"
            try:
                commit = extensions.decode_vx_tx(txs[0])
                if commit.height != height - 1:
                    return False, f"extended commit is for height {commit.height}"
                extensions.verify_extended_commit(
                    commit, state.chain_id, state.validator_keys(), state.genesis.epoch_length
                )
            except extensions.VoteExtensionError as error:
                return False, error.message
            body = txs[1:]
        work = 0
        for index, raw in enumerate(body):
            if extensions.is_vx_tx(raw):
                return False, f"tx {index}: unexpected extended-commit tx"
            try:
                work += tx_work(self.decode_verified(raw))
            except ProtocolError as error:
                return False, f"tx {index}: {error.message}"
        if work > MAX_PROPOSAL_WORK:  # bounds the state one block can add (dense binary batches)
            return False, f"block work {work} exceeds {MAX_PROPOSAL_WORK}"
        return True, ""

    # --- blocks -------------------------------------------------------------------------------

    def begin_block(self, height: int, block_hash: bytes, time_s: int = 0) -> None:
        if height != self.state.height + 1:
            log.warning(
                "begin_block height=%d after committed height=%d", height, self.state.height
            )
        self.state.begin_block(height, block_hash, time_s)

    def deliver_tx(self, raw: bytes, index: int) -> TxResult:
        """Execute one tx of the current block."""
        state = self.state
        state.events = []
        if extensions.is_vx_tx(raw):
            return self._deliver_vx(raw, index)
        try:
            tx = self.decode_verified(raw)
        except ProtocolError as error:
            return TxResult(_code_of(error), error.message)
        last = state.get(schema.NONCE, tx.signer)
        if tx.nonce <= (last or 0):
            return TxResult(Code.BAD_NONCE, f"nonce {tx.nonce} ≤ last nonce {last or 0}")
        self._cache_drop(raw)
        handler = HANDLERS[tx.type]
        state.begin_tx()
        try:
            handler(state, tx)
        except Rejected as rejected:
            state.end_tx(keep=False)
            # A refused tx of a signer the chain already keeps (an account or a validator)
            # uses up its nonce; a fresh key's refused tx leaves no trace at all (it could
            # otherwise create one account entry per junk key for free).
            if last is not None or state.validator_by_signer(tx.signer) is not None:
                state.put(schema.NONCE, tx.signer, tx.nonce)
            return TxResult(rejected.code, rejected.message)
        except BaseException:
            state.end_tx(keep=False)
            raise
        state.end_tx(keep=True)
        state.put(schema.NONCE, tx.signer, tx.nonce)
        events = (("planet.tx", (("signer", tx.signer), ("type", tx.type))), *state.events)
        return TxResult(Code.OK, "", tuple(events))

    def _deliver_vx(self, raw: bytes, index: int) -> TxResult:
        state = self.state
        if index != 0 or not self.vx_required(state.block_height):
            return TxResult(Code.BAD_VOTE_EXTENSIONS, "extended-commit tx not allowed here")
        try:
            commit = extensions.decode_vx_tx(raw)
            if commit.height != state.block_height - 1:
                raise extensions.VoteExtensionError(
                    f"extended commit is for height {commit.height}, not {state.block_height - 1}"
                )
            reports = extensions.verify_extended_commit(
                commit, state.chain_id, state.validator_keys(), state.genesis.epoch_length
            )
        except extensions.VoteExtensionError as error:
            return TxResult(Code.BAD_VOTE_EXTENSIONS, error.message)
        powers = {v["address"]: v["power"] for v in state.validators}
        epoch = commit.height // state.genesis.epoch_length
        # a verifier benched for a false accusation (verdicts.py) moves no reputation either:
        # its report is dropped, while 2/3 is still counted of the whole power
        counted = {a: r for a, r in reports.items() if not verdicts.benched(state, a, epoch)}
        agreed = extensions.agreed_scores(counted, powers, state.total_power)
        applied = epochs.apply_reputation(state, epoch, agreed)
        # the same counted reports carry the verifiers' measured speeds (abci_app/speeds.py);
        # a benched verifier's earlier speed reports stop counting too
        allowed = {
            v["address"]
            for v in state.validators
            if not verdicts.benched(state, v["address"], epoch)
        }
        speeds.apply_speeds(state, epoch, counted, allowed)
        state.emit("planet.reputation", epoch=epoch, applied=applied, reporters=len(counted))
        return TxResult(Code.OK, "", tuple(state.events))

    def end_block(self) -> bytes:
        """Deterministic end-of-block rules, then the new app hash (not yet persisted)."""
        state = self.state
        state.events = []
        height = state.block_height
        registry.expire_heartbeats(state, height)
        registry.expire_registrations(state, height)
        retention.prune(state, height)
        retention.prune_expired(state, state.block_time)
        validator_set.switch(state, height)  # before the DKG: a run configured now gets the new set
        credit_dkg.end_block(state, height)
        mint_partials.end_block(state, height)  # refunds first: the close pays this epoch's
        if height % state.genesis.epoch_length == 0:
            settlement.close(state, height)
            coverage.close(state, height // state.genesis.epoch_length)
            verdicts.settle_accusations(state, height // state.genesis.epoch_length)
            numerics.apply_due(state, height // state.genesis.epoch_length + 1)
            epochs.close_epoch(state, height, state.block_hash)
            validator_set.close(state, height)  # → state.validator_updates, in effect at H + 2
        return state.seal_block()

    def commit(self) -> None:
        """Make the finalized block the committed state and persist it (one transaction)."""
        self.state.commit()


def _code_of(error: ProtocolError) -> Code:
    if isinstance(error, TxSignatureError):
        return Code.BAD_SIGNATURE
    if isinstance(error, RegistrationSignatureError):
        return Code.BAD_EVM_SIGNATURE
    if isinstance(error, TxDecodeError):
        return Code.MALFORMED_TX
    return Code.MALFORMED_TX
