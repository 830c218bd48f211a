"""EIP-712 structs: the committed golden vectors, eth-account cross-checks, signature edge cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak

from protocol.eip712 import (
    SECP256K1_N,
    STRUCT_TYPES,
    Commitment,
    CommitteeUpdate,
    Domain,
    PayoutRoot,
    Reveal,
    TypedStruct,
    Verdict,
    address_of,
    as_bytes32,
    challenge_commitment,
    commitment_value,
    committee_domain,
    committee_signatures,
    evidence_id,
    fraud_proofs_domain,
    queries_hash,
    recover_digest,
    sign_digest,
)
from protocol.errors import ProtocolError

pytestmark = pytest.mark.unit
ZERO = "0x" + "00" * 20

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "eip712.json").read_text())
CASES = {case["name"]: case for case in VECTORS["cases"]}
BY_TYPE = {cls.PRIMARY_TYPE: cls for cls in STRUCT_TYPES}
KEY = bytes.fromhex(VECTORS["signer_private_key"][2:])
DOMAIN = committee_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
ESCROW = "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"


def struct_of(case: dict[str, Any]) -> TypedStruct:
    return BY_TYPE[case["primaryType"]].from_message(case["message"])


def domain_of(case: dict[str, Any]) -> Domain:
    d = case["domain"]
    return Domain(d["name"], d["version"], d["chainId"], d["verifyingContract"])


def payout_root() -> PayoutRoot:
    return PayoutRoot(1, keccak(text="root"), 10, keccak(text="q"), ESCROW)


def test_vectors_cover_every_struct_type() -> None:
    assert {case["primaryType"] for case in VECTORS["cases"]} == set(BY_TYPE)


def test_vectors_signer_address_matches_key() -> None:
    assert address_of(KEY) == VECTORS["signer_address"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_case_library_reproduces_every_field(name: str) -> None:
    case = CASES[name]
    struct, domain = struct_of(case), domain_of(case)
    assert struct.type_string() == case["type_string"]
    assert struct.eip712_types() == case["types"]
    assert struct.to_json_message() == case["message"]
    assert "0x" + struct.type_hash().hex() == case["type_hash"]
    assert "0x" + domain.separator().hex() == case["domain_separator"]
    assert "0x" + struct.struct_hash().hex() == case["struct_hash"]
    assert "0x" + struct.digest(domain).hex() == case["digest"]
    assert "0x" + struct.sign(KEY, domain).hex() == case["signature"]
    assert struct.recover(bytes.fromhex(case["signature"][2:]), domain) == VECTORS["signer_address"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_case_eth_account_encoder_agrees(name: str) -> None:
    """An independent EIP-712 implementation (eth-account) gives the same hashes and signature."""
    case = CASES[name]
    struct, domain = struct_of(case), domain_of(case)
    signable = encode_typed_data(full_message=struct.typed_data(domain))
    assert signable.header == domain.separator()
    assert "0x" + signable.body.hex() == case["struct_hash"]
    digest = keccak(b"\x19" + signable.version + signable.header + signable.body)
    assert "0x" + digest.hex() == case["digest"]
    signed = Account.sign_message(signable, KEY)
    assert "0x" + bytes(signed.signature).hex() == case["signature"]


def test_vector_type_strings_match_contract_doc() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "contracts.md").read_text()
    for cls in STRUCT_TYPES:
        assert cls.type_string() in doc, cls.type_string()


def test_vector_helpers_reproduce() -> None:
    helpers = VECTORS["helpers"]
    c = helpers["commitment_value"]
    value = commitment_value(c["session"], c["step"], c["shard"], c["outputHash"], c["salt"])
    assert "0x" + value.hex() == c["value"]
    e = helpers["evidence_id"]
    assert "0x" + evidence_id(e["node"], e["session"], e["step"], e["shard"]).hex() == e["value"]
    ch = helpers["challenge_commitment"]
    value = challenge_commitment(ch["challenger"], ch["evidenceId"], ch["offence"], ch["salt"])
    assert "0x" + value.hex() == ch["value"]
    for name in ("queries_hash", "queries_hash_empty"):
        q = helpers[name]
        got = queries_hash(
            q["queryIds"],
            [int(f) for f in q["fees"]],
            q["payers"],
            q["gateways"],
            [int(d) for d in q["debits"]],
        )
        assert "0x" + got.hex() == q["value"], name


def test_vector_committee_signatures_are_sorted_and_reproduce() -> None:
    committee = VECTORS["committee"]
    case = CASES[committee["case"]]
    struct, domain = struct_of(case), domain_of(case)
    keys = [bytes.fromhex(k[2:]) for k in committee["private_keys"]]
    signatures = committee_signatures(struct, keys, domain)
    assert ["0x" + s.hex() for s in signatures] == committee["signatures_sorted"]
    signers = [struct.recover(s, domain) for s in signatures]
    assert signers == committee["signers_sorted"]
    assert [int(a, 16) for a in signers] == sorted(int(a, 16) for a in signers)


def test_committee_signatures_any_key_order_same_result() -> None:
    keys = [keccak(text=f"k{i}") for i in range(5)]
    struct = payout_root()
    assert committee_signatures(struct, keys, DOMAIN) == committee_signatures(
        struct, list(reversed(keys)), DOMAIN
    )


def test_committee_signatures_duplicate_key_is_rejected() -> None:
    key = keccak(text="k")
    with pytest.raises(ProtocolError, match="duplicate"):
        committee_signatures(payout_root(), [key, key], DOMAIN)


def test_commitment_value_matches_manual_abi_encoding() -> None:
    session, out, salt = keccak(text="s"), keccak(text="o"), keccak(text="salt")
    manual = keccak(
        abi_encode(
            ["bytes32", "uint64", "uint32", "bytes32", "bytes32"], [session, 9, 3, out, salt]
        )
    )
    assert commitment_value(session, 9, 3, out, salt) == manual
    # The reveal's model, input and signing time are signed but not part of the commitment value.
    reveal = Reveal(session, 9, 3, keccak(text="m"), keccak(text="i"), out, salt, 123)
    assert reveal.commitment_value() == manual


def test_challenge_commitment_binds_challenger_and_offence() -> None:
    slot = evidence_id(address_of(KEY), keccak(text="s"), 1, 0)
    salt = keccak(text="salt")
    base = challenge_commitment(address_of(KEY), slot, 1, salt)
    assert base != challenge_commitment(address_of(keccak(text="other")), slot, 1, salt)
    assert base != challenge_commitment(address_of(KEY), slot, 2, salt)
    with pytest.raises(ProtocolError, match="offence"):
        challenge_commitment(address_of(KEY), slot, 0, salt)


def test_committee_structs_are_bound_to_their_consumer() -> None:
    struct = payout_root()
    signature = struct.sign(KEY, DOMAIN)
    elsewhere = PayoutRoot(1, struct.root, 10, struct.queries_hash, address_of(keccak(text="x")))
    assert elsewhere.recover(signature, DOMAIN) != address_of(KEY)


def test_queries_hash_length_mismatch_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="fees"):
        queries_hash([keccak(text="a")], [1, 2])


def test_queries_hash_empty_lists_is_abi_encoded() -> None:
    types = ["bytes32[]", "uint256[]", "address[]", "address[]", "uint256[]"]
    assert queries_hash([], []) == keccak(abi_encode(types, [[], [], [], [], []]))


def test_queries_hash_covers_payers_gateways_and_debits() -> None:
    ids, fees = [keccak(text="a")], [5]
    payer = address_of(KEY)
    gateway, other = address_of(keccak(text="gateway")), address_of(keccak(text="other"))
    base = queries_hash(ids, fees)
    with_debit = queries_hash(ids, fees, [payer], [gateway], [7])
    assert with_debit != base
    assert queries_hash(ids, fees, [payer], [gateway], [8]) != with_debit
    # the same debit charged to the payer's balance at another gateway is another statement
    assert queries_hash(ids, fees, [payer], [other], [7]) != with_debit


def test_queries_hash_unpaired_debits_are_rejected() -> None:
    ids, fees = [keccak(text="a")], [5]
    payer, gateway = address_of(KEY), address_of(keccak(text="gateway"))
    with pytest.raises(ProtocolError, match="debits"):
        queries_hash(ids, fees, [payer], [gateway], [])
    with pytest.raises(ProtocolError, match="gateways"):
        queries_hash(ids, fees, [payer], [], [7])
    with pytest.raises(ProtocolError, match="payers"):
        queries_hash(ids, fees, ["0x1234"], [gateway], [1])
    with pytest.raises(ProtocolError, match="gateways"):
        queries_hash(ids, fees, [payer], ["0x1234"], [1])


def test_sign_digest_matches_eth_account_unsafe_sign_hash() -> None:
    digest = keccak(text="anything")
    ours = sign_digest(KEY, digest)
    theirs = Account.unsafe_sign_hash(digest, KEY)
    assert ours == bytes(theirs.signature)
    assert recover_digest(digest, ours) == Account.from_key(KEY).address


def test_sign_is_deterministic_and_low_s() -> None:
    for i in range(20):
        digest = keccak(text=f"d{i}")
        signature = sign_digest(KEY, digest)
        assert signature == sign_digest(KEY, digest)
        assert int.from_bytes(signature[32:64], "big") <= SECP256K1_N // 2
        assert signature[64] in (27, 28)


def test_recover_high_s_signature_is_rejected() -> None:
    """The malleable twin (n − s, flipped v) recovers the same key in plain ecrecover, but
    OpenZeppelin's ECDSA rejects it, and so do we."""
    digest = keccak(text="x")
    signature = sign_digest(KEY, digest)
    s = int.from_bytes(signature[32:64], "big")
    twin = signature[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - signature[64]])
    with pytest.raises(ProtocolError, match="high s"):
        recover_digest(digest, twin)


