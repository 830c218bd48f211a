"""The committee chain's deterministic state machine (no I/O besides its `Store`).

State is a set of namespaced JSON entries (`ns`, `key`) → value, all integers/strings/lists/
objects (no floats). Reads go through three layers: the current tx's writes, the current block's
writes, then the committed state. A tx's writes are merged into the block only when it succeeds
(every handler is atomic); its nonce is consumed as soon as signature and nonce are valid.

App hash (computed incrementally, never by rehashing all state):

    app_hash(0) = sha256("planet-committee/genesis" ‖ digest(InitChain writes))
    app_hash(h) = sha256(app_hash(h−1) ‖ uint64_be(h) ‖ digest(block h's writes))
    digest(W)   = sha256 over the writes sorted by (ns, key) of
                  ns ‖ 0x00 ‖ key ‖ 0x00 ‖ (canonical JSON value | 0xff for a deletion) ‖ 0x01

Block lifecycle: `begin_block` → `deliver_tx`… → `end_block` (heartbeat timeouts, epoch
change; returns the app hash) → `commit` (one SQLite transaction). CheckTx is `check_tx`:
decode, ed25519 (and EIP-191 for registrations) signature and nonce against committed state only.
Decoded, verified txs are cached by their bytes so ProcessProposal and FinalizeBlock do not
verify twice.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from abci_app import accusations, epochs, extensions, handlers, retention, settlement
from abci_app.codes import Code, Rejected
from abci_app.genesis import Genesis
from abci_app.store import Store
from protocol.canonical import canonical_text
from protocol.commit_batch import decode_tx, is_batch
from protocol.committee import (
    RegisterNode,
    SignedTx,
    TxDecodeError,
    TxSignatureError,
    recover_registration,
)
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

_DELETED = object()
# namespaces every tx reads (nonce, signer's node record): their new values stay in the read
# cache after a block instead of being read back from SQLite by the next CheckTx
_HOT = frozenset({"acct", "node"})
# The parsed-tx cache is bounded in bytes: each entry is accounted as 5x its raw size + 1 KiB,
# an upper bound of raw bytes + parsed objects (tracemalloc: a 62 715-byte commit batch parses
# into 137 KiB of Python objects, a 253-byte heartbeat into 1.5 KiB).
TX_CACHE_BYTES = 64 * 1024 * 1024
TX_HANDLERS = {**handlers.HANDLERS, **settlement.HANDLERS}


def tx_cache_cost(raw: bytes) -> int:
    if is_batch(raw):
        # binary batches are denser: a 45 199-byte commit batch of 1 024 records parses into
        # 216 KiB of objects (4.9x, tracemalloc), plus the raw bytes themselves
        return 8 * len(raw) + 1024
    return 5 * len(raw) + 1024


# The most work one block may carry, counted as 1 per tx + 1 per commit/reveal record
# (`tx_work`): PrepareProposal stops filling there and ProcessProposal rejects a block above it.
# It keeps blocks short under overload (without it a proposer took 22 MB of binary batches from
# the mempool at once: 3.4 s blocks; FinalizeBlock costs ~15-25 µs per record per validator
# here) and bounds the state one block can add: binary batches carry a record in 44 bytes that
# becomes ≤ ~900 bytes of state (docs/committee.md "What state costs").
MAX_PROPOSAL_WORK = 12_288


def tx_work(tx: Any) -> int:
    """The proposal budget a decoded tx uses: 1 + its commit/reveal records."""
    body = tx.body
    records = getattr(body, "commitments", None) or getattr(body, "reveals", None) or ()
    return 1 + len(records)


def validator_address(pubkey: bytes) -> str:
    """CometBFT's ed25519 validator address: first 20 bytes of sha256(pubkey), uppercase hex."""
    return hashlib.sha256(pubkey).digest()[:20].hex().upper()


@dataclass(frozen=True, slots=True)
class TxResult:
    code: Code
    log: str = ""
    events: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    data: bytes = b""


