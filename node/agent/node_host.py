"""The compute node processes of one operator home, for the agent's moves (mover.py `NodeHost`).

`planet join` writes `<home>/run/node_launch.json` next to `joined.json`: how it started the
compute node (manifest, bound host, the arguments after `--shard/--port`, the node key file).
A move starts a second process the same way for the new shard (with its own credit spool,
`<credits dir>/shard-K`: credit_spools.py) on a free port (one of the ports
a devnet host exposes inside `planet devnet exec`, else 18100-18999), then adopts it: joined.json
names its shard, port, endpoint and pid, so `planet leave` and `planet status` see the node
that is registered; the old process is stopped once drained.

The launch file is this machine's own file, written by `planet join`; it is parsed into
`NodeLaunch` or refused (`BadLaunchFile`) all the same.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from node.agent.credit_spools import shard_spool, spool_base
from node.agent.mover import Replacement
from node.agent.shard_fetch import ServingList, fetch_for_move
from node.config import devnet_ports
from node.keys import PASSWORD_ENV
from node.links import link_ssl
from node.model.manifest import Manifest
from node.net import port_is_free
from node.server.launcher import NodeProcess, random_free_port, start_node, stop_pid
from protocol.errors import ConfigError, PlanetError

LAUNCH_FILE = "node_launch.json"
JOINED_FILE = "joined.json"
PORTS = (18100, 18999)


class BadLaunchFile(ConfigError):
    code = "bad_node_launch_file"

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(
            f"{path}: {what}", hint="join again (`planet leave`, then `planet join`) to rewrite it"
        )


@dataclass(frozen=True, slots=True)
class NodeLaunch:
    manifest: Path
    host: str
    extra_args: tuple[str, ...]
    node_key: Path
    origin: str | None = None  # `planet join --origin`: where a move fetches a shard no node serves

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "manifest": str(self.manifest),
            "host": self.host,
            "extra_args": list(self.extra_args),
            "node_key": str(self.node_key),
        }
        if self.origin is not None:
            doc["origin"] = self.origin
        return doc


def write_launch(run_dir: Path, launch: NodeLaunch) -> None:
    (run_dir / LAUNCH_FILE).write_text(json.dumps(launch.to_json(), indent=1) + "\n")


def read_launch(run_dir: Path) -> NodeLaunch:
    path = run_dir / LAUNCH_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BadLaunchFile(path, f"not readable JSON ({error})") from None
    required = {"manifest", "host", "extra_args", "node_key"}
    if not isinstance(doc, dict) or not required <= set(doc) <= {*required, "origin"}:
        raise BadLaunchFile(path, "expected manifest, host, extra_args, node_key (and origin)")
    texts = [doc["manifest"], doc["host"], doc["node_key"], doc.get("origin", "-")]
    args = doc["extra_args"]
    if not all(isinstance(t, str) and t for t in texts) or not (
        isinstance(args, list) and all(isinstance(a, str) for a in args)
    ):
        raise BadLaunchFile(path, "expected non-empty strings and a list of strings")
    return NodeLaunch(
        Path(doc["manifest"]), doc["host"], tuple(args), Path(doc["node_key"]), doc.get("origin")
    )


class ProcessHost:
    """`NodeHost` over real processes (node.server.launcher), one operator home's `run/`;
    `link`: the committee (`nodes`), asked which nodes serve a shard a move must fetch."""

    def __init__(
        self, run_dir: Path, launch: NodeLaunch, signer: str, password: str, link: ServingList
    ) -> None:
        self.run_dir = run_dir
        self.launch = launch
        self.signer = signer
        self.password = password
        self.link = link
        self.manifest = Manifest.load(launch.manifest)

    def available(self, shard: int) -> bool:
        """The shard's file is on this machine (otherwise a move fetches it first)."""
        if not 0 <= shard < len(self.manifest.shards):
            return False
        return (self.launch.manifest.parent / self.manifest.shard(shard).file).is_file()

    def has_origin(self) -> bool:
        return self.launch.origin is not None

    async def fetch(self, shard: int) -> str:
        """Shard `shard`'s file beside the manifest, from the nodes serving it or the origin
        (shard_fetch.py); FetchFailed with the reason otherwise."""
        return await fetch_for_move(
            self.link, self.manifest, self.launch.manifest, shard, self.signer, self.launch.origin
        )

    def _port(self) -> int:
        for port in devnet_ports(os.environ):
            if port_is_free(port, self.launch.host):
                return port
        return random_free_port(*PORTS)

    async def start(self, shard: int) -> Replacement:
        node = await asyncio.to_thread(
            start_node,
            manifest=self.launch.manifest,
            shard=shard,
            port=self._port(),
            host=self.launch.host,
            run_dir=self.run_dir,
            extra_args=shard_args(self.launch.extra_args, shard),
            extra_env={PASSWORD_ENV: self.password},
            node_key=self.launch.node_key,
        )
        return Replacement(shard, node.url, node)

    async def healthy(self, replacement: Replacement) -> bool:
        return await probe(replacement.endpoint, self.signer, "/health") is not None

    async def live_sessions(self, old: Any) -> int | None:
        """Sessions the old process (`adopt`'s answer) still holds; None: it does not answer."""
        answer = await probe(str(old[2]), self.signer, "/info")
        sessions = answer.get("sessions") if isinstance(answer, dict) else None
        return sessions if type(sessions) is int and sessions >= 0 else None

    async def discard(self, replacement: Replacement) -> None:
        node: NodeProcess = replacement.handle
        await asyncio.to_thread(stop_pid, node.pid, 5.0)
        node.pid_path.unlink(missing_ok=True)

    async def adopt(self, replacement: Replacement) -> Any:
        """joined.json names the new process; returns the old one's (pid, shard, endpoint)."""
        node: NodeProcess = replacement.handle
        joined = self._joined()
        old = (joined.get("node_pid"), joined.get("shard"), joined.get("endpoint"))
        updated = {
            **joined,
            "shard": node.shard,
            "port": node.port,
            "endpoint": node.url,
            "node_pid": node.pid,
            "node_log": str(node.log_path),
        }
        path = self.run_dir / JOINED_FILE
        path.with_suffix(".tmp").write_text(json.dumps(updated, indent=1) + "\n")
        path.with_suffix(".tmp").replace(path)
        return old

    async def stop(self, old: Any) -> None:
        pid, shard, _ = old
        if type(pid) is int:
            await asyncio.to_thread(stop_pid, pid, 10.0)
        if type(shard) is int and shard != self._joined().get("shard"):
            (self.run_dir / f"node-{shard}.pid").unlink(missing_ok=True)

    def _joined(self) -> dict[str, Any]:
        try:
            doc = json.loads((self.run_dir / JOINED_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}


def shard_args(extra_args: tuple[str, ...], shard: int) -> list[str]:
    """The launch's arguments for a process serving `shard`: its own credit spool
    (credit_spools.py), so each credit is redeemed on the shard that earned it."""
    args = list(extra_args)
    for i, arg in enumerate(args[:-1]):
        if arg == "--credits-dir":
            args[i + 1] = str(shard_spool(spool_base(Path(args[i + 1])), shard))
    return args


async def probe(endpoint: str, signer: str, path: str) -> Any:
    """GET `endpoint + path` of this operator's own node (pinned to its key); the JSON answer,
    or None when it does not answer 200 within 2 s."""
    try:
        pin = link_ssl(endpoint, signer, plaintext_ok=True)
        async with (
            aiohttp.ClientSession() as session,
            asyncio.timeout(2.0),
            session.get(f"{endpoint}{path}", ssl=pin) as answer,
        ):
            return await answer.json() if answer.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, PlanetError):
        return None
