"""Compute nodes with replicas on loopback, for the failover tests and bench/resilience.py.

Real `planet node serve` processes (or a test double taking the same arguments: a slow node),
several per shard, each allowed to forward to every other one (`--next-hops` lists them all),
on ports fixed at start so a killed node comes back at the same URL. Nothing else: no chain,
no committee, no gateway; the client is `node.client.failover.generate` over
`node.client.replicas.ReplicaCircuits` in the caller's process (`answer`).

    net = ReplicaNet.start(run_dir, manifest, shards=[0, 0, 1, 1])
    tokens, timings = asyncio.run(net.answer(head, ids, max_new_tokens=24))
    net.kill(2); net.restart(2); net.freeze(1); net.thaw(1)
    net.close()

`close()` stops every process it started (also after a failure).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.gateway_net import ephemeral_port
from node.client.failover import FailoverPolicy, generate
from node.client.replicas import ReplicaCircuits
from node.client.sampling import SamplingConfig
from node.client.types import Hop, Timings
from node.model.manifest import Manifest, with_chunk_lists
from node.server.launcher import (
    NODE_MARKER,
    NodeProcess,
    pid_alive,
    start_node,
    stop_pid,
    wait_healthy,
)

SLOW_MODULE = "tests.doubles.slow_node"


def chunked_model(source: Path, directory: Path, *, shards: bool = True) -> Path:
    """A copy of the prepared model at `source` (a manifest) in `directory` whose manifest has
    chunk lists (nodes serve such shards to joining nodes); the files are symlinked, the shard
    files only if `shards`. Returns the new manifest's path."""
    directory.mkdir(parents=True)
    manifest = Manifest.load(source)
    shard_files = {s.file for s in manifest.shards}
    for path in source.parent.iterdir():
        if path.name != "manifest.json" and (shards or path.name not in shard_files):
            (directory / path.name).symlink_to(path.resolve())
    chunked = with_chunk_lists(manifest, source.parent)
    (directory / "manifest.json").write_text(json.dumps(chunked.to_json(), indent=1))
    return directory / "manifest.json"


@dataclass
class Replica:
    shard: int
    port: int
    run_dir: Path
    module: str = NODE_MARKER
    extra_args: tuple[str, ...] = ()
    process: NodeProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hop(self) -> Hop:
        return Hop(url=self.url, shard=self.shard)