@pytest.mark.parametrize("v", [0, 1, 26, 29])
def test_recover_bad_v_is_rejected(v: int) -> None:
    digest = keccak(text="x")
    signature = sign_digest(KEY, digest)
    with pytest.raises(ProtocolError, match="v must be"):
        recover_digest(digest, signature[:64] + bytes([v]))


@pytest.mark.parametrize("length", [0, 64, 66])
def test_recover_wrong_length_is_rejected(length: int) -> None:
    with pytest.raises(ProtocolError, match="65 bytes"):
        recover_digest(keccak(text="x"), b"\x01" * length)


def test_recover_other_struct_gives_other_signer() -> None:
    struct = payout_root()
    signature = struct.sign(KEY, DOMAIN)
    changed = PayoutRoot(2, struct.root, struct.total, struct.queries_hash, struct.consumer)
    assert changed.recover(signature, DOMAIN) != address_of(KEY)


def test_recover_other_domain_gives_other_signer() -> None:
    struct = payout_root()
    signature = struct.sign(KEY, DOMAIN)
    other_chain = committee_domain(1, DOMAIN.verifying_contract)
    other_name = fraud_proofs_domain(31337, DOMAIN.verifying_contract)
    assert struct.recover(signature, other_chain) != address_of(KEY)
    assert struct.recover(signature, other_name) != address_of(KEY)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Commitment(b"\x00" * 31, 0, 0, b"\x00" * 32, 0), "32 bytes"),
        (lambda: Commitment(b"\x00" * 32, -1, 0, b"\x00" * 32, 0), "uint64"),
        (lambda: Commitment(b"\x00" * 32, 0, 2**32, b"\x00" * 32, 0), "uint32"),
        (lambda: Commitment(b"\x00" * 32, True, 0, b"\x00" * 32, 0), "integer"),
        (lambda: Commitment(b"\x00" * 32, 0, 0, b"\x00" * 32, 2**64), "uint64"),
        (lambda: Verdict("0x1234", 1, b"\x00" * 32, ZERO, 0, ZERO), "address"),
        (lambda: Verdict(ZERO, 256, b"\x00" * 32, ZERO, 0, ZERO), "uint8"),
        (lambda: Verdict(ZERO, 1, b"\x00" * 32, ZERO, 0, "0x12"), "address"),
        (lambda: CommitteeUpdate(ZERO, (1,), 0), "sequence"),
        (lambda: PayoutRoot(0, "0xzz", 0, b"\x00" * 32, ZERO), "hex"),
    ],
)
def test_struct_invalid_field_is_rejected(build: Any, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        build()


def test_struct_bad_checksum_address_is_rejected() -> None:
    good = address_of(KEY)
    bad = good[:2] + good[2:].swapcase()  # the signer address has letters of both cases
    assert bad != good
    with pytest.raises(ProtocolError, match="address"):
        Verdict(bad, 1, b"\x00" * 32, good, 0, good)


def test_struct_lowercase_address_is_checksummed() -> None:
    lower = address_of(KEY).lower()
    verdict = Verdict(lower, 1, b"\x00" * 32, lower, 0, lower)
    assert verdict.node == address_of(KEY)


def test_as_bytes32_accepts_manifest_hash_spelling() -> None:
    digest = bytes(range(32))
    assert as_bytes32("sha256:" + digest.hex()) == digest
    assert as_bytes32("0x" + digest.hex()) == digest


def test_struct_from_message_missing_field_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="missing field"):
        PayoutRoot.from_message({"epoch": 1})


