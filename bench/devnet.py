"""How long `planet devnet up` takes, step by step, and how fast routability follows the chain.

Runs `planet devnet up --detach` in a temporary PLANET_HOME (its models/ links to the real model
cache, so the prepared model is reused), reads the step times from devnet.json, then measures
on the running devnet: `planet unstake` → the watchers attest 0 (seconds until the node is not
routable), and `planet leave` → LEFT. Ends with `planet devnet down`. One JSON object on stdout.

    .venv/bin/python bench/devnet.py [--validators 4] [--nodes 3] [--no-gateway]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick

STEPS = ("model", "anvil", "committee_init", "contracts", "committee_up", "nodes_routable",
         "gateway")  # fmt: skip


def planet(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def query(rpc: str, path: str, **params: str) -> Any:
    full = path + ("?" + urllib.parse.urlencode(params) if params else "")
    url = f"{rpc}/abci_query?path=" + urllib.parse.quote(json.dumps(full))
    with urllib.request.urlopen(url, timeout=10) as answer:
        response = json.load(answer)["result"]["response"]
    return json.loads(base64.b64decode(response["value"])) if not response.get("code") else None


def seconds_until(condition: Any, timeout_s: float = 120) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return round(time.monotonic() - started, 2)
        time.sleep(0.1)
    raise TimeoutError("condition not reached")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--no-gateway", action="store_true")
    args = parse_with_quick(parser, {"validators": 1, "nodes": 3, "no_gateway": True})
    from node.model.source import models_dir

    home = Path(tempfile.mkdtemp(prefix="bench-devnet-"))
    (home / "models").symlink_to(models_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_")}
    env.update(PLANET_HOME=str(home), NO_COLOR="1")
    # the start-up only: no verifiers (they start after the nodes are routable)
    up_args = ["devnet", "up", "--detach", "--validators", str(args.validators),
               "--nodes", str(args.nodes), "--verifiers", "0"]  # fmt: skip
    up_args += ["--no-gateway"] if args.no_gateway else []
    started = time.monotonic()
    up = planet(env, *up_args)
    wall = time.monotonic() - started
    metrics: dict[str, Any] = {}
    try:
        if up.returncode != 0:
            print(up.stderr[-3000:], file=sys.stderr)
            raise SystemExit(1)
        state = json.loads((home / "devnet" / "devnet.json").read_text())
        metrics["devnet_up_s"] = state["startup_s"]
        metrics["gateway_started"] = bool(state.get("gateway_url"))
        metrics["devnet_up_wall_s"] = round(wall, 1)
        previous = 0.0
        for name, (_, at) in zip(STEPS, sorted(state["steps_s"].items(), key=lambda x: int(x[0])),
                                 strict=False):  # fmt: skip
            metrics[f"step_{name}_s"] = round(at - previous, 1)
            previous = at
        rpc = state["committee_rpc"][0]
        operators = state["operators"]
        key = json.loads((Path(operators[0]) / "run" / "joined.json").read_text())["node_key"]
        unstake = planet(env, "unstake", "--home", operators[0],
                         "--password-file", state["password_file"], timeout=120)  # fmt: skip
        assert unstake.returncode == 0, unstake.stderr
        metrics["unstake_to_unroutable_s"] = seconds_until(
            lambda: not query(rpc, "/node", key=key)["routable"]
        )
        home1 = operators[-1]
        key1 = json.loads((Path(home1) / "run" / "joined.json").read_text())["node_key"]
        started = time.monotonic()
        leave = planet(env, "leave", "--home", home1,
                       "--password-file", state["password_file"], timeout=120)  # fmt: skip
        assert leave.returncode == 0, leave.stderr
        assert query(rpc, "/node", key=key1)["status"] == "LEFT"
        metrics["leave_command_s"] = round(time.monotonic() - started, 2)
    finally:
        planet(env, "devnet", "down", timeout=300)
    print(
        json.dumps(
            {
                "bench": "devnet",
                "machine": machine(),
                "config": {
                    "validators": args.validators,
                    "nodes": args.nodes,
                    "gateway": bool(metrics.pop("gateway_started", False)),
                    "quant": "int8",
                    "quick": args.quick,
                },
                "metrics": metrics,
                "targets": {"devnet_up_s": {"op": "<=", "value": 180}},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
