"""Stake watchers: one `python -m node.watcher` per validator, signing with its consensus key."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from deploy.committee.network import Network, Validator
from deploy.committee.processes import ProcessDiedError, pid_alive, read_pid, spawn, split_name


def watcher_command(
    network: Network, validator: Validator, *, deployment: Path, evm_rpc: str
) -> list[str]:
    """The stake watcher of `validator`; it falls back to the other validators' RPCs."""
    others = [v for v in network.validators if v.index != validator.index]
    argv = [
        sys.executable, "-m", "node.watcher",
        "--home", validator.home,
        "--deployment", str(deployment),
        "--evm-rpc", evm_rpc,
    ]  # fmt: skip
    for peer in [validator, *others]:
        argv += ["--committee-rpc", peer.rpc_url]
    return argv


def start_watchers(
    network: Network,
    *,
    deployment: Path,
    evm_rpc: str,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, int]:
    """Start a stake watcher for every validator that has none running; {name: pid}."""
    started: dict[str, int] = {}
    for validator in network.validators:
        if read_pid(network, "watcher", validator.index) is not None:
            continue
        argv = watcher_command(network, validator, deployment=deployment, evm_rpc=evm_rpc)
        started[f"watcher{validator.index}"] = spawn(network, "watcher", validator.index, argv)
    time.sleep(0.5)
    for name, pid in started.items():
        if not pid_alive(pid):
            raise ProcessDiedError(name, network.log_path(*split_name(name)))
    progress(f"stake watchers started: {', '.join(started) or 'all were running'}")
    return started
