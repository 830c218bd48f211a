"""A verifier catches a substitute model on real processes, and honest nodes stay trusted.

The network (harness/gateway_net.py, every process real): anvil with the contracts, one CometBFT
validator running the committee app (short epochs, verdicts enabled: genesis has the EVM
section), three staked int8 SmolLM2 compute nodes over 2 shards — A (shard 0) and B (shard 1)
honest, S (shard 1) a substitute that skips every other layer (tests/doubles/cheating_node.py
`--cheat substitute-skip:2`) —, the gateway, and `planet verifier serve` on the validator's home
as its own process (its own wallet pays for every challenge; short challenges and epochs of 120
blocks: EPOCH_BLOCKS says why).

Scenario: the verifier commits a seed, challenges through the gateway with echo, scores
teacher-forced, writes the scores file that the validator's vote extension carries; within 5
epochs S is untrusted and no longer routable while A and B stay trusted every epoch; the
verifier then votes a FAILED_VERIFICATION verdict on S, the committee confirms it, and anyone
relays it to FraudProofs.slashByVerdict: S's stake is halved. The seeds the verifier used are
revealed on chain and open their commitments.

Its own network, not the shared devnet (tests/e2e/conftest.py): a cheating node, a verifier
that makes it unroutable and slashes it, and verdicts enabled with short epochs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.gateway_net import prepared_manifest, wait_for
from harness.verifier_net import VerifierNet
from protocol.committee.verification import seed_commitment
from protocol.eip712 import address_of
from tests.doubles import cheating_node

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# ~26 s epochs at the committee's ~0.2 s blocks. The substitute is blamed at the end of the
# first epoch whose results saw it beside A and A beside B: normally the first one with the
# verifier's seed (the epoch after its start), so the test lasts ~2 epochs, and an epoch must
# hold the verifier's work — its 4 challenges, its sampled check, and the next epoch's text,
# which its reference writes meanwhile (~70 ms of CPU a token). With 50-block epochs it managed
# one challenge per two epochs, a low circuit (shared shard-0 node + substitute) was rarely
# followed by the clean one that clears its partner in the same or the next epoch, and
# attribution waited for chance (CI of ed09fc2: C=0 in epochs 6, 8, 17, 21, 22, clean ones in
# between, no blame by 36). The shorter challenges below (16 + 32 tokens: 96 tokens of text an
# epoch, 48-token prefills, 16 sampled tokens, against 144, 96 and 32 by default) cut that work
# so that 120 blocks hold it as 200 did: under a cap of half a core (4 lanes on 2 cores) it took
# 26 s of a 31 s epoch, the default lengths 44 s of a 53 s 200-block one, and both blamed the
# substitute in the first seeded epoch; uncapped ~11 s of ~27 s. The lengths decide nothing
# here: the substitute's mean KL a token was 2.6 to 5.6 nats in those runs, an honest int8
# circuit's 0 (its activations are the reference's own), the calibrated full-credibility
# bound 0.0039.
EPOCH_BLOCKS = 120
UNTRUSTED_BELOW = 400_000
VERIFIER_ARGS = (
    *("--prompt-tokens", "16", "--continuation-tokens", "32"),
    *("--sampled-tokens", "16"),
)


@pytest.fixture(scope="module")
def vnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerifierNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    run_dir = tmp_path_factory.mktemp("verifier-net")
    network = VerifierNet.start(
        run_dir,
        manifest,
        honest=[0, 1],
        cheats=[(1, "substitute-skip:2")],
        cheating_node=cheating_node.MODULE,
        epoch_blocks=EPOCH_BLOCKS,
        challenges=4,
        verifier_args=VERIFIER_ARGS,
    )
    try:
        yield network
    finally:
        network.close()


def _alive(vnet: VerifierNet) -> None:
    vnet.alive()


def test_substitute_untrusted_within_5_epochs_honest_stay_trusted(vnet: VerifierNet) -> None:
    committee = vnet.net.committee
    assert committee is not None
    cheater, honest = vnet.cheaters[0].public, [c.public for c in vnet.honest]
    seen_untrusted_honest: list[tuple[str, int]] = []

    def cheater_untrusted() -> bool:
        _alive(vnet)
        reps = committee.reputations()
        for key in honest:
            record = reps.get(key)
            if record is not None and record["r"] < UNTRUSTED_BELOW:
                seen_untrusted_honest.append((key, record["r"]))
        record = reps.get(cheater)
        return record is not None and record["r"] < UNTRUSTED_BELOW

    wait_for(cheater_untrusted, 600, "the substitute was not untrusted", interval=1.0)
    record = committee.reputations()[cheater]
    # the first epoch the verifier could challenge in: the first one it committed a seed for
    first = next(
        e
        for e in range(1, record["last_epoch"] + 1)
        if committee.query(f"/seeds?epoch={e}")["seeds"]
    )
    assert record["last_epoch"] - first + 1 <= 5, (first, record)
    assert seen_untrusted_honest == []
    view = committee.query(f"/node?key={cheater}")
    assert view["untrusted"] is True and view["routable"] is False
    for key in honest:
        node = committee.query(f"/node?key={key}")
        assert node["routable"] is True and node["reputation"] >= UNTRUSTED_BELOW
    text = vnet.log.read_text()
    assert "challenge epoch=" in text and "C=0" in text and "C=1000000" in text


def test_verdict_confirmed_and_relayed_slashes_half_the_substitute_stake(
    vnet: VerifierNet,
) -> None:
    committee = vnet.net.committee
    assert committee is not None
    cheater_address = address_of(vnet.cheaters[0].evm_key)

    def confirmed() -> Any:
        _alive(vnet)
        verdicts = committee.query("/verdicts?confirmed=true")["verdicts"]
        return [v for v in verdicts if v["node"].lower() == cheater_address.lower()]

    [verdict] = wait_for(confirmed, 240, "no confirmed verdict on the substitute", interval=1.0)
    relayer = vnet.net.account("relayer")
    before = relayer.staking.stake_of(cheater_address)
    relayer.fraud_proofs.relay_confirmed_verdict(verdict)
    assert relayer.staking.stake_of(cheater_address) == before // 2
    honest_reps = committee.reputations()
    assert all(honest_reps[c.public]["r"] >= UNTRUSTED_BELOW for c in vnet.honest)


def test_verifier_seeds_were_committed_before_and_revealed_after(vnet: VerifierNet) -> None:
    committee = vnet.net.committee
    assert committee is not None
    signer = committee.validator_key().verify_key.encode().hex()
    current = committee.query("/epochs")["current"]

    def revealed() -> list[dict[str, Any]]:
        out = []
        for epoch in range(1, current):
            out += [
                {**s, "epoch": epoch}
                for s in committee.query(f"/seeds?epoch={epoch}")["seeds"]
                if s["seed"] is not None
            ]
        return out

    seeds = wait_for(revealed, 60, "no seed was revealed", interval=1.0)
    for record in seeds:
        assert record["signer"] == signer
        seed = bytes.fromhex(record["seed"][2:])
        assert seed_commitment(signer, record["epoch"], seed) == record["commitment"]
        start = (record["epoch"] - 1) * EPOCH_BLOCKS + 1
        assert record["height"] < start <= record["revealed_height"] - EPOCH_BLOCKS


def test_sampled_answers_checked_by_replaying_the_seed(vnet: VerifierNet) -> None:
    """The verifier also asks sampled completions with a seed from its secret and replays the
    sampler on its reference: honest circuits' tokens match (C = 10^6), the substitute's do not.
    Its challenge text is written by its reference model from the seed (not the repo corpus)."""
    cheater = vnet.cheaters[0].public[:12]

    def sampled() -> list[str]:
        _alive(vnet)
        return [ln for ln in vnet.log.read_text().splitlines() if "sampled epoch=" in ln]

    lines = wait_for(sampled, 300, "no sampled check", interval=2.0)
    for line in lines:
        observed = int(line.split("observed=")[1].split()[0])
        assert observed > 0, line
        mismatched = int(line.split("mismatched=")[1].split()[0])
        if cheater in line:
            assert mismatched > 0, line  # a substitute's tokens are not the reference's
        else:
            assert mismatched <= 1 and line.endswith("C=1000000"), line


def test_honest_nodes_get_the_speed_the_verifier_measured_on_clean_sampled_answers(
    vnet: VerifierNet,
) -> None:
    """Issue 44: the verifier times its clean sampled answers (never the substitute's), its
    vote extension carries each node's own tokens/s solved from them, and the committee answers them
    as `/node` `speed` (one validator: the median is its report). It waits for nothing when the
    epoch that blamed the substitute also timed a clean A + B sampled answer (one sampled check
    an epoch, through B or the substitute as the gateway draws), else for the next epoch's (the
    substitute is unroutable by then)."""
    committee = vnet.net.committee
    assert committee is not None
    cheater = vnet.cheaters[0].public
    honest = [c.public for c in vnet.honest]

    def measured() -> dict[str, int] | None:
        _alive(vnet)
        speeds = {k: committee.query(f"/node?key={k}")["speed"] for k in honest}
        return speeds if all(type(s) is int and s >= 1 for s in speeds.values()) else None

    speeds = wait_for(measured, 240, "no measured speed for the honest nodes", interval=2.0)
    lines = [ln for ln in vnet.log.read_text().splitlines() if "speed epoch=" in ln]
    assert lines and all(cheater[:12] not in ln for ln in lines), lines
    assert all(s <= 100_000 for s in speeds.values()), speeds
