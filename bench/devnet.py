"""How long `planet devnet up` takes, step by step, and how fast routability follows the chain.

Runs `planet devnet up --detach` in a temporary PLANET_HOME (its models/ links to the real model
cache, so the prepared model is reused), reads the step times from devnet.json, then measures
on the running devnet: an operator's `planet status`, the committee's `/node` query, the block
interval, `planet unstake` → the watchers attest 0 (seconds until the node is not routable), and
`planet leave` → LEFT, and a user's credit purchase (issue 42): `planet balance deposit --credits`
then `planet credits buy --credits N` (default 100), from the mint's funding block to the block
at which its credits are in the user's file (`credit_spendable_blocks`, target ≤ 2) and the key
period's buyers, the anonymity set of a credit bought on this devnet (`credit_anonymity_set`).
Ends with `planet devnet down`. One JSON object on stdout.

    .venv/bin/python bench/devnet.py [--validators 4] [--nodes 3] [--no-gateway]
    .venv/bin/python bench/devnet.py --devnet ~/.cache/planet/devnet   # one already running

`--devnet DIR` measures a devnet someone else started (DIR is its state directory, where
`$PLANET_DEVNET` points, default `$PLANET_HOME/devnet`) and leaves it as it found it: the start-up
figures are the ones it recorded in devnet.json, then `planet status`, the `/node` query and the
block interval are measured on it; unstake and leave are not run (they would take nodes out of a
network others use), so their metrics are null.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick

# the last: the second model's seat (not with `planet devnet up --one-model`)
STEPS = ("model", "anvil", "committee_init", "contracts", "committee_up", "nodes_routable",
         "gateway", "second_model_routable")  # fmt: skip


def planet(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planet", *args],
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


def height(rpc: str) -> int:
    with urllib.request.urlopen(f"{rpc}/status", timeout=10) as answer:
        return int(json.load(answer)["result"]["sync_info"]["latest_block_height"])


def startup_metrics(state: dict[str, Any]) -> dict[str, Any]:
    """The start-up figures devnet.json recorded: the whole and each step."""
    metrics: dict[str, Any] = {"devnet_up_s": state["startup_s"]}
    previous = 0.0
    for name, (_, at) in zip(STEPS, sorted(state["steps_s"].items(), key=lambda x: int(x[0])),
                             strict=False):  # fmt: skip
        metrics[f"step_{name}_s"] = round(at - previous, 1)
        previous = at
    return metrics


def read_only_metrics(env: dict[str, str], state: dict[str, Any]) -> dict[str, Any]:
    """What can be measured on a running devnet without changing it: an operator's `planet
    status`, the committee's `/node` query for every joined node, one block interval."""
    rpc = state["committee_rpc"][0]
    operators = state["operators"]
    started = time.monotonic()
    status = planet(env, "status", "--json", "--home", operators[0],
                    "--password-file", state["password_file"], timeout=120)  # fmt: skip
    assert status.returncode == 0, status.stderr[-3000:]
    assert isinstance(json.loads(status.stdout), dict), status.stdout[-3000:]
    status_s = time.monotonic() - started
    query_ms = []
    for home in operators:
        key = json.loads((Path(home) / "run" / "joined.json").read_text())["node_key"]
        started = time.perf_counter()
        node = query(rpc, "/node", key=key)
        query_ms.append(1000 * (time.perf_counter() - started))
        assert node is not None and "routable" in node, node
    first = height(rpc)
    seconds_until(lambda: height(rpc) > first, 60)  # the next block starts the interval
    second = height(rpc)
    block_s = seconds_until(lambda: height(rpc) > second, 60)
    return {
        "status_command_s": round(status_s, 2),
        "node_query_ms_median": round(statistics.median(query_ms), 2),
        "block_interval_s": block_s,
    }


def credit_metrics(env: dict[str, str], state: dict[str, Any], count: int) -> dict[str, Any]:
    """The user buys `count` credits (its deposit first): seconds and blocks from sending the
    mint to credits in its file, from the mint's funding block to then, and the key period's
    buyers (`/credit_period`: the anonymity set of these credits)."""
    rpc = state["committee_rpc"][0]
    users = [a for a in state["accounts"] if a.get("name") == "user"]
    payer = users[0]["address"].lower()
    wei = count * int(query(rpc, "/params")["genesis"]["credits"]["price_wei"])
    deposit = planet(env, "balance", "deposit", f"{Decimal(wei) / 10**18:f}", "--credits",
                     timeout=300)  # fmt: skip
    assert deposit.returncode == 0, deposit.stderr[-3000:]
    file = Path(tempfile.mkdtemp(prefix="bench-credits-")) / "credits.json"
    sent_height, started = height(rpc), time.monotonic()
    bought = planet(env, "credits", "buy", str(count), "--json", "--credits-file", str(file),
                    timeout=600)  # fmt: skip
    seconds, done_height = time.monotonic() - started, height(rpc)
    assert bought.returncode == 0, bought.stderr[-3000:]
    assert json.loads(bought.stdout)["bought"] == count, bought.stdout
    mints = query(rpc, "/mints", payer=payer)["mints"]
    funded = max(m["funded_height"] for m in mints if isinstance(m.get("funded_height"), int))
    period = query(rpc, "/credit_period")
    return {
        "credit_mint_count": count,
        "credit_buy_s": round(seconds, 2),
        "credit_buy_blocks": done_height - sent_height,
        "credit_spendable_blocks": done_height - funded,
        "credit_anonymity_set": period["buyers"],
    }


def fail(message: str, hint: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    print(f"hint: {hint}", file=sys.stderr)
    raise SystemExit(2)


def attached(args: argparse.Namespace) -> dict[str, Any]:
    """Metrics of the devnet already running in args.devnet, left as it was (module docstring)."""
    from node.config import DEVNET_ENV, DEVNET_STATE, find_devnet
    from protocol.errors import ConfigError

    directory = args.devnet.expanduser().resolve()
    hint = "give the state directory of a running devnet ($PLANET_HOME/devnet), or no --devnet"
    try:
        running = find_devnet({DEVNET_ENV: str(directory)})
    except ConfigError as error:
        missing = not (directory / DEVNET_STATE).exists()
        message = f"no {DEVNET_STATE} in {directory}" if missing else error.message
        fail(f"--devnet: {message}", hint if missing else error.hint or hint)
    if running is None:
        fail(f"--devnet: the devnet in {directory} is not up", hint)
    state = json.loads((directory / DEVNET_STATE).read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_")}
    env.update({DEVNET_ENV: str(directory), "NO_COLOR": "1"})
    metrics = startup_metrics(state)
    metrics["devnet_up_wall_s"] = None  # started by someone else
    metrics.update(read_only_metrics(env, state))
    metrics["unstake_to_unroutable_s"] = None  # not run on a devnet others use
    metrics["leave_command_s"] = None
    args.validators = len(running.committee_rpc)
    args.nodes = len(state["operators"]) - len(state.get("seats", []))  # the first model's
    metrics["gateway_started"] = bool(running.gateway_url)
    return metrics


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--no-gateway", action="store_true")
    parser.add_argument(
        "--credits", type=int, default=100, help="credits the user buys in one mint (100)"
    )
    parser.add_argument(
        "--devnet",
        type=Path,
        metavar="DIR",
        help="measure the devnet already running in DIR (its state directory) without changing "
        "it, instead of starting one",
    )
    args = parse_with_quick(parser, {"validators": 1, "nodes": 3, "no_gateway": True, "credits": 4})
    metrics = attached(args) if args.devnet is not None else standalone(args)
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
                    "devnet": "attached: " + str(args.devnet) if args.devnet else "started",
                },
                "metrics": metrics,
                "targets": {
                    "devnet_up_s": {"op": "<=", "value": 180},
                    "credit_spendable_blocks": {"op": "<=", "value": 2},
                },
            }
        )
    )
    return 0


def standalone(args: argparse.Namespace) -> dict[str, Any]:
    """Start a devnet in a temporary home, measure it (module docstring), take it down."""
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
        metrics.update(startup_metrics(state))
        metrics["gateway_started"] = bool(state.get("gateway_url"))
        metrics["devnet_up_wall_s"] = round(wall, 1)
        metrics.update(read_only_metrics(env, state))
        metrics.update(credit_metrics(env, state, args.credits))
        rpc = state["committee_rpc"][0]
        operators = state["operators"]
        key = json.loads((Path(operators[0]) / "run" / "joined.json").read_text())["node_key"]
        unstake = planet(env, "unstake", "--home", operators[0],
                         "--password-file", state["password_file"], timeout=120)  # fmt: skip
        assert unstake.returncode == 0, unstake.stderr
        metrics["unstake_to_unroutable_s"] = seconds_until(
            lambda: not query(rpc, "/node", key=key)["routable"]
        )
        home1 = operators[-1 - len(state.get("seats", []))]  # a node of the first model
        key1 = json.loads((Path(home1) / "run" / "joined.json").read_text())["node_key"]
        started = time.monotonic()
        leave = planet(env, "leave", "--home", home1,
                       "--password-file", state["password_file"], timeout=120)  # fmt: skip
        assert leave.returncode == 0, leave.stderr
        assert query(rpc, "/node", key=key1)["status"] == "LEFT"
        metrics["leave_command_s"] = round(time.monotonic() - started, 2)
    finally:
        planet(env, "devnet", "down", timeout=300)
    return metrics


if __name__ == "__main__":
    sys.exit(main())
