"""Fixtures shared by integration modules.

`plain_circuits`: plaintext circuits of real `planet node serve` processes over the unquantized
SmolLM2 shards, each node started with its circuit as `--next-hops` (as `planet local up` starts
them). A circuit of one shape (parts, layer split) starts once per test session, on the first
module that asks for it, and serves every later module that asks for the same shape:
test_codec_http, test_overlay_nodes and test_pipeline_http share the 2-part circuit,
test_pipeline_http and test_speculation_nodes the uneven 3-part one. Each node start costs
~3.4 CPU-s (imports and shard load) and a module's circuit took 30–40 s of the CI's lane
before; nothing these modules do changes a node (every session is closed; test_pipeline_http
checks that none is left open).
A node found dead when its circuit is asked for again makes the whole circuit start afresh.
The lanes of deploy/test.sh run these four modules as one unit (harness/lanes.py
`PLAIN_CIRCUITS`): apart, in other lanes or in another order, each started its own circuits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from harness.shard_cache import prepared_manifest
from node.server.launcher import (
    NodeProcess,
    free_ports,
    pid_alive,
    start_node,
    stop_pid,
    wait_healthy,
)

PORTS = (21100, 21200)  # the shared circuits' share of the test port range
Shape = tuple[int, tuple[int, ...] | None]


def _shape(parts: int, split: Sequence[int] | None) -> Shape:
    return parts, None if split is None else tuple(split)


class PlainCircuits:
    """Started circuits by shape; `get` starts one on first use, `release` stops it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.started: dict[Shape, tuple[Path, list[NodeProcess]]] = {}

    def get(self, parts: int, split: Sequence[int] | None = None) -> tuple[Path, list[NodeProcess]]:
        """(manifest, nodes in shard order) of the fp32 circuit of `parts` shards."""
        shape = _shape(parts, split)
        if shape in self.started:
            manifest, nodes = self.started[shape]
            if all(pid_alive(node.pid) for node in nodes):
                return manifest, nodes
            self.release(parts, split)
        manifest = prepared_manifest(parts, "none", split)  # the nodes check its hashes
        name = f"{parts}p" + ("" if split is None else "-" + "-".join(map(str, split)))
        ports = free_ports(parts, *PORTS)
        next_hops = ("--next-hops", ",".join(f"http://127.0.0.1:{port}" for port in ports))
        nodes: list[NodeProcess] = []
        try:
            for shard, port in enumerate(ports):
                nodes.append(
                    start_node(
                        manifest=manifest,
                        shard=shard,
                        port=port,
                        run_dir=self.run_dir / name,
                        extra_args=next_hops,
                    )
                )
            wait_healthy(nodes, timeout_s=240)
        except BaseException:
            for node in nodes:
                stop_pid(node.pid, grace_s=5)
            raise
        self.started[shape] = (manifest, nodes)
        return manifest, nodes

    def release(self, parts: int, split: Sequence[int] | None = None) -> None:
        """Stop the circuit of that shape (a module that is its last user frees the memory)."""
        _, nodes = self.started.pop(_shape(parts, split), (None, []))
        for node in nodes:
            stop_pid(node.pid, grace_s=5)

    def close(self) -> None:
        for parts, split in list(self.started):
            self.release(parts, split)


@pytest.fixture(scope="session")
def plain_circuits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlainCircuits]:
    circuits = PlainCircuits(tmp_path_factory.mktemp("plain-circuits"))
    try:
        yield circuits
    finally:
        circuits.close()


@pytest.fixture(scope="session", autouse=True)
def _zygote(zygote_lane: Path | None) -> Path | None:
    """The services this folder's tests start fork from the session's zygote
    (tests/conftest.py `zygote_lane`)."""
    return zygote_lane
