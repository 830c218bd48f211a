"""The e2e tests' shared devnet: one `planet devnet up --detach` per test run, driven by the CLI.

tests/e2e/conftest.py brings it up once for the session (`shared_devnet`) and hands each test
its own funded user wallet (`fresh_user`) and, for scenarios that stake, join, unstake or
leave, its own operator home (`new_operator`), so that no test depends on what another did.
The devnet runs with no verifiers (the tests sharing it settle by hand) and a short epoch.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.committee_reads import nodes_of
from node.procs import run_captured
from node.server.launcher import pid_alive

UP_TIMEOUT_S = 900
# committee blocks per settlement epoch: half the devnet's default (20, about 10 s), so the
# scenarios that wait for an epoch's roots wait half as long; the gateway reports and the
# nodes redeem within a few blocks, and a charge that misses its epoch lands in the next.
SHARED_EPOCH_LENGTH = 10
VERIFIERS_VARIABLE = "PLANET_E2E_VERIFIERS"
FUND_ETH = "10"
STAKE_ETH = "1"
# questions asked until a new node is in a paid circuit (the gateway's router picks among each
# shard's near-cheapest nodes at random: a node it has not used yet serves within a few)
QUESTIONS = (
    "Count to three.", "Name a fruit.", "Say yes.", "Name a month.", "Name a colour.",
    "Say hello.", "Name a planet.", "Count to two.", "Name a tree.", "Say no.",
)  # fmt: skip

T = TypeVar("T")


def shared_verifiers() -> int:
    """Verifiers of the shared devnet: none (the sharing tests settle by hand, and on a 2-core
    machine each verifier's own model copy slows the whole run), unless PLANET_E2E_VERIFIERS
    asks for some (`planet devnet up --verifiers N`), e.g. to check the tests with them on."""
    text = os.environ.get(VERIFIERS_VARIABLE, "0")
    if not text.isdigit() or int(text) > 4:
        raise ValueError(f"{VERIFIERS_VARIABLE} must be 0-4 (verifiers), got {text!r}")
    return int(text)


def planet(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`planet ARGS` in a process of its own (the CLI as a person runs it; forked by the
    session's zygote where it can, node.procs.run_captured)."""
    return run_captured(
        [sys.executable, "-m", "planet", *args],
        text=True,
        timeout=timeout,
        env=env,
    )


def query(rpc: str, path: str, **params: str) -> Any:
    """A committee ABCI query's JSON answer; None when the app answers with an error code."""
    full = path + ("?" + urllib.parse.urlencode(params) if params else "")
    url = f"{rpc}/abci_query?path=" + urllib.parse.quote(json.dumps(full))
    with urllib.request.urlopen(url, timeout=10) as answer:
        response = json.load(answer)["result"]["response"]
    if response.get("code", 0):
        return None
    return json.loads(base64.b64decode(response["value"]))


def nodes(rpc: str, **filters: str) -> list[dict[str, Any]]:
    """Every `/nodes` entry matching `filters`, each page followed (`read_nodes`, as the
    product reads it: `BadPage` / `TooManyPages` by name)."""
    return nodes_of(lambda path: query(rpc, path), **filters)


def wait(condition: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.5) -> T:
    """Poll `condition` until it returns something true (returned), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def joined_pids(home: Path) -> list[int]:
    """The node and agent pids an operator home's `planet join` recorded (none: not joined)."""
    joined = home / "run" / "joined.json"
    if not joined.is_file():
        return []
    record = json.loads(joined.read_text())
    return [int(record["node_pid"]), int(record["agent_pid"])]


def pids_alive(state: dict[str, Any], extra_homes: list[Path] = ()) -> list[int]:  # type: ignore[assignment]
    """Every pid the devnet recorded (anvil, gateway, validators, nodes) and the joined pids of
    `extra_homes` (the tests' own operators) that still run."""
    pids: list[int] = []
    for value in state.get("pids", {}).values():  # a pid, or a list of them (verifiers, …)
        pids += [p for p in (value if isinstance(value, list) else [value]) if p]
    run = Path(state["committee_dir"]) / "run"
    pids += [int(p.read_text()) for p in run.glob("*.pid")] if run.is_dir() else []
    for home in [*map(Path, state.get("operators", [])), *extra_homes]:
        pids += joined_pids(home)
    return [p for p in pids if pid_alive(p)]


def devnet_state(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(state_path(env).read_text())


def state_path(env: dict[str, str]) -> Path:
    """devnet.json: its folder is the devnet's state dir (`--devnet DIR` for tools)."""
    return Path(env["PLANET_HOME"]) / "devnet" / "devnet.json"


@dataclass(frozen=True)
class User:
    """A wallet of its own for one test, funded from anvil's dev account."""

    wallet: Path
    password_file: Path
    address: str
    key: Any  # eth_account's LocalAccount

    def pay_args(self) -> list[str]:
        """The `--wallet/--password-file` arguments of `planet ask`/`planet balance`."""
        return ["--wallet", str(self.wallet), "--password-file", str(self.password_file)]


def fund(env: dict[str, str], address: str, eth: str = FUND_ETH) -> None:
    funded = planet(env, "devnet", "fund", address, eth, "--json", timeout=60)
    assert funded.returncode == 0, funded.stderr[-2000:]
    assert int(json.loads(funded.stdout)["balance_wei"]) >= int(float(eth)) * 10**18


def new_user(env: dict[str, str], devnet: dict[str, Any], folder: Path) -> User:
    """A fresh wallet under `folder` (the devnet's password), funded via `planet devnet fund`.
    A dev keystore (`create_dev_wallet`: PBKDF2, as the devnet's own accounts): a scrypt one
    cost ~1 CPU-s to make and ~0.7 CPU-s in every `planet` command that opens it."""
    from node.keys import create_dev_wallet

    password_file = Path(devnet["password_file"])
    account = create_dev_wallet(folder / "wallet.json", password_file.read_text())
    fund(env, account.address)
    return User(folder / "wallet.json", password_file, account.address, account)


@dataclass(frozen=True)
class Operator:
    """An operator home of one test's own: funded, staked and joined on the shared devnet."""

    home: Path
    env: dict[str, str]  # the devnet's env with this operator's PLANET_PASSWORD
    node_key: str


def operator_env(env: dict[str, str], home: Path) -> dict[str, str]:
    """The devnet's env with the operator home's own password (PLANET_PASSWORD)."""
    return {**env, "PLANET_PASSWORD": f"operator {home.name} pw"}


def join_operator(env: dict[str, str], home: Path, shard: int | str, model: str) -> Operator:
    """A new operator home: its wallet funded, staked as compute, and joined to `shard` (or
    "auto": the pool's weakest shard)."""
    from node.keys import create_dev_wallet

    own_env = operator_env(env, home)
    fund(env, create_dev_wallet(home / "wallet.json", own_env["PLANET_PASSWORD"]).address)
    staked = planet(own_env, "stake", "--role", "compute", "--amount", STAKE_ETH,
                    "--home", str(home))  # fmt: skip
    assert staked.returncode == 0, staked.stderr[-2000:]
    joined = planet(own_env, "join", "--model", model, "--shard", str(shard),
                    "--home", str(home), timeout=300)  # fmt: skip
    assert joined.returncode == 0, joined.stderr[-2000:]
    key = json.loads((home / "run" / "joined.json").read_text())["node_key"]
    return Operator(home, own_env, key)


def release_operator(own_env: dict[str, str], home: Path) -> None:
    """Leave (if still joined) and make sure the home's node and agent have stopped."""
    if any(pid_alive(p) for p in joined_pids(home)):
        planet(own_env, "leave", "--now", "--home", str(home), timeout=90)
    for pid in joined_pids(home):
        if pid_alive(pid):  # `leave` failed: stop what it left running
            os.kill(pid, signal.SIGTERM)
            try:
                wait(lambda pid=pid: not pid_alive(pid), 15, f"pid {pid} to stop", 0.2)
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
