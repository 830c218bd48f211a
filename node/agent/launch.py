"""What `planet join` / `planet leave` run on the operator's machine: the shard check, and the
compute node + agent background processes with their pid and log files.

Files in `<home>/run/`: `node-<K>.log|.pid` (the compute node, `node.server.launcher`),
`agent.log|.pid`, and `joined.json` `{shard, port, endpoint, model, manifest, node_pid, agent_pid,
node_key}` — what `planet leave` and `planet status` read (a rebalancing agent rewrites it when
the node moves to another shard); `node_launch.json`: how the compute node was started, for
the agent to start another shard's node the same way (node/agent/node_host.py); `served/`: the
node's served-work spool (`--commit-dir`), from which the agent commits and reveals
(`node.agent.commitments`). A multi-model node (`planet join --memory-budget-mb`): the compute
node is `planet node host` (`node-host.log`) over `seats.json` and its status file
(node/server/seats.py); a home joined `--into` another names that home's seats file in its
`joined.json` (`seats`) and its node is one seat there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from node.agent.__main__ import AGENT_MARKER
from node.agent.credit_spools import shard_spool
from node.agent.node_host import NodeLaunch, write_launch
from node.keys import PASSWORD_ENV
from node.model.manifest import Manifest, manifest_path, verify_file
from node.procs import command_line, runs_another_program, spawn_logged
from node.server.launcher import pid_alive, start_host, start_node, stop_pid
from node.server.next_hops import is_ip_literal, is_public_address, url_host
from node.server.seats import (
    SeatSpec,
    add_seat,
    host_pid,
    read_seats,
    reload_host,
    remove_seat,
    serving_entry,
    wait_pass,
    write_json,
)
from protocol.errors import (
    ConfigError,
    IntegrityError,
    PlanetError,
    UnavailableError,
    UsageError,
)
from protocol.urls import canonical_url

JOINED_FILE = "joined.json"
SEATS_FILE = "seats.json"  # a multi-model node's seats (node/server/seats.py)
HOST_START_S = 180.0  # a host's first pass (imports, the shard's load) or a seat's add
SERVED_DIR = "served"  # the node's served-work spool, read by the agent (commit-reveal)
CREDITS_DIR = "credits"  # credits the node was paid with, until the agent redeems them
AGENT_LOG = "agent.log"
_HASH_PREFIX = "sha256:"


class ShardHashMismatch(IntegrityError):
    """The local shard's manifest hash differs from the one registered on chain."""

    code = "shard_hash_mismatch"

    def __init__(self, shard: int, local: str, registered: str) -> None:
        super().__init__(
            f"shard {shard}: the local manifest says {local}, the ModelRegistry on chain says "
            f"{registered}",
            hint="the local model directory is not the registered model; prepare the model "
            "with the same --parts/--quant as the network, or fetch it again",
        )


def model_id_bytes(model_hash: str) -> bytes:
    """The on-chain model id (and manifest hash): the 32 raw bytes of `sha256:<hex>`."""
    if not model_hash.startswith(_HASH_PREFIX) or len(model_hash) != len(_HASH_PREFIX) + 64:
        raise ConfigError(f"not a model hash: {model_hash!r}")
    return bytes.fromhex(model_hash[len(_HASH_PREFIX) :])


def resolve_manifest(model: str, models_dir: Path) -> Path:
    """A manifest path from `--model`: a manifest file or model directory, else a prepared model
    under `models_dir` whose model hash, directory name or model id is `model`."""
    direct = manifest_path(model)
    if direct.is_file():
        return direct.resolve()
    matches = []
    for candidate in sorted(models_dir.glob("*/manifest.json")):
        try:
            manifest = Manifest.load(candidate)
        except PlanetError:  # a broken directory in the cache is not this model
            continue
        if model in (manifest.model_hash, candidate.parent.name, manifest.model_id):
            matches.append(candidate.resolve())
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(
            f"no prepared model {model!r} (not a manifest path, and nothing in {models_dir})",
            hint="pass the manifest path, or prepare it: `planet model prepare --parts 3`",
        )
    raise UsageError(
        f"--model {model!r} matches {len(matches)} prepared models",
        hint="pass the manifest path or the model hash: "
        + ", ".join(str(m.parent) for m in matches),
    )


def check_shard(manifest_file: Path, shard: int, registered: list[bytes]) -> Manifest:
    """Check shard `shard` of a local model against the registry's shard hashes, then its file
    bytes against the manifest. Raises UsageError / ShardHashMismatch / IntegrityError."""
    manifest = check_registered(manifest_file, shard, registered)
    verify_file(manifest_file.parent / manifest.shard(shard).file, manifest.shard(shard).hash)
    return manifest


