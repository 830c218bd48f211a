"""The committee chain's state: namespaced entries over a `Store`, and the app hash.

`State` knows storage and nothing about features: the tx rules (`dispatch.py` and the feature
modules) and the block rules (`machine.py`) read and write through it. Entries are (`ns`, `key`)
→ JSON values (integers, strings, lists, objects; no floats), the namespaces named in
`schema.py`. Reads go through three layers: the current tx's writes, the current block's writes,
then the committed state. A tx's writes join the block only when `end_tx(keep=True)`.

App hash (computed incrementally, never by rehashing all state):

    app_hash(0) = sha256("planet-committee/genesis" ‖ digest(InitChain writes))
    app_hash(h) = sha256(app_hash(h−1) ‖ uint64_be(h) ‖ digest(block h's writes))
    digest(W)   = sha256 over the writes sorted by (ns, key) of
                  ns ‖ 0x00 ‖ key ‖ 0x00 ‖ (canonical JSON value | 0xff for a deletion) ‖ 0x01

Block lifecycle: `begin_block` → writes … → `seal_block` (returns the app hash) → `commit` (one
SQLite transaction). Genesis: `install_genesis` → writes … → `seal_genesis`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any

from abci_app import schema
from abci_app.genesis import Genesis
from abci_app.store import Store
from protocol.canonical import canonical_text

_DELETED = object()
# namespaces every tx reads (nonce, signer's node record): their new values stay in the read
# cache after a block instead of being read back from SQLite by the next CheckTx
_HOT = frozenset({schema.NONCE, schema.NODE})

Event = tuple[str, tuple[tuple[str, str], ...]]


def validator_address(pubkey: bytes) -> str:
    """CometBFT's ed25519 validator address: first 20 bytes of sha256(pubkey), uppercase hex."""
    return hashlib.sha256(pubkey).digest()[:20].hex().upper()


class State:
    """Namespaced entries (tx → block → committed), the block being built, and the app hash."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.height, self.app_hash = store.load()
        self.block_height = 0
        self.block_time = 0  # unix seconds of the block header (CometBFT's BFT time)
        self.block_hash = b""
        self.events: list[Event] = []
        # (consensus key hex, new power; 0 removes) of this block, for FinalizeBlock
        self.validator_updates: list[tuple[str, int]] = []
        self._block: dict[tuple[str, str], Any] = {}
        self._tx: dict[tuple[str, str], Any] | None = None
        # InitChain's writes: readable at once, persisted with block 1 (a crash before that
        # starts over with InitChain)
        self._genesis: dict[tuple[str, str], Any] = {}
        self._unpersisted: list[tuple[str, str, str | None]] = []
        self._pending_writes: list[tuple[str, str, str | None]] = []
        self._pending_hash = b""
        self._load_meta()

    def _load_meta(self) -> None:
        get = self.committed
        self.chain_id: str = get(schema.META, "chain_id") or ""
        self.ve_enable_height: int = get(schema.META, "ve_enable_height") or 0
        stored = get(schema.META, "genesis")
        self.genesis = Genesis.from_json(stored) if stored is not None else Genesis()
        self.validators: list[dict[str, Any]] = get(schema.META, "validators") or []
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
        self, ns: str, start: str = "", stop: str | None = None, *, descending: bool = False
    ) -> Iterator[tuple[str, Any]]:
        """Committed (key, value) of `ns` in key order (or the reverse, `descending`),
        start ≤ key < stop, read lazily."""
        extra = sorted(
            (k, v)
            for (n, k), v in self._genesis.items()
            if n == ns and k >= start and (stop is None or k < stop)
        )
        if not extra:
            return self.store.items(ns, start, stop, descending=descending)
        merged = {**dict(self.store.items(ns, start, stop)), **dict(extra)}
        return iter(sorted(merged.items(), reverse=descending))

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
        self.events.append((event_type, tuple((k, str(v)) for k, v in sorted(attributes.items()))))

    # --- one tx's writes ----------------------------------------------------------------------

    def begin_tx(self) -> None:
        """Writes from here on are the tx's own until `end_tx`."""
        self._tx = {}

    def end_tx(self, keep: bool) -> None:
        """Merge the tx's writes into the block (`keep`) or drop them all."""
        if keep and self._tx is not None:
            self._block.update(self._tx)
        self._tx = None

    # --- validators ---------------------------------------------------------------------------

    def validator_by_signer(self, signer: str) -> dict[str, Any] | None:
        return self.by_pubkey.get(signer)

    def has_two_thirds(self, power: int) -> bool:
        return 3 * power >= 2 * self.total_power

    def set_validators(self, records: list[dict[str, Any]]) -> None:
        """Replace the validator set (records sorted by address) from this block on."""
        self.put(schema.META, "validators", records)
        self.validators = records
        self.by_address = {v["address"]: v for v in records}
        self.by_pubkey = {v["pub_key"]: v for v in records}
        self.total_power = sum(v["power"] for v in records)

    def validator_keys(self) -> dict[str, tuple[bytes, int]]:
        return {v["address"]: (bytes.fromhex(v["pub_key"]), v["power"]) for v in self.validators}

    # --- genesis ------------------------------------------------------------------------------

    def install_genesis(
        self,
        chain_id: str,
        validators: list[tuple[bytes, int]],
        app_state: bytes,
        ve_enable_height: int,
    ) -> None:
        """Write the genesis metadata (readable at once); `seal_genesis` finishes InitChain."""
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
        self.put(schema.META, "chain_id", chain_id)
        self.put(schema.META, "ve_enable_height", ve_enable_height)
        self.put(schema.META, "genesis", genesis.to_json())
        self.put(schema.META, "validators", records)
        self._genesis = dict(self._block)
        self._load_meta()

    def seal_genesis(self) -> bytes:
        """app_hash(0) over every InitChain write; they persist with the first Commit."""
        digest, writes = self._digest_block()
        self._genesis = dict(self._block)
        self._block = {}
        self._unpersisted = writes
        self.app_hash = hashlib.sha256(b"planet-committee/genesis" + digest).digest()
        return self.app_hash

    # --- blocks -------------------------------------------------------------------------------

    def begin_block(self, height: int, block_hash: bytes, time_s: int = 0) -> None:
        self.block_height = height
        self.block_time = time_s
        self.block_hash = block_hash
        self.validator_updates = []
        self._block = {}

    def seal_block(self) -> bytes:
        """The new app hash over this block's writes (persisted by `commit`)."""
        digest, writes = self._digest_block()
        self._pending_writes = writes
        self._pending_hash = hashlib.sha256(
            self.app_hash + self.block_height.to_bytes(8, "big") + digest
        ).digest()
        return self._pending_hash

    def commit(self) -> None:
        """Make the sealed block the committed state and persist it (one transaction)."""
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
