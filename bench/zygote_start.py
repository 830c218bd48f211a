"""CPU seconds of one `planet node serve` start, from its spawn to its first /health answer,
started afresh (`subprocess.Popen`) and forked from a zygote (node/zygote): the node's own
user + system CPU read from /proc/PID/stat when it answers (a forked child's count starts at
the fork), plus the zygote's one-time preload. Likewise a `planet relay serve` from its start
to the first line it prints on its stdout pipe (`node.procs.spawn_piped`, how the tests start
relays: Popen, or forked with the pipe sent to the zygote).

Prints one JSON object (BENCHMARKS.md); CPU, not wall: the machine is shared.

    .venv/bin/python bench/zygote_start.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread

CLOCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK  # utime, stime


def node_start_cpu_s(manifest: Path, run_dir: Path) -> tuple[float, str]:
    """One node started and stopped: (its CPU when healthy, how it was started)."""
    from node.server.launcher import free_ports, start_node, stop_pid, wait_healthy

    port = free_ports(1, 23400, 23500)[0]
    node = start_node(manifest=manifest, shard=0, port=port, run_dir=run_dir)
    try:
        wait_healthy([node], timeout_s=180)
        used = cpu_s(node.pid)
        ppid = int(Path(f"/proc/{node.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return used, "popen" if ppid == os.getpid() else "zygote"
    finally:
        stop_pid(node.pid)


def relay_start_cpu_s(run_dir: Path) -> tuple[float, str]:
    """One relay started with a stdout pipe and stopped: (its CPU once its first line is read,
    how it was started)."""
    import subprocess

    from harness.ports import ephemeral_port
    from node.procs import spawn_piped, terminate

    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "planet", "relay", "serve", "--home", str(run_dir), "--port",
            str(ephemeral_port()), "--allow-private-next-hops", "--no-register"]  # fmt: skip
    with open(run_dir / "relay.log", "w") as log:
        relay = spawn_piped(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert relay.stdout is not None
        line = relay.stdout.readline()
        assert line.startswith("relay on"), (run_dir / "relay.log").read_text()[-2000:]
        used = cpu_s(relay.pid)
        return used, "popen" if isinstance(relay, subprocess.Popen) else "zygote"
    finally:
        terminate(relay)
        if relay.stdout is not None:
            relay.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_quick(parser, {"repeats": 1}, argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.pop("PLANET_ZYGOTE", None)
    from harness.shard_cache import prepared_manifest
    from harness.zygote import ping, running

    manifest = prepared_manifest(parts=2, quant="int8")
    metrics: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fresh = [node_start_cpu_s(manifest, Path(tmp, "fresh")) for _ in range(args.repeats)]
        relays = [relay_start_cpu_s(Path(tmp, f"relay{i}")) for i in range(args.repeats)]
        with running(Path(tmp, "zygote")) as path:
            assert path is not None, "the zygote did not start"
            preload = cpu_s(ping(path) or 0)
            os.environ["PLANET_ZYGOTE"] = str(path)
            forked = [node_start_cpu_s(manifest, Path(tmp, "forked")) for _ in range(args.repeats)]
            relays += [relay_start_cpu_s(Path(tmp, f"piped{i}")) for i in range(args.repeats)]
            os.environ.pop("PLANET_ZYGOTE")
    assert {how for _, how in fresh} == {"popen"} and {how for _, how in forked} == {"zygote"}
    for name, runs in (("popen", [c for c, _ in fresh]), ("zygote", [c for c, _ in forked])):
        metrics[f"node_start_{name}_cpu_s"] = round(median(runs), 3)
        metrics[f"node_start_{name}_cpu_s_spread"] = spread(runs, 3)
        piped = [c for c, how in relays if how == name]
        assert len(piped) == args.repeats, relays
        metrics[f"relay_start_{name}_cpu_s"] = round(median(piped), 3)
        metrics[f"relay_start_{name}_cpu_s_spread"] = spread(piped, 3)
    metrics["zygote_preload_cpu_s"] = round(preload, 3)
    config = {"repeats": args.repeats, "model": "smollm2-135m-2p-int8", "shard": 0}
    print(json.dumps({"bench": "zygote_start", "machine": machine(), "config": config,
                      "metrics": metrics}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