def check_registered(manifest_file: Path, shard: int, registered: list[bytes]) -> Manifest:
    """Check shard `shard` of a local manifest against the registry's shard hashes (the file
    itself may still be missing: `planet join` then fetches it from peers)."""
    manifest = Manifest.load(manifest_file)
    if not registered:
        raise UsageError(
            f"model {manifest.model_hash} is not registered in the ModelRegistry on chain",
            hint="join a model the network serves (`planet devnet status` shows it)",
        )
    if not 0 <= shard < len(manifest.shards):
        raise UsageError(f"--shard {shard}: the model has shards 0..{len(manifest.shards) - 1}")
    if len(registered) != len(manifest.shards):
        raise ShardHashMismatch(
            shard, f"{len(manifest.shards)} shards", f"{len(registered)} shards"
        )
    entry = manifest.shard(shard)
    local = model_id_bytes(entry.hash)
    if local != registered[shard]:
        raise ShardHashMismatch(shard, entry.hash, _HASH_PREFIX + registered[shard].hex())
    return manifest


@dataclass(frozen=True)
class Joined:
    shard: int
    port: int
    endpoint: str
    model: str
    manifest: str
    node_pid: int
    agent_pid: int
    node_key: str
    node_log: str
    agent_log: str
    seats: str = ""  # a seat of a multi-model node: its seats file (node/server/host.py)
    last: int | None = None  # a span's last shard (`planet join --shards N`): shard … last

    @property
    def pid_name(self) -> str:
        """The node's pid file name in the run dir (node/server/launcher.py `start_node`)."""
        return (
            f"node-{self.shard}.pid" if self.last is None else f"node-{self.shard}-{self.last}.pid"
        )


