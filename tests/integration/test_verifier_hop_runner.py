"""The verifier's one-node timing (node/verifier/hop_runner.py) against real node processes
(harness/replica_net.py): SmolLM2 int8 in 2 shards, one node for shard 0 and two for shard 1,
one of them 4x slower (tests/doubles/slow_node.py: every forward call takes 4x its time).

The runner times each node alone with the verifier's own copies of the shards (the inputs of
shard 1 computed through its own shard 0; every answer's fingerprint checked), each a clean
timing; the slowed replica's is slower than its twin's, and the speed `EpochSpeeds` reports
for each is its own timing's. A node asked for the wrong shard gives no timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from harness.gateway_net import prepared_manifest
from harness.replica_net import ReplicaNet
from node.model.head import ClientHead
from node.model.shard import ShardModel
from node.server.next_hops import parse_ranges
from node.verifier.calibration import load_calibration
from node.verifier.hop_runner import HopRunner, Timing
from node.verifier.hop_schedule import HopSettings, ProbeTarget
from node.verifier.speeds import EpochSpeeds

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = bytes(range(32))


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    network = ReplicaNet.start(
        tmp_path_factory.mktemp("hop-runner"), manifest, [0, 1, 1], slow={2: 4.0}
    )
    try:
        yield network
    finally:
        network.close()


def test_a_slowed_replica_times_slower_alone_and_its_speed_is_its_own_timing(
    net: ReplicaNet,
) -> None:
    manifest = net.manifest_path
    shards = [ShardModel.load(manifest, k, device="cpu", int8_kernel=True) for k in range(2)]
    reference = SimpleNamespace(
        head=ClientHead.load(manifest, device="cpu"), shards=shards, model_hash="sha256:00"
    )
    quant = str(getattr(shards[0], "quant", "none"))
    runner = HopRunner(
        reference,
        load_calibration().tolerance(quant),
        HopSettings(per_epoch=3, sessions=4, most_sessions=4, positions=8),
        private_ranges=parse_ranges("127.0.0.0/8"),
    )
    keys = [f"{i + 1:02x}" * 32 for i in range(3)]
    targets = [
        ProbeTarget(key, replica.url, replica.hop.shard, None)
        for key, replica in zip(keys, net.replicas, strict=True)
    ]

    async def time_all() -> list[Timing | None]:
        return [await runner.time_node(t, SEED, 1) for t in targets]

    timed = asyncio.run(time_all())
    assert all(t is not None for t in timed), timed
    first, twin, slowed = (t for t in timed if t is not None)
    assert first.shard == 0 and twin.shard == slowed.shard == 1
    assert twin.positions == slowed.positions == 32
    assert slowed.seconds > 2 * twin.seconds, (twin, slowed)
    speeds = EpochSpeeds(1)
    noted = [
        speeds.note_hop(t.node, t.shard, t.layers, t.positions, t.seconds, True)
        for t in (first, twin, slowed)
    ]
    reported = speeds.of({k: 1_000_000 for k in keys})
    assert [reported[k] for k in keys] == noted
    assert reported[keys[2]] < reported[keys[1]]
    # the twin asked as shard 0 (it serves 1): refused or wrong, no timing
    wrong = ProbeTarget(keys[1], net.replicas[1].url, 0, None)
    assert asyncio.run(runner.time_node(wrong, SEED, 1)) is None
