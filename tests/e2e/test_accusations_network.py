"""A false accusation is refused and costs its author, on a real committee.

Four CometBFT validators running the committee app (`planet committee init/up`, genesis with
the EVM section so verdict votes are accepted; epochs of 5 blocks). Validator 0's verifier
accuses a node alone (10 of 40 power): the verdict never reaches 2/3, and at the close of the
3rd epoch after its vote (`SETTLE_EPOCHS`) the chain settles it `refused` and marks
validator 0 (`/verifiers`).
Three validators agreeing on another verdict confirm it: each of them gets a `confirmed`
mark. The false accuser is then benched: its next verdict vote is refused (VERIFIER_BENCHED) and
its verifier is left out of the spot-check verifier set although it committed a seed. Every
vote is the verifier's own code path (`failed_verification_verdict`, signed with
the validator's operator keystore) over the validators' real RPCs.

Its own committee, not the shared devnet (tests/e2e/conftest.py): 5-block epochs, a
validator's verifier benched for a false accusation, which would change the shared set.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from deploy.committee.genesis import set_genesis_evm
from deploy.committee.network import load_network
from node.chain.committee_rpc import CommitteeRpc
from node.keys import read_operator_key
from node.procs import run_captured
from protocol.committee.envelope import sign
from protocol.committee.verification import SeedCommit, VerdictVote, seed_commitment
from protocol.eip712 import committee_domain
from tests.e2e.test_committee_network import _free_base_port, _planet_command, planet

pytestmark = pytest.mark.e2e

EPOCH_LENGTH = 5
VERIFIER_BENCHED = 54  # abci_app/codes.py
EVM_CHAIN_ID = 31337
COMMITTEE_ADDRESS = "0x" + "c0" * 20
FRAUD_PROOFS_ADDRESS = "0x" + "f0" * 20


@pytest.fixture(scope="module")
def committee(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("accusations") / "net"
    try:
        planet(
            directory,
            "init",
            "--validators",
            "4",
            "--base-port",
            str(_free_base_port(first=28100)),
            "--timeout-commit",
            "300ms",
            "--epoch-length",
            str(EPOCH_LENGTH),
            "--committee-address",
            COMMITTEE_ADDRESS,
        )
        set_genesis_evm(
            load_network(directory),
            committee_address=COMMITTEE_ADDRESS,
            evm_chain_id=EVM_CHAIN_ID,
            fraud_proofs_address=FRAUD_PROOFS_ADDRESS,
        )
        planet(directory, "up", "--timeout", "90", timeout=150)
        yield directory
    finally:
        run_captured(
            [*_planet_command(), "committee", "down", "--dir", str(directory)],
            timeout=60,
            check=False,
        )


def _consensus_key(home: Path) -> SigningKey:
    import base64
    import json

    doc = json.loads((home / "config" / "priv_validator_key.json").read_text())
    return SigningKey(base64.b64decode(doc["priv_key"]["value"])[:32])


async def _vote(url: str, home: Path, node_address: str, tag: bytes) -> tuple[int, str]:
    """Validator at `home` votes FAILED_VERIFICATION on `node_address`; (code, verdict id)."""
    # here, not at the top: the verifier's module imports torch, and every lane of
    # deploy/test.sh collects this module (issue 41)
    from node.verifier.worker import failed_verification_verdict

    operator = read_operator_key(home / "config" / "operator_key.json")
    verdict = failed_verification_verdict(
        node_address, hashlib.sha256(tag).hexdigest(), 1, "0x" + "ab" * 20, FRAUD_PROOFS_ADDRESS
    )
    signature = verdict.sign(operator, committee_domain(EVM_CHAIN_ID, COMMITTEE_ADDRESS))
    body = VerdictVote(
        node=verdict.node,
        offence=verdict.offence,
        evidence_hash="0x" + verdict.evidence_hash.hex(),
        challenger=verdict.challenger,
        verdict_nonce=verdict.nonce,
        signature="0x" + signature.hex(),
    )
    key = _consensus_key(home)
    async with CommitteeRpc(url) as rpc:
        nonce = (await rpc.abci_query(f"/nonce?account={key.verify_key.encode().hex()}"))["nonce"]
        sent = await rpc.broadcast_tx_sync(sign(body, key, nonce + 1).encode())
        done = await rpc.wait_for_tx(sent.hash, timeout_s=30)
    return done.code, "0x" + verdict.struct_hash().hex()


async def _query(url: str, path: str) -> Any:
    async with CommitteeRpc(url) as rpc:
        return await rpc.abci_query(path)


async def _wait(url: str, predicate: Any, timeout_s: float) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.5)


def test_false_accusation_refused_and_its_author_penalized(committee: Path) -> None:
    network = load_network(committee)
    validators = network.validators
    url = validators[1].rpc_url

    async def scenario() -> None:
        code, false_id = await _vote(
            validators[0].rpc_url, Path(validators[0].home), "0x" + "11" * 20, b"honest node"
        )
        assert code == 0
        codes = []
        for v in validators[1:]:
            code, true_id = await _vote(v.rpc_url, Path(v.home), "0x" + "22" * 20, b"cheater")
            codes.append(code)
        assert codes == [0, 0, 0]

        async def settled() -> Any:
            verdicts = (await _query(url, "/verdicts"))["verdicts"]
            views = {v["id"]: v for v in verdicts}
            if all("settled" in views.get(i, {}) for i in (false_id, true_id)):
                return views
            return None

        views = await _wait(url, settled, 120)
        assert views[false_id]["confirmed"] is False and views[false_id]["settled"] == "refused"
        assert views[true_id]["confirmed"] is True and views[true_id]["settled"] == "confirmed"
        marks = (await _query(url, "/verifiers"))["verifiers"]
        accuser = validators[0].validator_address.upper()
        assert marks[accuser]["refused"] == 1 and marks[accuser]["confirmed"] == 0
        for v in validators[1:]:
            mark = marks[v.validator_address.upper()]
            assert mark["confirmed"] == 1 and mark["refused"] == 0
        # every validator's app agrees on the record (the same state everywhere) once it has
        # applied the block the record is from (on a loaded box one can be a block behind)
        for v in validators:

            async def agrees(rpc_url: str = v.rpc_url) -> bool:
                return (await _query(rpc_url, "/verifiers"))["verifiers"] == marks

            try:
                await _wait(v.rpc_url, agrees, 60)
            except TimeoutError:  # show the difference
                assert (await _query(v.rpc_url, "/verifiers"))["verifiers"] == marks
        # the false accusation costs its author: benched, its next vote is refused, and its
        # verifier is left out of the spot-check verifier set (no checks, no verification pay)
        current = (await _query(url, "/epochs"))["current"]
        assert marks[accuser]["benched_until"] >= current + 2
        code, _ = await _vote(
            validators[0].rpc_url, Path(validators[0].home), "0x" + "33" * 20, b"again"
        )
        assert code == VERIFIER_BENCHED
        target = current + 2
        for v in validators[:2]:
            assert await _seed_commit(v.rpc_url, Path(v.home), target) == 0

        async def fixed() -> Any:
            return (await _query(url, f"/epochs?epoch={target}"))["epochs"]

        [record] = await _wait(url, fixed, 60)
        keys = [_consensus_key(Path(v.home)).verify_key.encode().hex() for v in validators[:2]]
        assert record["verifiers"] == [keys[1]]  # validator 0 committed a seed too

    asyncio.run(scenario())


async def _seed_commit(url: str, home: Path, epoch: int) -> int:
    key = _consensus_key(home)
    signer = key.verify_key.encode().hex()
    body = SeedCommit(
        epoch, seed_commitment(signer, epoch, hashlib.sha256(home.name.encode()).digest())
    )
    async with CommitteeRpc(url) as rpc:
        nonce = (await rpc.abci_query(f"/nonce?account={signer}"))["nonce"]
        sent = await rpc.broadcast_tx_sync(sign(body, key, nonce + 1).encode())
        return (await rpc.wait_for_tx(sent.hash, timeout_s=30)).code