def read_joined(run_dir: Path) -> Joined | None:
    try:
        return Joined(**json.loads((run_dir / JOINED_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_agent(pid: int) -> bool:
    """True if `pid` runs the agent (strict: a process still in its `exec` is not)."""
    return AGENT_MARKER.encode() in (command_line(pid) or [])


def agent_exited(pid: int) -> bool:
    """True once the agent we just spawned as `pid` is gone: dead, or its pid runs another
    program. A child still in its `exec` (empty command line) has not exited."""
    return not pid_alive(pid) or runs_another_program(pid, AGENT_MARKER)


def agent_alive(joined: Joined) -> bool:
    return pid_alive(joined.agent_pid) and is_agent(joined.agent_pid)


def _ticket_args(committee_rpcs: list[str]) -> list[str]:
    """Spot-check tickets: the node signs them with the operator's node key (which it also
    serves TLS with) and checks the requests against the committee (the agent's first RPC).
    None without a committee."""
    if not committee_rpcs:
        return []
    return ["--committee-rpc", committee_rpcs[0]]


def _next_hop_args(
    committee_rpcs: list[str], endpoint: str, private_range: str | None = None
) -> list[str]:
    """The chain's next hops: only compute nodes the committee lists as routable for this
    model and the next shard (node/server/next_hops.py; the node asks `--committee-rpc`).
    A node whose own endpoint is not a public address serves a private network (a devnet, a
    LAN), where its next hops are private too: it may dial private addresses — only those in
    `private_range` when one is given (the devnet's); a node at a public address dials public
    addresses only."""
    if not committee_rpcs:
        return []
    own_host = url_host(canonical_url(endpoint))
    if not is_ip_literal(own_host) or is_public_address(own_host):
        return ["--next-hops", "committee"]
    private = ["--private-next-hops", *([private_range] if private_range else [])]
    return ["--next-hops", "committee", *private]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _credit_args(positions: int, run_dir: Path, shard: int) -> list[str]:
    """The compute node's price and its credit spool: one per shard (credit_spools.py)."""
    if not positions:
        return []
    spool = shard_spool(run_dir / CREDITS_DIR, shard)
    return ["--credit-positions", str(positions), "--credits-dir", str(spool)]


def start_node_and_agent(
    *,
    home: Path,
    manifest_file: Path,
    manifest: Manifest,
    shard: int,
    port: int,
    capacity: int,
    committee_rpcs: list[str],
    password: str,
    node_key: str,
    host: str = "127.0.0.1",
    private_range: str | None = None,
    credit_positions: int = 0,
    rebalance: bool = False,
    origin: str | None = None,
    memory_budget_mb: int | None = None,
    into: Path | None = None,
    rendezvous: Sequence[FrontedBy] = (),
    last: int | None = None,
) -> Joined:
    """Spawn the compute node (bound to `host`:`port`, registered at that address) and the
    agent, detached; returns at once. `private_range`: see `_next_hop_args`.
    `credit_positions` > 0: the node computes only what clients pay for with credits, that many
    positions each; they are spooled to `<home>/run/credits` and the agent redeems them. The
    agent registers `credit_positions` as the node's price on the committee chain (0: free),
    the price clients read and redemptions are held to (abci_app/prices.py). `rebalance`: the
    agent may move the node to another shard (node/agent/mover.py), starting the new shard's
    node as this one was (`node_launch.json`), fetching a shard file it lacks from the nodes
    serving it, else from `origin` (`planet join --origin`, kept in that file).
    `memory_budget_mb`: the compute node is a multi-model host (`planet node host`, its seats
    file `<home>/run/seats.json`) with this one seat; `into`: the seats file of another home's
    running host, which takes this node as one more seat (`planet join --into`).
    `rendezvous`: the node is behind NAT: it links to these relays (`--rendezvous`) and is
    registered at its address on the first of them, with all of them named. `last`: the node
    serves shards `shard` … `last` as one hop (a span: `--shards`), registered and priced on
    each of them, its credits spooled per shard; never rebalanced, not a seat (`planet join`
    checks)."""
    if last is not None and (rebalance or memory_budget_mb or into):
        raise ValueError("a span is started without rebalancing, outside a host")
    run_dir = home / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    launch = NodeLaunch(
        manifest=manifest_file,
        host=host,
        extra_args=(
            "--max-sessions",
            str(capacity),
            "--commit-dir",
            str(run_dir / SERVED_DIR),
            *_ticket_args(committee_rpcs),
            *_next_hop_args(committee_rpcs, f"https://{_url_host(host)}:{port}", private_range),
            *_credit_args(credit_positions, run_dir, shard),
            *[arg for r in rendezvous for arg in ("--rendezvous", r.relay_url, r.relay_x25519)],
        ),
        node_key=home / "node_key.json",  # TLS bound to the registered key: https:// endpoint
        origin=origin,
    )
    write_launch(run_dir, launch)
    if memory_budget_mb is None and into is None:
        node = start_node(
            manifest=manifest_file,
            shard=shard,
            last=last,
            port=port,
            host=host,
            run_dir=run_dir,
            extra_args=list(launch.extra_args),
            extra_env={PASSWORD_ENV: password},
            node_key=launch.node_key,
        )
        node_pid, node_url, node_log, seats = node.pid, node.url, node.log_path, ""
    else:
        seat = seat_of(launch, shard, port)
        node_pid, node_log, seats_file = start_seat(run_dir, seat, password, memory_budget_mb, into)
        node_url, seats = f"https://{_url_host(host)}:{port}", str(seats_file)
    if rendezvous:
        node_url = rendezvous[0].endpoint  # where clients and previous hops dial it
    argv = [
        sys.executable, "-m", AGENT_MARKER,
        "--home", str(home),
        "--manifest", str(manifest_file),
        *(["--shard", str(shard)] if last is None else ["--shards", f"{shard}-{last}"]),
        "--endpoint", node_url,
        "--capacity", str(capacity),
        "--commit-dir", str(run_dir / SERVED_DIR),
    ]  # fmt: skip
    for url in committee_rpcs:
        argv += ["--committee-rpc", url]
    argv += ["--credit-positions", str(credit_positions)]  # the price it registers (0: free)
    if credit_positions:
        argv += ["--credits-dir", str(run_dir / CREDITS_DIR)]
    for r in rendezvous:
        argv += ["--rendezvous", r.relay_key, r.endpoint]
    if rebalance and not rendezvous:  # a move would need a new port at the relay: not yet
        argv += ["--rebalance", *_rebalance_tuning()]
    agent_log = run_dir / AGENT_LOG
    agent = spawn_logged(argv, agent_log, env={**os.environ, "PLANET_PASSWORD": password})
    joined = Joined(
        shard=shard,
        port=port,
        endpoint=node_url,
        model=manifest.model_hash,
        manifest=str(manifest_file),
        node_pid=node_pid,
        agent_pid=agent.pid,
        node_key=node_key,
        node_log=str(node_log),
        agent_log=str(agent_log),
        seats=seats,
        last=last,
    )
    (run_dir / "agent.pid").write_text(f"{agent.pid}\n")
    (run_dir / JOINED_FILE).write_text(json.dumps(asdict(joined), indent=1) + "\n")
    return joined


@dataclass(frozen=True)
class FrontedBy:
    """A relay fronting a node behind NAT: its URL and X25519 key (the node's link), its
    committee key and the node's address there (the registration)."""

    relay_url: str
    relay_x25519: str
    relay_key: str
    endpoint: str


def seat_of(launch: NodeLaunch, shard: int, port: int) -> SeatSpec:
    """The seat a multi-model host serves for this node: `planet node serve`'s arguments, as
    `start_node` passes them."""
    return SeatSpec(
        (
            "--manifest", str(launch.manifest), "--shard", str(shard), "--port", str(port),
            "--host", launch.host, "--node-key", str(launch.node_key), *launch.extra_args,
        )
    )  # fmt: skip


def start_seat(
    run_dir: Path, seat: SeatSpec, password: str, budget_mb: int | None, into: Path | None
) -> tuple[int, Path, Path]:
    """Serve `seat` in a multi-model host: a new one of this home (`budget_mb`) or the running
    one whose seats file is `into`. Returns (the host's pid, its log, the seats file) once the
    seat serves; SeatRefused (by name: the memory budget, a bad shard, a taken port) or
    UnavailableError otherwise (a host started here is stopped again)."""
    if into is not None:
        add_seat(into, seat, HOST_START_S)
        pid = host_pid(into)
        assert pid is not None  # add_seat found it
        return pid, into.parent / "node-host.log", into
    run_dir.mkdir(parents=True, exist_ok=True)
    seats = run_dir / SEATS_FILE
    write_json(seats, {"seats": [seat.to_json()]})
    pid, log = start_host(
        seats=seats, budget_mb=budget_mb or 0, run_dir=run_dir, extra_env={PASSWORD_ENV: password}
    )
    status = wait_pass(seats, 0, HOST_START_S)
    try:
        if status is None:
            raise UnavailableError(
                f"the node host did not start in {HOST_START_S:.0f} s", hint=f"see {log}"
            )
        serving_entry(status, seat.port() or 0)
    except PlanetError:
        stop_pid(pid, 5.0)
        raise
    return pid, log, seats


def leave_seat(seats: Path, port: int, pid: int) -> bool:
    """Take this node's seat out of its host: out of the seats file, then the host signalled
    (it stops the seat and keeps serving the others, whichever home they belong to); a host
    left with no seat stops. Whether the seat was running."""
    running = pid_alive(pid)
    try:
        remove_seat(seats, port)
        left = read_seats(seats)
    except PlanetError:
        left = []
    if not running:
        return False
    if not left:
        return stop_pid(pid, 5.0)
    with contextlib.suppress(PlanetError):
        reload_host(seats, pid, 30.0)
    return True


def _rebalance_tuning() -> list[str]:
    """`PLANET_REBALANCE_ARGS`: extra agent flags (`--rebalance-cooldown-s 30 …`), for tests and
    benches that cannot wait the defaults; only the agent's `--rebalance-*` flags pass."""
    words = os.environ.get("PLANET_REBALANCE_ARGS", "").split()
    flags = {"--rebalance-every", "--rebalance-cooldown-s", "--rebalance-jitter-s"}
    flags.add("--rebalance-drain-s")
    if len(words) % 2 or any(flag not in flags for flag in words[::2]):
        raise UsageError(
            f"PLANET_REBALANCE_ARGS={' '.join(words)!r}: expected pairs of "
            f"{', '.join(sorted(flags))} and a value"
        )
    return words


def stop_agent(pid: int, grace_s: float = 25.0) -> bool:
    """SIGTERM the agent (it sends `leave` first), wait, SIGKILL after `grace_s`."""
    if not (pid_alive(pid) and is_agent(pid)):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def stop_joined(run_dir: Path, *, node: bool = True) -> dict[str, Any]:
    """Stop agent (leave) then node; remove joined.json. What was stopped. With `node=False`
    only the agent stops: the node keeps answering (spot-check tickets of its last work) until
    `stop_joined` is called again."""
    joined = read_joined(run_dir)
    if joined is None:
        return {"agent": False, "node": False}
    stopped = {"agent": stop_agent(joined.agent_pid), "node": False}
    if not node:
        return stopped
    if joined.seats:
        stopped["node"] = leave_seat(Path(joined.seats), joined.port, joined.node_pid)
    else:
        stopped["node"] = stop_pid(joined.node_pid, 5.0)
    for name in (JOINED_FILE, "agent.pid", joined.pid_name):
        (run_dir / name).unlink(missing_ok=True)
    return stopped
