"""Payout Merkle trees, compatible with OpenZeppelin's `StandardMerkleTree` and `MerkleProof`.

A leaf is one payout `(uint64 epoch, address account, uint256 amount)`, hashed twice as
OpenZeppelin does (so a leaf can never be confused with an inner node):

    leaf = keccak256(keccak256(abi.encode(epoch, account, amount)))

Inner nodes hash the sorted pair: `node = keccak256(min(a, b) ‖ max(a, b))` (bytes compared as
unsigned big-endian integers), which is what `MerkleProof.verify` recomputes on chain, so a
proof is just the list of sibling hashes from the leaf up.

Leaf ordering rule (the `StandardMerkleTree` default, `sortLeaves: true`): the leaf hashes are
sorted ascending, then laid out as a complete binary tree in one array of `2n − 1` nodes, the
i-th smallest leaf at index `2n − 2 − i`; node `k` has children `2k + 1` and `2k + 2`; the root
is node 0. The root therefore depends only on the *set* of payouts, never on the order the
caller lists them in. A tree of one leaf has that leaf as its root and empty proofs.

Pure and deterministic: integers and bytes only, no I/O, no clock. A tree refuses duplicate
`(epoch, account)` pairs because the escrow pays each pair at most once.

Bulk path: `payout_leaf_hashes(epoch, rows)` hashes many `(account, amount)` rows without building
`Payout` objects (no checksum spelling, which costs one more keccak per account); its leaves are
byte-for-byte `leaf_hash`'s, because `abi.encode` of three static types is just their three
32-byte words. `keccak` is eth-hash's function called directly (the same hash eth-utils wraps,
without the wrapper's cost; bulk work uses `shares.keccak.bulk_keccak256`: an epoch of 100,000
payouts hashes ~300,000 times).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from protocol.abi_words import abi_encode, is_address, to_checksum_address
from protocol.errors import ProtocolError
from protocol.fields import is_int
from shares.keccak import bulk_keccak256
from shares.keccak import keccak256 as keccak

LEAF_TYPES = ("uint64", "address", "uint256")


@dataclass(frozen=True, slots=True)
class Payout:
    """One leaf: `amount` wei claimable by `account` for `epoch`."""

    epoch: int
    account: str
    amount: int

    def __post_init__(self) -> None:
        for name, value, bits in (("epoch", self.epoch, 64), ("amount", self.amount, 256)):
            if not is_int(value, 0, (1 << bits) - 1):
                raise ProtocolError(f"payout {name}: {value!r} does not fit uint{bits}")
        if not isinstance(self.account, str) or not is_address(self.account):
            raise ProtocolError(f"payout account: not an address: {self.account!r}")
        object.__setattr__(self, "account", to_checksum_address(self.account))

    def leaf_hash(self) -> bytes:
        return leaf_hash(self.epoch, self.account, self.amount)


def standard_leaf_hash(types: Sequence[str], values: Sequence[object]) -> bytes:
    """`StandardMerkleTree` leaf: `keccak256(keccak256(abi.encode(values...)))`."""
    return keccak(keccak(abi_encode(list(types), list(values))))


def leaf_hash(epoch: int, account: str, amount: int) -> bytes:
    """`keccak256(keccak256(abi.encode(uint64 epoch, address account, uint256 amount)))`."""
    return standard_leaf_hash(LEAF_TYPES, (epoch, account, amount))


_ZERO_12 = bytes(12)


def payout_leaf_hashes(epoch: int, rows: Iterable[tuple[str, int]]) -> list[bytes]:
    """`leaf_hash(epoch, account, amount)` of every `(account, amount)` row, fast: accounts are
    `0x` + 40 hex (any case), amounts fit uint256, else `ProtocolError`."""
    if not is_int(epoch, 0, (1 << 64) - 1):
        raise ProtocolError(f"payout epoch: {epoch!r} does not fit uint64")
    prefix = epoch.to_bytes(32, "big") + _ZERO_12
    hasher = bulk_keccak256()
    leaves: list[bytes] = []
    for account, amount in rows:
        if not isinstance(account, str) or len(account) != 42 or account[:2] != "0x":
            raise ProtocolError(f"payout account: not an address: {account!r}")
        if not is_int(amount, 0, (1 << 256) - 1):
            raise ProtocolError(f"payout amount: {amount!r} does not fit uint256")
        try:
            raw = bytes.fromhex(account[2:])
        except ValueError:
            raw = b""
        if len(raw) != 20:  # fromhex skips whitespace: " " * 40 would be 0 bytes
            raise ProtocolError(f"payout account: not an address: {account!r}")
        leaves.append(hasher(hasher(prefix + raw + amount.to_bytes(32, "big"))))
    return leaves


def hash_pair(a: bytes, b: bytes) -> bytes:
    """Commutative inner-node hash: keccak256 of the two children, smaller first."""
    return keccak(a + b) if a <= b else keccak(b + a)


def build_tree(leaves: Sequence[bytes]) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """The node array of a `StandardMerkleTree` over leaf hashes, and each leaf's node index.

    Leaves are sorted ascending; the i-th smallest goes to index `2n - 2 - i`; node k is
    `hash_pair(node 2k+1, node 2k+2)`; node 0 is the root.
    """
    if not leaves:
        raise ProtocolError("a Merkle tree needs at least one leaf")
    if any(len(leaf) != 32 for leaf in leaves):
        raise ProtocolError("every Merkle leaf is 32 bytes")
    order = sorted(range(len(leaves)), key=leaves.__getitem__)
    size = 2 * len(leaves) - 1
    tree: list[bytes] = [b""] * size
    index_of = [0] * len(leaves)
    for rank, leaf_index in enumerate(order):
        tree[size - 1 - rank] = leaves[leaf_index]
        index_of[leaf_index] = size - 1 - rank
    hasher = bulk_keccak256()
    for k in range(size - 1 - len(leaves), -1, -1):
        left, right = tree[2 * k + 1], tree[2 * k + 2]
        tree[k] = hasher(left + right) if left <= right else hasher(right + left)
    return tuple(tree), tuple(index_of)


def tree_proof(tree: Sequence[bytes], node_index: int) -> list[bytes]:
    """Sibling hashes from node `node_index` of a `build_tree` array up to the root."""
    proof: list[bytes] = []
    k = node_index
    while k > 0:
        proof.append(tree[k + 1 if k % 2 == 1 else k - 1])
        k = (k - 1) // 2
    return proof


def process_proof(leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root a proof leads to from `leaf` (`MerkleProof.processProof`)."""
    node = leaf
    for sibling in proof:
        if len(sibling) != 32:
            raise ProtocolError("merkle proof: every node is 32 bytes")
        node = hash_pair(node, sibling)
    return node


