"""Start and stop shard node processes on loopback (`planet local`, integration tests, bench).

Each node is a separate detached process (`python -m planet node serve ...`, or a test
entry point that takes the same arguments) with its log and pid file in a run directory. With a
node key file it serves TLS bound to that key (its url is https://, `key` the public half to
pin); without one it runs in local mode, `--plaintext-links` (http://, loopback only).
`wait_healthy` polls `/health` and checks that the answer came from the node's own process; on
failure it names the node and its log. `stop_pid` sends SIGTERM, then SIGKILL after a grace
period, and only ever signals a pid whose command line is a Planet node (pids get reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from node.keys import node_public_key
from node.links import probe_context
from node.net import port_is_free
from node.procs import command_line, listens_on, spawn_logged
from protocol.errors import UnavailableError

NODE_MARKER = "planet"


@dataclass(frozen=True, slots=True)
class NodeProcess:
    shard: int
    port: int
    pid: int
    log_path: Path
    pid_path: Path
    module: str = NODE_MARKER  # what runs as `python -m MODULE`: the planet CLI or a test double
    host: str = "127.0.0.1"  # the address it binds (and is reached at)
    key: str | None = None  # its node key (64 hex) when it serves TLS; None: plaintext (local)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'http' if self.key is None else 'https'}://{host}:{self.port}"


def free_ports(count: int, start: int, end: int) -> list[int]:
    """`count` ports in [start, end) that are free to bind right now, lowest first."""
    ports = [p for p in range(start, end) if port_is_free(p)][:count]
    if len(ports) < count:
        raise UnavailableError(
            f"only {len(ports)} free ports in {start}-{end - 1}, need {count}",
            hint="stop other nodes (`planet local down`) or pick another --base-port",
        )
    return ports


def random_free_port(start: int, end: int) -> int:
    """A port in [start, end) free to bind right now, drawn at random: two commands choosing
    at once (operators joining side by side on one host) rarely draw the same one, where
    "lowest first" gives both the same port."""
    candidates = list(range(start, end))
    random.SystemRandom().shuffle(candidates)
    for port in candidates:
        if port_is_free(port):
            return port
    raise UnavailableError(
        f"no free port in {start}-{end - 1}", hint="pass --port, or stop other nodes"
    )


def node_env() -> dict[str, str]:
    """Environment for node processes: idle OpenMP threads sleep instead of spinning, so nodes
    sharing cores do not steal time from the one that is computing."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def start_node(
    *,
    manifest: Path,
    shard: int,
    port: int,
    run_dir: Path,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    module: str = NODE_MARKER,
    host: str = "127.0.0.1",
    node_key: Path | None = None,
    last: int | None = None,
) -> NodeProcess:
    """Spawn one detached node process bound to `host`:`port`; returns at once (see
    wait_healthy). `extra_env` is added to the node's environment. `module` runs as
    `python -m MODULE -v node serve ...`: the planet CLI, or a test entry point taking the same
    arguments (stop it with `stop_pid(pid, module=node.module)`). `node_key`: a node_key.json
    (its password in `extra_env`'s PLANET_PASSWORD) → TLS bound to it; None →
    `--plaintext-links`. `last`: serve shards `shard` … `last` as one hop (`--shards`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = str(shard) if last is None else f"{shard}-{last}"
    log_path = run_dir / f"node-{name}.log"
    pid_path = run_dir / f"node-{name}.pid"
    cmd = [
        sys.executable,
        "-m",
        module,
        "-v",
        "node",
        "serve",
        "--manifest",
        str(manifest),
        *(["--shard", str(shard)] if last is None else ["--shards", name]),
        "--port",
        str(port),
        "--host",
        host,
        *(["--plaintext-links"] if node_key is None else ["--node-key", str(node_key)]),
        *extra_args,
    ]
    key = None if node_key is None else node_public_key(node_key)
    proc = spawn_logged(cmd, log_path, env={**node_env(), **(extra_env or {})})
    pid_path.write_text(json.dumps({"pid": proc.pid, "port": port, "shard": shard}))
    return NodeProcess(
        shard=shard,
        port=port,
        pid=proc.pid,
        log_path=log_path,
        pid_path=pid_path,
        module=module,
        host=host,
        key=key,
    )


def start_host(
    *, seats: Path, budget_mb: int, run_dir: Path, extra_env: Mapping[str, str] | None = None
) -> tuple[int, Path]:
    """Spawn a detached `planet node host` over the seats file `seats` (node/server/host.py);
    returns (its pid, its log) at once (`node.server.seats.wait_pass` waits for its first
    pass)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "node-host.log"
    cmd = [
        sys.executable, "-m", NODE_MARKER, "-v", "node", "host",
        "--seats", str(seats), "--memory-budget-mb", str(budget_mb),
    ]  # fmt: skip
    proc = spawn_logged(cmd, log_path, env={**node_env(), **(extra_env or {})})
    return proc.pid, log_path


def pid_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def is_planet_node(pid: int, module: str = NODE_MARKER) -> bool:
    """True if `pid`'s command line is a node that `start_node(module=module)` or `start_host`
    started."""
    cmdline = command_line(pid) or []
    return module.encode() in cmdline and (b"serve" in cmdline or b"host" in cmdline)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_pid(pid: int, grace_s: float = 10.0, *, module: str = NODE_MARKER) -> bool:
    """SIGTERM, wait up to `grace_s`, then SIGKILL. False if it was not a running Planet node
    (of `module`, see start_node)."""
    if not pid_alive(pid) or not is_planet_node(pid, module):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        _reap(pid)
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    return True


def _healthy(url: str) -> bool:
    """A liveness probe of a node this process started (TLS unauthenticated: nothing secret
    is sent and only the status is believed)."""
    context = probe_context() if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0, context=context) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def wait_healthy(
    nodes: Sequence[NodeProcess],
    *,
    timeout_s: float = 120.0,
    on_ready: Callable[[NodeProcess, float], None] | None = None,
) -> None:
    """Poll each node's /health until all answer; raise UnavailableError naming the first
    node that exited or did not answer in time (with its log path and last log lines)."""
    t0 = time.monotonic()
    pending = list(nodes)
    while pending:
        for node in list(pending):
            # its own answer: a port it failed to bind may be answered by another program
            if _healthy(node.url) and listens_on(node.pid, node.port) is not False:
                pending.remove(node)
                if on_ready:
                    on_ready(node, time.monotonic() - t0)
            elif not pid_alive(node.pid):
                _reap(node.pid)
                raise UnavailableError(
                    f"node for shard {node.shard} (pid {node.pid}, port {node.port}) exited "
                    f"during start-up; log: {node.log_path}\n{_log_tail(node.log_path)}",
                    hint=f"read {node.log_path}",
                )
        if pending and time.monotonic() - t0 > timeout_s:
            node = pending[0]
            raise UnavailableError(
                f"node for shard {node.shard} (port {node.port}) not healthy after "
                f"{timeout_s:.0f} s; log: {node.log_path}",
                hint=f"read {node.log_path}",
            )
        if pending:
            time.sleep(0.2)
