"""What the verifier's one-node timings cost it per epoch, in CPU (issue 44).

Per probed node the verifier computes, before the clock starts, the probed shard's input rows
(embedding + its own shards before it) and its own outputs of that shard, for every round's
sessions × positions (node/verifier/hop_session.probe_rows), then checks each answer's
fingerprint (node/verifier/fingerprint.check). This measures both on this process's CPU clock
(`time.process_time`, 1 torch thread, as the devnet's verifiers run) for SmolLM2-135M int8 in
2 shards, each shard probed, with the devnet's setting (one probe of 4 sessions × 8 positions)
and the default (`saturate` from 4 up to 16 sessions: at most 4 + 8 + 16 sessions × 8). The
WebSocket frames (one 1-position frame per position) are not in it; with `--live` the whole
probe is measured too (`HopRunner.time_node` against real node processes of both shards,
harness/replica_net.py: this process's CPU, and the probed node's as `node_cpu_ms`). Medians
of --repeats, each after --warm-ups untimed runs.

    .venv/bin/python bench/hop_probe_cost.py [--repeats 3] [--live]
    .venv/bin/python bench/hop_probe_cost.py --quick  # one timed run each, no warm-up
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench._common import machine, parse_with_quick
from harness.shard_cache import prepared_manifest
from node.model.head import ClientHead
from node.model.shard import ShardModel
from node.verifier.calibration import load_calibration
from node.verifier.fingerprint import check, fingerprint_bytes
from node.verifier.hop_schedule import probe_tokens
from node.verifier.hop_session import probe_rows

POSITIONS = 8
SETTINGS = {"devnet_4x8": [4], "default_saturated_4_8_16x8": [4, 8, 16]}


def one_node(head: Any, shards: Any, shard: int, rounds: list[int], tolerance: Any) -> float:
    started = time.process_time()
    for index, sessions in enumerate(rounds):
        tokens = probe_tokens(b"\x01" * 32, 1, "ab" * 32, index, sessions, POSITIONS, 49152)
        rows = probe_rows(head.embed, shards[:shard], shards[shard], tokens)
        for expected in rows.expected:
            for position in range(POSITIONS):
                own = expected[:, position : position + 1]
                assert check(fingerprint_bytes(own, position), own, position, tolerance).passed
    return time.process_time() - started


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live(head: Any, shards: Any, tolerance: Any, repeats: int) -> dict[str, dict[str, float]]:
    """This process's CPU for `HopRunner.time_node` of each shard's real node (ms)."""
    import asyncio
    import tempfile
    from types import SimpleNamespace

    from harness.replica_net import ReplicaNet
    from node.server.next_hops import parse_ranges
    from node.verifier.hop_runner import HopRunner
    from node.verifier.hop_schedule import HopSettings, ProbeTarget

    reference = SimpleNamespace(head=head, shards=shards, model_hash="sha256:00")
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        net = ReplicaNet.start(Path(directory), prepared_manifest(parts=2, quant="int8"), [0, 1])
        try:
            for name, rounds in SETTINGS.items():
                settings = HopSettings(3, rounds[0], rounds[-1], POSITIONS)
                runner = HopRunner(
                    reference, tolerance, settings, private_ranges=parse_ranges("127.0.0.0/8")
                )
                for index, replica in enumerate(net.replicas):
                    target = ProbeTarget("ab" * 32, replica.url, replica.shard, None)
                    pid = net._pid(index)
                    seconds, node_seconds = [], []
                    for epoch in range(repeats + 1):  # the first warms
                        started, node_started = time.process_time(), _cpu_s(pid)
                        assert asyncio.run(runner.time_node(target, b"\x02" * 32, epoch))
                        seconds.append(time.process_time() - started)
                        node_seconds.append(_cpu_s(pid) - node_started)
                    row = out.setdefault(name, {})
                    row[f"shard_{replica.shard}_cpu_ms"] = round(
                        1000 * statistics.median(seconds[1:]), 1
                    )
                    row[f"shard_{replica.shard}_node_cpu_ms"] = round(
                        1000 * statistics.median(node_seconds[1:]), 1
                    )
        finally:
            net.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warm-ups", type=int, default=1, help="untimed runs before each timed set (1)"
    )
    parser.add_argument("--live", action="store_true", help="also the whole probe, real nodes")
    args = parse_with_quick(parser, {"repeats": 1, "warm_ups": 0})
    if args.repeats < 1 or args.warm_ups < 0:
        parser.error("--repeats must be at least 1 and --warm-ups at least 0")
    torch.set_num_threads(1)
    manifest = prepared_manifest(parts=2, quant="int8")
    head = ClientHead.load(manifest, device="cpu")
    shards = [ShardModel.load(manifest, k, device="cpu", int8_kernel=True) for k in range(2)]
    tolerance = load_calibration().tolerance(str(getattr(shards[0], "quant", "none")))
    metrics: dict[str, float | None] = {}
    for name, rounds in SETTINGS.items():
        for shard in range(2):
            for _ in range(args.warm_ups):
                one_node(head, shards, shard, rounds, tolerance)
            runs = range(args.repeats)
            seconds = [one_node(head, shards, shard, rounds, tolerance) for _ in runs]
            metrics[f"{name}_shard_{shard}_cpu_ms"] = round(1000 * statistics.median(seconds), 1)
    measured = live(head, shards, tolerance, args.repeats) if args.live else {}
    for name in SETTINGS:  # the whole probe against real nodes: null without --live
        for shard in range(2):
            for kind in ("cpu_ms", "node_cpu_ms"):
                metrics[f"live_{name}_shard_{shard}_{kind}"] = measured.get(name, {}).get(
                    f"shard_{shard}_{kind}"
                )
    print(
        json.dumps(
            {
                "bench": "hop_probe_cost",
                "machine": machine(),
                "config": {
                    "model": "smollm2-135m-2p-int8",
                    "positions_per_session": POSITIONS,
                    "repeats": args.repeats,
                    "warm_ups": args.warm_ups,
                    "live": args.live,
                    "quick": args.quick,
                },
                "metrics": metrics,
            }
        )
    )


if __name__ == "__main__":
    main()