def verify(root: bytes, payout: Payout, proof: Sequence[bytes]) -> bool:
    """True when `proof` proves `payout` is a leaf under `root`."""
    return process_proof(payout.leaf_hash(), proof) == root


class PayoutTree:
    """A complete binary Merkle tree over payouts, laid out as `StandardMerkleTree` does."""

    def __init__(self, payouts: Iterable[Payout]) -> None:
        self.payouts: tuple[Payout, ...] = tuple(payouts)
        if not self.payouts:
            raise ProtocolError("a payout tree needs at least one payout")
        seen: set[tuple[int, str]] = set()
        for payout in self.payouts:
            key = (payout.epoch, payout.account)
            if key in seen:
                raise ProtocolError(f"duplicate payout for epoch {key[0]} account {key[1]}")
            seen.add(key)
        self._tree, self._index_of = build_tree([p.leaf_hash() for p in self.payouts])

    @classmethod
    def for_epoch(cls, epoch: int, amounts: Mapping[str, int]) -> PayoutTree:
        """The tree of one epoch's payouts from `{account: amount}`."""
        return cls(Payout(epoch, account, amount) for account, amount in amounts.items())

    @property
    def root(self) -> bytes:
        return self._tree[0]

    @property
    def total(self) -> int:
        return sum(p.amount for p in self.payouts)

    @property
    def leaf_hashes(self) -> tuple[bytes, ...]:
        """Leaf hashes in the order the payouts were given."""
        return tuple(self._tree[self._index_of[i]] for i in range(len(self.payouts)))

    def index(self, epoch: int, account: str) -> int:
        """Position of the payout for `(epoch, account)` in `payouts`."""
        wanted = (epoch, to_checksum_address(account)) if is_address(account) else None
        for i, payout in enumerate(self.payouts):
            if (payout.epoch, payout.account) == wanted:
                return i
        raise ProtocolError(f"no payout for epoch {epoch} account {account}")

    def proof(self, i: int) -> list[bytes]:
        """Sibling hashes from the i-th payout's leaf up to the root."""
        if not 0 <= i < len(self.payouts):
            raise ProtocolError(f"payout index {i} out of range")
        return tree_proof(self._tree, self._index_of[i])

    def proof_for(self, epoch: int, account: str) -> tuple[Payout, list[bytes]]:
        """The payout of `(epoch, account)` and its proof."""
        i = self.index(epoch, account)
        return self.payouts[i], self.proof(i)
