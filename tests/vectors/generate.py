"""Writes the golden vectors tests/vectors/eip712.json and tests/vectors/merkle.json.

Run once and commit the output: `python tests/vectors/generate.py`. Deterministic (fixed keys,
fixed domains on chain id 31337, deterministic signatures), so re-running it must reproduce the
committed files byte for byte; tests/unit/test_eip712.py and test_merkle.py assert the committed
files against the library and the Hardhat tests assert the same files against the contracts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from eth_utils import keccak

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from protocol.eip712 import (  # noqa: E402
    Commitment,
    CommitteeUpdate,
    Domain,
    ModelRegistration,
    PayoutRoot,
    Reveal,
    TypedStruct,
    Verdict,
    address_of,
    challenge_commitment,
    commitment_value,
    committee_domain,
    committee_signatures,
    evidence_id,
    fraud_proofs_domain,
    queries_hash,
)
from shares.merkle import Payout, PayoutTree  # noqa: E402

HERE = Path(__file__).resolve().parent
CHAIN_ID = 31337
# The first two contract addresses anvil's default deployer gets (fixed, not the real deployment).
COMMITTEE_ADDRESS = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
FRAUD_PROOFS_ADDRESS = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
ESCROW_ADDRESS = "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"
REGISTRY_ADDRESS = "0xCf7Ed3AccA5a467e9e704C703E8D87F634fB0Fc9"
SIGNED_AT = 1_767_225_600  # 2026-01-01T00:00:00Z


def key(label: str) -> bytes:
    """A fixed test private key: keccak256 of a label (never use for real funds)."""
    return keccak(text=f"planet golden vector key: {label}")


def b32(label: str) -> bytes:
    return keccak(text=label)


def hexs(data: bytes) -> str:
    return "0x" + data.hex()


SIGNER_KEY = key("signer")
COMMITTEE_KEYS = [key(f"committee {i}") for i in range(4)]


def prepaid_debits() -> tuple[list[str], list[str], list[int]]:
    """Debits per (payer, gateway), ascending by (payer, gateway) as the escrow wants them: two
    payers, the first paying at two gateways, one debit above 2^64 (the escrow posts this
    statement in tests/contracts/vectors.test.js, so its total stays below 2^128)."""
    payers = sorted((address_of(key(f"payer {i}")) for i in range(2)), key=lambda a: int(a, 16))
    gateways = sorted((address_of(key(f"gateway {i}")) for i in range(2)), key=lambda a: int(a, 16))
    pairs = [(payers[0], gateways[0]), (payers[0], gateways[1]), (payers[1], gateways[0])]
    return [p for p, _ in pairs], [g for _, g in pairs], [7 * 10**15, 5, 2**127 + 1]


def structs() -> list[tuple[str, TypedStruct, Domain]]:
    committee = committee_domain(CHAIN_ID, COMMITTEE_ADDRESS)
    fraud = fraud_proofs_domain(CHAIN_ID, FRAUD_PROOFS_ADDRESS)
    members = sorted((address_of(k) for k in COMMITTEE_KEYS), key=lambda a: int(a, 16))
    session, step, shard = b32("session 1"), 7, 2
    output_hash, salt = b32("output 1"), b32("salt 1")
    reveal = Reveal(
        session, step, shard, b32("manifest"), b32("input 1"), output_hash, salt, SIGNED_AT + 1
    )
    ids = [b32("query 1"), b32("query 2"), b32("query 3")]
    fees = [10**15, 2 * 10**15, 3 * 10**15 + 1]
    return [
        ("committee_update", CommitteeUpdate(tuple(members), (1, 1, 2, 3), 0), committee),
        (
            "verdict",
            Verdict(
                address_of(key("node")),
                3,
                b32("evidence"),
                address_of(key("challenger")),
                5,
                FRAUD_PROOFS_ADDRESS,
            ),
            committee,
        ),
        (
            "payout_root",
            PayoutRoot(1, b32("root"), sum(fees), queries_hash(ids, fees), ESCROW_ADDRESS),
            committee,
        ),
        (
            "model_registration",
            ModelRegistration(
                b32("model"),
                b32("manifest"),
                (b32("shard 0"), b32("shard 1"), b32("shard 2")),
                0,
                REGISTRY_ADDRESS,
            ),
            committee,
        ),
        (
            "commitment",
            Commitment(session, step, shard, reveal.commitment_value(), SIGNED_AT),
            fraud,
        ),
        ("reveal", reveal, fraud),
        # Edge values: an empty array and maximal integers.
        ("committee_update_empty", CommitteeUpdate((), (), 2**64 - 1), committee),
        (
            "payout_root_max",
            PayoutRoot(2**64 - 1, b"\xff" * 32, 2**256 - 1, b"\x00" * 32, ESCROW_ADDRESS),
            committee,
        ),
        # An epoch that charges queries and prepaid balances at two gateways.
        (
            "payout_root_prepaid",
            PayoutRoot(
                3,
                b32("prepaid root"),
                sum(fees) + sum(prepaid_debits()[2]),
                queries_hash(ids, fees, *prepaid_debits()),
                ESCROW_ADDRESS,
            ),
            committee,
        ),
    ]


def eip712_vectors() -> dict[str, Any]:
    cases = []
    for name, struct, domain in structs():
        cases.append(
            {
                "name": name,
                "domain": domain.to_json(),
                "primaryType": struct.PRIMARY_TYPE,
                "types": struct.eip712_types(),
                "type_string": struct.type_string(),
                "message": struct.to_json_message(),
                "type_hash": hexs(struct.type_hash()),
                "domain_separator": hexs(domain.separator()),
                "struct_hash": hexs(struct.struct_hash()),
                "digest": hexs(struct.digest(domain)),
                "signature": hexs(struct.sign(SIGNER_KEY, domain)),
            }
        )
    _, payout_root, committee = structs()[2]
    signatures = committee_signatures(payout_root, COMMITTEE_KEYS, committee)
    session, output_hash, salt = b32("session 1"), b32("output 1"), b32("salt 1")
    ids = [b32("query 1"), b32("query 2"), b32("query 3")]
    fees = [10**15, 2 * 10**15, 3 * 10**15 + 1]
    payers, gateways, debits = prepaid_debits()
    return {
        "signer_private_key": hexs(SIGNER_KEY),
        "signer_address": address_of(SIGNER_KEY),
        "cases": cases,
        "committee": {
            "case": "payout_root",
            "private_keys": [hexs(k) for k in COMMITTEE_KEYS],
            "signers_sorted": sorted(
                (address_of(k) for k in COMMITTEE_KEYS), key=lambda a: int(a, 16)
            ),
            "signatures_sorted": [hexs(s) for s in signatures],
        },
        "helpers": {
            "commitment_value": {
                "session": hexs(session),
                "step": 7,
                "shard": 2,
                "outputHash": hexs(output_hash),
                "salt": hexs(salt),
                "value": hexs(commitment_value(session, 7, 2, output_hash, salt)),
            },
            "evidence_id": {
                "node": address_of(key("node")),
                "session": hexs(session),
                "step": 7,
                "shard": 2,
                "value": hexs(evidence_id(address_of(key("node")), session, 7, 2)),
            },
            "challenge_commitment": {
                "challenger": address_of(key("challenger")),
                "evidenceId": hexs(evidence_id(address_of(key("node")), session, 7, 2)),
                "offence": 1,
                "salt": hexs(b32("challenge salt")),
                "value": hexs(
                    challenge_commitment(
                        address_of(key("challenger")),
                        evidence_id(address_of(key("node")), session, 7, 2),
                        1,
                        b32("challenge salt"),
                    )
                ),
            },
            "queries_hash": {
                "encoding": "keccak256(abi.encode(bytes32[] queryIds, uint256[] fees, "
                "address[] payers, address[] gateways, uint256[] debits))",
                "queryIds": [hexs(q) for q in ids],
                "fees": [str(f) for f in fees],
                "payers": payers,
                "gateways": gateways,
                "debits": [str(d) for d in debits],
                "value": hexs(queries_hash(ids, fees, payers, gateways, debits)),
            },
            "queries_hash_empty": {
                "queryIds": [],
                "fees": [],
                "payers": [],
                "gateways": [],
                "debits": [],
                "value": hexs(queries_hash([], [])),
            },
        },
    }


def merkle_payouts() -> list[Payout]:
    amounts = [10**18, 5 * 10**17, 123456789, 1, 7 * 10**18 + 3, 42 * 10**15, 999]
    return [Payout(3, address_of(key(f"payee {i}")), amount) for i, amount in enumerate(amounts)]


def merkle_vectors() -> dict[str, Any]:
    payouts = merkle_payouts()
    tree = PayoutTree(payouts)
    return {
        "leaf_encoding": "keccak256(keccak256(abi.encode(uint64 epoch, address account, "
        "uint256 amount)))",
        "leaves": [
            {"epoch": p.epoch, "account": p.account, "amount": str(p.amount)} for p in payouts
        ],
        "leaf_hashes": [hexs(h) for h in tree.leaf_hashes],
        "root": hexs(tree.root),
        "total": str(tree.total),
        "proofs": [[hexs(n) for n in tree.proof(i)] for i in range(len(payouts))],
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def main() -> int:
    (HERE / "eip712.json").write_text(render(eip712_vectors()))
    (HERE / "merkle.json").write_text(render(merkle_vectors()))
    print(f"wrote {HERE / 'eip712.json'} and {HERE / 'merkle.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