def test_private_key_out_of_range_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="range"):
        address_of(b"\x00" * 32)
    with pytest.raises(ProtocolError, match="range"):
        address_of(SECP256K1_N.to_bytes(32, "big"))


def test_vectors_generator_reproduces_committed_files_byte_for_byte() -> None:
    """generate.py is deterministic and the committed files are its current output."""
    import importlib.util

    path = Path(__file__).parents[1] / "vectors" / "generate.py"
    spec = importlib.util.spec_from_file_location("planet_vectors_generate", path)
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    vectors = path.parent
    assert generate.render(generate.eip712_vectors()) == (vectors / "eip712.json").read_text()
    assert generate.render(generate.merkle_vectors()) == (vectors / "merkle.json").read_text()


def test_gateway_binding_digest_matches_eth_account_typed_data() -> None:
    """`GatewayBinding` (bool and bytes32 fields, committee domain) hashes as a maintained
    EIP-712 implementation hashes it: eth_account's signature recovers under our digest."""
    from protocol.eip712 import GatewayBinding, committee_chain_hash

    key = keccak(text="gateway binding vector")
    domain = committee_domain(31337, address_of(keccak(text="committee")))
    for bound in (True, False):
        binding = GatewayBinding(
            gateway_key=keccak(text="ed25519 key"),
            gateway=address_of(key),
            bound=bound,
            nonce=7,
            chain=committee_chain_hash("planet-devnet"),
        )
        signed = Account.sign_message(
            encode_typed_data(full_message=binding.typed_data(domain)), key
        )
        assert binding.recover(bytes(signed.signature), domain) == address_of(key)
        assert binding.sign(key, domain) == bytes(signed.signature)