@dataclass
class ReplicaNet:
    run_dir: Path
    manifest_path: Path
    replicas: list[Replica] = field(default_factory=list)
    frozen: set[int] = field(default_factory=set)

    @property
    def manifest(self) -> Manifest:
        return Manifest.load(self.manifest_path)

    @property
    def hops(self) -> list[Hop]:
        return [r.hop for r in self.replicas]

    @classmethod
    def start(
        cls,
        run_dir: Path,
        manifest: Path,
        shards: Sequence[int],
        *,
        slow: dict[int, float] | None = None,
        threads: int = 1,
        extra_args: Sequence[str] = (),
    ) -> ReplicaNet:
        """One node per entry of `shards`; `slow[i] = factor` makes node i a slow node;
        `extra_args` go to every node's `node serve`."""
        net = cls(run_dir, manifest)
        ports = [ephemeral_port() for _ in shards]
        urls = ",".join(f"http://127.0.0.1:{port}" for port in ports)
        for index, (shard, port) in enumerate(zip(shards, ports, strict=True)):
            factor = (slow or {}).get(index)
            net.replicas.append(
                Replica(
                    shard=shard,
                    port=port,
                    run_dir=run_dir / f"node-{index}",
                    module=SLOW_MODULE if factor else NODE_MARKER,
                    extra_args=(
                        *("--threads", str(threads)),
                        *("--next-hops", urls),
                        *extra_args,
                        *(("--slow-factor", f"{factor:g}") if factor else ()),
                    ),
                )
            )
        try:
            for index in range(len(net.replicas)):
                net._spawn(index)
            net.wait()
        except BaseException:
            net.close()
            raise
        return net

    def _spawn(self, index: int) -> None:
        replica = self.replicas[index]
        replica.process = start_node(
            manifest=self.manifest_path,
            shard=replica.shard,
            port=replica.port,
            run_dir=replica.run_dir,
            extra_args=replica.extra_args,
            module=replica.module,
        )

    def wait(self, indices: Sequence[int] | None = None, timeout_s: float = 240) -> None:
        chosen = range(len(self.replicas)) if indices is None else indices
        processes = [self.replicas[i].process for i in chosen]
        wait_healthy([p for p in processes if p is not None], timeout_s=timeout_s)

    # --- failures ---------------------------------------------------------------------------
    def index_of(self, url: str) -> int:
        return next(i for i, r in enumerate(self.replicas) if r.url == url)

    def _pid(self, index: int) -> int:
        process = self.replicas[index].process
        if process is None or not pid_alive(process.pid):
            raise RuntimeError(f"node {index} is not running")
        return process.pid

    def kill(self, index: int) -> None:
        """kill -9."""
        pid = self._pid(index)
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
        # a node forked by the zygote (node/zygote) is not our child: wait for its end instead
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def restart(self, index: int, *, wait: bool = True) -> None:
        """Start node `index` again at the same port (after `kill`)."""
        self._spawn(index)
        if wait:
            self.wait([index])

    def freeze(self, index: int) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing."""
        os.kill(self._pid(index), signal.SIGSTOP)
        self.frozen.add(index)

    def thaw(self, index: int) -> None:
        os.kill(self._pid(index), signal.SIGCONT)
        self.frozen.discard(index)

    def close(self) -> None:
        for index in list(self.frozen):
            with contextlib.suppress(RuntimeError, ProcessLookupError):
                self.thaw(index)
        # side by side: a node that outstays its grace (a link open to a node already gone)
        # costs the whole grace once, not once per node
        running = [r for r in self.replicas if r.process is not None]
        if not running:
            return
        with ThreadPoolExecutor(max_workers=len(running)) as pool:
            list(pool.map(lambda r: stop_pid(r.process.pid, grace_s=3, module=r.module), running))

    # --- asking -----------------------------------------------------------------------------
    def source(
        self, http: aiohttp.ClientSession, hops: Sequence[Hop] | None = None, **kwargs: Any
    ) -> ReplicaCircuits:
        """A client's circuits over `hops` (default: every node)."""
        manifest = self.manifest
        expected = {s.shard_id: (manifest.model_hash, s.layers) for s in manifest.shards}
        return ReplicaCircuits(
            http,
            self.hops if hops is None else list(hops),
            expected=expected,
            hidden_size=manifest.hidden_size,
            **kwargs,
        )

    async def answer(
        self,
        head: Any,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        policy: FailoverPolicy | None = None,
        on_token: Callable[[int, ReplicaCircuits], Awaitable[None]] | None = None,
        http: aiohttp.ClientSession | None = None,
        source_args: dict[str, Any] | None = None,
    ) -> tuple[list[int], Timings, ReplicaCircuits]:
        """A greedy answer over these nodes with failover; `on_token(count, source)` runs
        after each token (the tests kill or freeze nodes there)."""
        own = http is None
        session = http or aiohttp.ClientSession(skip_auto_headers=("User-Agent",))
        try:
            source = self.source(session, **(source_args or {}))
            timings = Timings()
            tokens: list[int] = []
            async for token in generate(
                source,
                head,
                prompt_ids,
                max_new_tokens=max_new_tokens,
                sampling=SamplingConfig(),
                timings=timings,
                stop_on_eos=False,
                policy=policy or FailoverPolicy(),
            ):
                tokens.append(token)
                if on_token is not None:
                    await on_token(len(tokens), source)
            return tokens, timings, source
        finally:
            if own:
                await session.close()
