"""Spot checks in the live network, on real processes.

The network (tests/integration/spot_net.py): anvil with the contracts, one CometBFT validator
running the committee app (20-block epochs, verdicts enabled, genesis `spot_check_ppm` 10^6 so
every committed block is checked), two staked int8 SmolLM2 compute nodes — A (shard 0) honest,
N (shard 1) adding noise to every 8th position's output (`--cheat noise:0.5:8`) — each serving
with `--commit-dir --node-key --committee-rpc` (tickets on), their spools committed and revealed
by the agent's `Committer`, the gateway, and `planet verifier serve` (its challenges, windows
of the public text, are the traffic the nodes serve and commit).

Scenario: the verifier's seed for epoch e+1 puts it in e+1's verifier set (`/epochs`); the
blocks the nodes committed during e are selected under e+1's seed and assigned to it; it
fetches each ticket from the node that served the block and recomputes: N's checks FAIL, A's
PASS; it votes the spot-check verdict (offence 3, evidence = the finding's evidence hash), the
committee confirms it, anyone relays it to FraudProofs: N's stake is halved; A is never accused.
The verifier reports its checks (`spot_check_report`) and the chain credits them.

Its own network, not the shared devnet (tests/e2e/conftest.py): a cheating node, every block
spot-checked (`spot_check_ppm` 10^6 in genesis) and a verifier that slashes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.gateway_net import Compute, prepared_manifest, wait_for
from protocol.eip712 import address_of
from protocol.spotcheck import Outcome, Triple, epoch_of_height, evidence_hash
from tests.integration.spot_net import SpotNet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EPOCH_BLOCKS = 20
EVERY = 10**6  # ppm: every committed block is checked


@pytest.fixture(scope="module")
def snet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpotNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    network = SpotNet.start(
        tmp_path_factory.mktemp("spot-net"),
        manifest,
        nodes=[(0, ""), (1, "noise:0.5:8")],
        ppm=EVERY,
        epoch_blocks=EPOCH_BLOCKS,
    )
    try:
        yield network
    finally:
        network.close()


def _spot_evidence(snet: SpotNet, node: str, outcome: Outcome) -> set[str]:
    """Evidence hashes of `outcome` for every block `node` committed (under the seed of the
    epoch after the commitment's)."""
    out = set()
    seeds: dict[int, str] = {}
    for record in snet.query(f"/commitments?node={node}")["commitments"]:
        epoch = epoch_of_height(record["height"], EPOCH_BLOCKS)
        if epoch + 1 not in seeds:
            found = snet.query(f"/epochs?epoch={epoch + 1}")["epochs"]
            if not found:
                continue
            seeds[epoch + 1] = found[0]["seed"]
        triple = Triple(node, record["session"], record["step"], record["shard"])
        out.add("0x" + evidence_hash(seeds[epoch + 1], triple, outcome).hex())
    return out


def _diagnosis(snet: SpotNet, node: Compute) -> str:
    """What a failed wait shows: the verifier's checks and challenges, the node's committed
    blocks and the committer's errors."""
    lines = snet.log.read_text().splitlines()
    seen = [ln for ln in lines if "spot check" in ln or "challenge" in ln or "skipped" in ln]
    return "\n".join(
        [
            f"commitments of {node.public[:12]}: {snet.committed(node)}",
            f"commit errors: {snet.commit_errors}",
            "verifier log:",
            *seen[-40:],
        ]
    )


def test_noisy_node_caught_by_spot_check_verdict_slashes_half(snet: SpotNet) -> None:
    noisy = snet.cheaters[0]
    checksummed = address_of(noisy.evm_key)
    noisy_address = checksummed.lower()

    def spot_verdict() -> list[dict[str, Any]]:
        snet.alive()
        confirmed = snet.query("/verdicts?confirmed=true")["verdicts"]
        mine = [v for v in confirmed if v["node"].lower() == noisy_address]
        failed = _spot_evidence(snet, noisy.public, Outcome.FAILED)
        return [v for v in mine if v["evidence_hash"] in failed]

    try:
        [verdict, *_] = wait_for(spot_verdict, 240, "no confirmed spot-check verdict", interval=2.0)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{_diagnosis(snet, noisy)}") from None
    assert verdict["offence"] == 3
    # the verifier set that assigned the checks is the chain's: this validator's seed put it there
    signer = snet.net.committee.validator_key().verify_key.encode().hex()  # type: ignore[union-attr]
    current = snet.query("/epochs")["current"]
    assert signer in snet.query(f"/epochs?epoch={current}")["epochs"][0]["verifiers"]
    relayer = snet.net.account("relayer")
    before = relayer.staking.stake_of(checksummed)
    relayer.fraud_proofs.relay_confirmed_verdict(verdict)
    assert relayer.staking.stake_of(checksummed) == before // 2
    # one spot-check verdict per node and epoch, however many of its blocks failed
    failed = _spot_evidence(snet, noisy.public, Outcome.FAILED)
    voted = [v for v in snet.query("/verdicts")["verdicts"] if v["evidence_hash"] in failed]
    commit_epochs = {epoch_of_height(r["height"], EPOCH_BLOCKS) for r in snet.committed(noisy)}
    assert len(voted) <= len(commit_epochs)
    text = snet.log.read_text()
    assert f"node={noisy.public[:12]}" in text and "outcome=failed" in text


def test_honest_nodes_checks_pass_and_reports_are_credited(snet: SpotNet) -> None:
    honest = snet.honest[0]

    def honest_passed() -> bool:
        snet.alive()
        lines = snet.log.read_text().splitlines()
        return any(f"node={honest.public[:12]}" in ln and "outcome=passed" in ln for ln in lines)

    try:
        wait_for(honest_passed, 240, "no passed spot check of the honest node", interval=2.0)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{_diagnosis(snet, honest)}") from None
    lines = [ln for ln in snet.log.read_text().splitlines() if "spot check epoch=" in ln]
    assert not [ln for ln in lines if f"node={honest.public[:12]}" in ln and "passed" not in ln]
    honest_address = address_of(honest.evm_key).lower()
    accused = snet.query("/verdicts")["verdicts"]
    assert not [v for v in accused if v["node"].lower() == honest_address]

    def credited() -> list[dict[str, Any]]:
        current = snet.query("/epochs")["current"]
        out = []
        for epoch in range(1, current + 1):
            out += snet.query(f"/spot_reports?epoch={epoch}")["credits"]
        return out

    credits = wait_for(credited, 60, "no spot checks credited", interval=2.0)
    assert sum(c["spot_checks"] for c in credits) >= 2
    assert snet.commit_errors == []
