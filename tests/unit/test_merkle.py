"""Payout Merkle trees: committed vectors, OpenZeppelin layout, proofs, rejections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eth_abi import encode as abi_encode
from eth_utils import keccak

from protocol.errors import ProtocolError
from shares.merkle import (
    Payout,
    PayoutTree,
    build_tree,
    hash_pair,
    leaf_hash,
    process_proof,
    standard_leaf_hash,
    verify,
)

pytestmark = pytest.mark.unit

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "merkle.json").read_text())
ACCOUNT = "0x80d628ff4AC2aFf620C3474663F1e559234bbE0c"


def vector_payouts() -> list[Payout]:
    return [Payout(v["epoch"], v["account"], int(v["amount"])) for v in VECTORS["leaves"]]


def test_vectors_have_an_odd_number_of_at_least_five_leaves() -> None:
    assert len(VECTORS["leaves"]) >= 5 and len(VECTORS["leaves"]) % 2 == 1


def test_vectors_leaf_hashes_reproduce() -> None:
    tree = PayoutTree(vector_payouts())
    assert ["0x" + h.hex() for h in tree.leaf_hashes] == VECTORS["leaf_hashes"]


def test_vectors_root_total_and_proofs_reproduce() -> None:
    tree = PayoutTree(vector_payouts())
    assert "0x" + tree.root.hex() == VECTORS["root"]
    assert str(tree.total) == VECTORS["total"]
    for i in range(len(tree.payouts)):
        assert ["0x" + n.hex() for n in tree.proof(i)] == VECTORS["proofs"][i]


def test_vectors_every_committed_proof_verifies() -> None:
    root = bytes.fromhex(VECTORS["root"][2:])
    for payout, proof in zip(vector_payouts(), VECTORS["proofs"], strict=True):
        assert verify(root, payout, [bytes.fromhex(n[2:]) for n in proof])


def test_leaf_hash_is_double_keccak_of_abi_encoding() -> None:
    encoded = abi_encode(["uint64", "address", "uint256"], [5, ACCOUNT, 10**18])
    assert leaf_hash(5, ACCOUNT, 10**18) == keccak(keccak(encoded))


def test_build_tree_matches_openzeppelin_standard_tree_dump() -> None:
    """A `StandardMerkleTree.of(values, ["address", "uint256"]).dump()` published with the
    OpenZeppelin JS library: three values, their leaves at tree indices 4, 3, 2."""
    expected_tree = [
        "0fecce441c7468f17e3fe4a5f211b77a15b27c9ab3d33317df385dfbe5487034",
        "636ab2686ee3036244cf3d6b5574e051e4b20a3577b008975dbcca6dde2897d2",
        "d90245da324d7908326a3d56a9659741551a4603c397bf4dd373976bd85660e7",
        "36fb17c97ec80bb961ff0adff1af4a2a34847ecc40653c162e327117a76e3ec9",
        "1867c4ebd455913e429523a5c2d4b3a79f58068b5a25af911956245ed03a659d",
    ]
    leaves = [standard_leaf_hash(["address", "uint256"], [ACCOUNT, i]) for i in range(3)]
    tree, index_of = build_tree(leaves)
    assert [node.hex() for node in tree] == expected_tree
    assert index_of == (4, 3, 2)


def test_root_does_not_depend_on_payout_order() -> None:
    payouts = vector_payouts()
    assert PayoutTree(payouts).root == PayoutTree(list(reversed(payouts))).root


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8, 13])
def test_every_proof_verifies_for_tree_size(count: int) -> None:
    payouts = [Payout(1, "0x" + f"{i + 1:040x}", i * 7 + 1) for i in range(count)]
    tree = PayoutTree(payouts)
    for i, payout in enumerate(payouts):
        proof = tree.proof(i)
        assert verify(tree.root, payout, proof)
        assert len(proof) <= count.bit_length()


def test_single_leaf_tree_root_is_the_leaf() -> None:
    tree = PayoutTree([Payout(1, ACCOUNT, 5)])
    assert tree.root == leaf_hash(1, ACCOUNT, 5)
    assert tree.proof(0) == []


def test_proof_for_other_amount_fails() -> None:
    tree = PayoutTree(vector_payouts())
    payout, proof = tree.proof_for(3, VECTORS["leaves"][0]["account"])
    assert verify(tree.root, payout, proof)
    assert not verify(tree.root, Payout(payout.epoch, payout.account, payout.amount + 1), proof)
    assert not verify(tree.root, Payout(payout.epoch + 1, payout.account, payout.amount), proof)


def test_proof_with_a_flipped_node_fails() -> None:
    tree = PayoutTree(vector_payouts())
    proof = tree.proof(2)
    proof[0] = bytes([proof[0][0] ^ 1]) + proof[0][1:]
    assert not verify(tree.root, tree.payouts[2], proof)


def test_hash_pair_is_commutative() -> None:
    a, b = keccak(text="a"), keccak(text="b")
    assert hash_pair(a, b) == hash_pair(b, a) == keccak(min(a, b) + max(a, b))


def test_for_epoch_builds_from_mapping() -> None:
    tree = PayoutTree.for_epoch(9, {ACCOUNT: 3, "0x" + "11" * 20: 4})
    assert tree.total == 7
    payout, proof = tree.proof_for(9, ACCOUNT.lower())
    assert payout.amount == 3 and verify(tree.root, payout, proof)


def test_duplicate_epoch_account_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="duplicate"):
        PayoutTree([Payout(1, ACCOUNT, 1), Payout(1, ACCOUNT.lower(), 2)])


def test_empty_tree_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="at least one"):
        PayoutTree([])


@pytest.mark.parametrize(
    ("epoch", "account", "amount"),
    [
        (-1, ACCOUNT, 1),
        (2**64, ACCOUNT, 1),
        (1, "0x12", 1),
        (1, ACCOUNT, 2**256),
        (1, ACCOUNT, 1.0),
    ],
)
def test_payout_out_of_range_is_rejected(epoch: int, account: str, amount: int) -> None:
    with pytest.raises(ProtocolError):
        Payout(epoch, account, amount)


def test_proof_index_out_of_range_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="out of range"):
        PayoutTree([Payout(1, ACCOUNT, 1)]).proof(1)


def test_process_proof_bad_node_length_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="32 bytes"):
        process_proof(keccak(text="x"), [b"\x00" * 31])