class State:
    """The committee state machine over a `Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.height, self.app_hash = store.load()
        self.block_height = 0
        self.block_time = 0  # unix seconds of the block header (CometBFT's BFT time)
        self.block_hash = b""
        self._block: dict[tuple[str, str], Any] = {}
        self._tx: dict[tuple[str, str], Any] | None = None
        # InitChain's writes: readable at once, persisted with block 1 (a crash before that
        # starts over with InitChain)
        self._genesis: dict[tuple[str, str], Any] = {}
        self._unpersisted: list[tuple[str, str, str | None]] = []
        self._events: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        self._cache: OrderedDict[bytes, tuple[SignedTx, int]] = OrderedDict()
        self._cache_bytes = 0
        self._pending_writes: list[tuple[str, str, str | None]] = []
        self._pending_hash = b""
        self._load_meta()

    def _load_meta(self) -> None:
        get = self.committed
        self.chain_id: str = get("meta", "chain_id") or ""
        self.ve_enable_height: int = get("meta", "ve_enable_height") or 0
        stored = get("meta", "genesis")
        self.genesis = Genesis.from_json(stored) if stored is not None else Genesis()
        self.validators: list[dict[str, Any]] = get("meta", "validators") or []
        self.by_address = {v["address"]: v for v in self.validators}
        self.by_pubkey = {v["pub_key"]: v for v in self.validators}
        self.total_power = sum(v["power"] for v in self.validators)

    # --- reads and writes ---------------------------------------------------------------------

    def get(self, ns: str, key: str) -> Any:
        """Current value (tx → block → committed); None when absent. Never mutate the result."""
        item = (ns, key)
        if self._tx is not None and item in self._tx:
            value = self._tx[item]
            return None if value is _DELETED else value
        if item in self._block:
            value = self._block[item]
            return None if value is _DELETED else value
        return self.committed(ns, key)

    def get_many(self, ns: str, keys: list[str]) -> dict[str, Any]:
        """`get` for many keys of one namespace at once: {key: value} of those present."""
        found: dict[str, Any] = {}
        rest: list[str] = []
        for key in keys:
            item = (ns, key)
            if self._tx is not None and item in self._tx:
                value = self._tx[item]
            elif item in self._block:
                value = self._block[item]
            elif self._genesis and item in self._genesis:
                value = self._genesis[item]
            else:
                rest.append(key)
                continue
            if value is not _DELETED:
                found[key] = value
        if rest:
            found.update(self.store.get_many(ns, rest))
        return found

    def committed(self, ns: str, key: str) -> Any:
        if self._genesis and (ns, key) in self._genesis:
            return self._genesis[(ns, key)]
        return self.store.get(ns, key)

    def put(self, ns: str, key: str, value: Any) -> None:
        target = self._tx if self._tx is not None else self._block
        target[(ns, key)] = value

    def delete(self, ns: str, key: str) -> None:
        target = self._tx if self._tx is not None else self._block
        target[(ns, key)] = _DELETED

    def keys(self, ns: str) -> list[str]:
        """Sorted keys of `ns` as the current block sees them (committed + staged)."""
        keys = {key for key, _ in self.committed_items(ns)}
        for layer in (self._block, self._tx or {}):
            for (n, k), value in layer.items():
                if n == ns:
                    if value is _DELETED:
                        keys.discard(k)
                    else:
                        keys.add(k)
        return sorted(keys)

    def committed_items(
        self, ns: str, start: str = "", stop: str | None = None
    ) -> Iterator[tuple[str, Any]]:
        """Committed (key, value) of `ns` in key order, start ≤ key < stop, read lazily."""
        extra = sorted(
            (k, v)
            for (n, k), v in self._genesis.items()
            if n == ns and k >= start and (stop is None or k < stop)
        )
        if not extra:
            return self.store.items(ns, start, stop)
        return iter(sorted({**dict(self.store.items(ns, start, stop)), **dict(extra)}.items()))

    def items(self, ns: str, start: str = "", stop: str | None = None) -> list[tuple[str, Any]]:
        """Current (key, value) of `ns` with start ≤ key < stop, in key order (committed state
        with this block's and this tx's writes applied). Reads the committed range whole: use
        for ranges whose size is bounded."""
        merged = dict(self.committed_items(ns, start, stop))
        for layer in (self._block, self._tx or {}):
            for (n, k), value in layer.items():
                if n == ns and k >= start and (stop is None or k < stop):
                    if value is _DELETED:
                        merged.pop(k, None)
                    else:
                        merged[k] = value
        return sorted(merged.items())

    def emit(self, event_type: str, /, **attributes: Any) -> None:
        self._events.append((event_type, tuple((k, str(v)) for k, v in sorted(attributes.items()))))

    # --- validators ---------------------------------------------------------------------------

    def validator_by_signer(self, signer: str) -> dict[str, Any] | None:
        return self.by_pubkey.get(signer)

    def has_two_thirds(self, power: int) -> bool:
        return 3 * power >= 2 * self.total_power

    def validator_keys(self) -> dict[str, tuple[bytes, int]]:
        return {v["address"]: (bytes.fromhex(v["pub_key"]), v["power"]) for v in self.validators}

    # --- genesis ------------------------------------------------------------------------------

    def init_chain(
        self,
        chain_id: str,
        validators: list[tuple[bytes, int]],
        app_state: bytes,
        ve_enable_height: int,
    ) -> bytes:
        """Install genesis; returns app_hash(0). The writes persist with the first Commit."""
        genesis = Genesis.parse(app_state)
        records = []
        for pubkey, power in validators:
            address = validator_address(pubkey)
            operator = (
                genesis.operators.get(address)
                or genesis.operators.get(address.lower())
                or genesis.operators.get(base64.b64encode(pubkey).decode())
            )
            records.append(
                {"address": address, "pub_key": pubkey.hex(), "power": power, "operator": operator}
            )
        records.sort(key=lambda v: v["address"])
        self._block = {}
        self.put("meta", "chain_id", chain_id)
        self.put("meta", "ve_enable_height", ve_enable_height)
        self.put("meta", "genesis", genesis.to_json())
        self.put("meta", "validators", records)
        self._genesis = dict(self._block)
        self._load_meta()
        epochs.open_first_epoch(self)
        digest, writes = self._digest_block()
        self._genesis = dict(self._block)
        self._block = {}
        self._unpersisted = writes
        self.app_hash = hashlib.sha256(b"planet-committee/genesis" + digest).digest()
        log.info(
            "init_chain chain_id=%s validators=%d app_hash=%s",
            chain_id,
            len(records),
            self.app_hash.hex(),
        )
        return self.app_hash

    # --- stateless checks (CheckTx, proposals) ------------------------------------------------

    def decode_verified(self, raw: bytes) -> SignedTx:
        """Decode and check signatures (cached by bytes); raises ProtocolError subclasses."""
        cached = self._cache.get(raw)
        if cached is not None:
            self._cache.move_to_end(raw)
            return cached[0]
        tx = decode_tx(raw)  # a JSON tx or a binary commit/reveal batch
        tx.verify()
        if isinstance(tx.body, RegisterNode):
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
        last = self.committed("acct", tx.signer) or 0
        if tx.nonce <= last:
            return TxResult(Code.BAD_NONCE, f"nonce {tx.nonce} ≤ last committed nonce {last}")
        return TxResult(Code.OK)

    # --- proposals ----------------------------------------------------------------------------

    def vx_required(self, height: int) -> bool:
        """Whether block `height` must start with the extended-commit tx: the previous height
        closed an epoch and had vote extensions enabled."""
        previous = height - 1
        return (
            self.ve_enable_height > 0
            and previous >= self.ve_enable_height
            and previous >= 1
            and previous % self.genesis.epoch_length == 0
        )

    def prepare_proposal(
        self, height: int, txs: list[bytes], max_bytes: int, vx: bytes | None
    ) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        if vx is not None and self.vx_required(height):
            out.append(vx)
            size += _proto_size(vx)
        work = 0
        for raw in txs:
            if extensions.is_vx_tx(raw):
                continue
            try:
                tx = self.decode_verified(raw)
            except ProtocolError:
                continue
            if size + _proto_size(raw) > max_bytes:
                break
            weight = tx_work(tx)
            if work + weight > MAX_PROPOSAL_WORK:
                break  # the rest waits for the next block (keeps blocks short under load)
            out.append(raw)
            size += _proto_size(raw)
            work += weight
        return out

    def process_proposal(self, height: int, txs: list[bytes]) -> tuple[bool, str]:
        """Accept only well-formed, correctly signed txs, with the extended-commit tx exactly
        where required (first) and carrying ≥ 2/3 power of valid extension signatures."""
        body = txs
        if self.vx_required(height):
            if not txs or not extensions.is_vx_tx(txs[0]):
                return False, "missing extended-commit tx"
            try:
                commit = extensions.decode_vx_tx(txs[0])
                if commit.height != height - 1:
                    return False, f"extended commit is for height {commit.height}"
                extensions.verify_extended_commit(
                    commit, self.chain_id, self.validator_keys(), self.genesis.epoch_length
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
        if height != self.height + 1:
            log.warning("begin_block height=%d after committed height=%d", height, self.height)
        self.block_height = height
        self.block_time = time_s
        self.block_hash = block_hash
        self._block = {}

    def deliver_tx(self, raw: bytes, index: int) -> TxResult:
        """Execute one tx of the current block."""
        self._events = []
        if extensions.is_vx_tx(raw):
            return self._deliver_vx(raw, index)
        try:
            tx = self.decode_verified(raw)
        except ProtocolError as error:
            return TxResult(_code_of(error), error.message)
        last = self.get("acct", tx.signer)
        if tx.nonce <= (last or 0):
            return TxResult(Code.BAD_NONCE, f"nonce {tx.nonce} ≤ last nonce {last or 0}")
        self._cache_drop(raw)
        handler: Callable[[State, SignedTx], None] = TX_HANDLERS[tx.type]
        self._tx = {}
        try:
            handler(self, tx)
            self._block.update(self._tx)
        except Rejected as rejected:
            # A refused tx of a signer the chain already keeps (an account or a validator)
            # uses up its nonce; a fresh key's refused tx leaves no trace at all (it could
            # otherwise create one account entry per junk key for free).
            if last is not None or self.validator_by_signer(tx.signer) is not None:
                self._block[("acct", tx.signer)] = tx.nonce
            return TxResult(rejected.code, rejected.message)
        finally:
            self._tx = None
        self._block[("acct", tx.signer)] = tx.nonce
        events = (("planet.tx", (("signer", tx.signer), ("type", tx.type))), *self._events)
        return TxResult(Code.OK, "", tuple(events))

    def _deliver_vx(self, raw: bytes, index: int) -> TxResult:
        if index != 0 or not self.vx_required(self.block_height):
            return TxResult(Code.BAD_VOTE_EXTENSIONS, "extended-commit tx not allowed here")
        try:
            commit = extensions.decode_vx_tx(raw)
            if commit.height != self.block_height - 1:
                raise extensions.VoteExtensionError(
                    f"extended commit is for height {commit.height}, not {self.block_height - 1}"
                )
            reports = extensions.verify_extended_commit(
                commit, self.chain_id, self.validator_keys(), self.genesis.epoch_length
            )
        except extensions.VoteExtensionError as error:
            return TxResult(Code.BAD_VOTE_EXTENSIONS, error.message)
        powers = {v["address"]: v["power"] for v in self.validators}
        agreed = extensions.agreed_scores(reports, powers, self.total_power)
        epoch = commit.height // self.genesis.epoch_length
        applied = epochs.apply_reputation(self, epoch, agreed)
        self.emit("planet.reputation", epoch=epoch, applied=applied, reporters=len(reports))
        return TxResult(Code.OK, "", tuple(self._events))

    def end_block(self) -> bytes:
        """Deterministic end-of-block rules, then the new app hash (not yet persisted)."""
        self._events = []
        epochs.expire_heartbeats(self, self.block_height)
        retention.expire_registrations(self, self.block_height)
        retention.prune(self, self.block_height)
        retention.prune_expired(self, self.block_time)
        if self.block_height % self.genesis.epoch_length == 0:
            settlement.close(self, self.block_height)
            accusations.settle_epoch(self, self.block_height // self.genesis.epoch_length)
            epochs.close_epoch(self, self.block_height, self.block_hash)
        digest, writes = self._digest_block()
        self._pending_writes = writes
        self._pending_hash = hashlib.sha256(
            self.app_hash + self.block_height.to_bytes(8, "big") + digest
        ).digest()
        return self._pending_hash

    def commit(self) -> None:
        """Make the finalized block the committed state and persist it (one transaction)."""
        writes = self._pending_writes
        hot = {item: value for item, value in self._block.items() if item[0] in _HOT}
        self.store.commit(
            self.block_height, self._pending_hash, self._unpersisted + writes, keep=hot
        )
        self.height = self.block_height
        self.app_hash = self._pending_hash
        self._unpersisted = []
        self._genesis = {}
        self._block = {}
        self._pending_writes = []

    def _digest_block(self) -> tuple[bytes, list[tuple[str, str, str | None]]]:
        writes: list[tuple[str, str, str | None]] = []
        parts: list[bytes] = []  # hashed in one call: the same bytes as per-write updates
        block = self._block
        for item in sorted(block):
            ns, key = item
            value = block[item]
            if value is _DELETED:
                writes.append((ns, key, None))
                parts.append(f"{ns}\x00{key}\x00".encode() + b"\xff\x01")
            else:
                # canonical JSON of an int is its decimal text (nonces, pruning-index entries)
                text = str(value) if type(value) is int else canonical_text(value)
                writes.append((ns, key, text))
                parts.append(f"{ns}\x00{key}\x00{text}\x01".encode())
        return hashlib.sha256(b"".join(parts)).digest(), writes


class RegistrationSignatureError(ProtocolError):
    """The EIP-191 signature of a registration does not recover to its EVM address."""

    code = "bad_evm_signature"


def _proto_size(tx: bytes) -> int:
    """Bytes a tx takes in the block's `Data` message (CometBFT's `ComputeProtoSizeForTxs`):
    field tag + uvarint length + the tx; PrepareProposal must stay within `max_tx_bytes`."""
    length = len(tx)
    prefix = 1
    while length >= 0x80:
        length >>= 7
        prefix += 1
    return 1 + prefix + len(tx)


def _code_of(error: ProtocolError) -> Code:
    if isinstance(error, TxSignatureError):
        return Code.BAD_SIGNATURE
    if isinstance(error, RegistrationSignatureError):
        return Code.BAD_EVM_SIGNATURE
    if isinstance(error, TxDecodeError):
        return Code.MALFORMED_TX
    return Code.MALFORMED_TX
