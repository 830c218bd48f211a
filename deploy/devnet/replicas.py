"""How many compute nodes a devnet starts: two per shard where memory allows (issue 44).

With one node per shard a node that stalls (a missed heartbeat, a restart) leaves its shard
with nobody, and every question meanwhile fails; the network's replica floor is two
(genesis `replica_floor`, docs/network.md). So `planet devnet up` starts `DEFAULT_REPLICAS`
nodes on each of the model's `DEVNET_SHARDS` shards when the machine's available memory
(`MemAvailable` in /proc/meminfo) holds the whole devnet with them, else one per shard and says
why. `--replicas N` sets it; `--nodes N` (the total, as before) overrides both.

Memory per process is a planning figure, measured on the 2-core test machine (PSS, shared
pages split): a devnet compute node (a third of SmolLM2-135M int8) holds ~0.75 GB, one serving
half of it ~0.85 GB (torch and the dequantized weights); the gateway and each verifier load the
model too; the second model (second_model.py, left out by `--one-model`) adds its seat in node0's
process (~0.6 GB: the int8 shard de-quantized) and the gateway's second client part (~110 MB).
Two per shard double step 6 (stake and join): `devnet up --validators 1 --verifiers 0` took
110 s with 6 nodes against 55 s with 3 on that machine (load ~7, noisy), so the test suite's
devnets pass `--replicas 1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.errors import UsageError

DEVNET_SHARDS = 3  # SmolLM2's 30 layers as 10+10+10
DEFAULT_REPLICAS = 2  # the replica floor
MAX_REPLICAS = 3  # 9 nodes: the devnet's node limit
GIB = 1 << 30
NODE_BYTES = GIB  # one compute node (measured ~0.85 GB, rounded up)
MODEL_COPY_BYTES = GIB  # the gateway, each verifier
VALIDATOR_BYTES = GIB // 4  # the committee app, CometBFT, its stake watcher
BASE_BYTES = GIB // 2  # anvil, the CLI, headroom
SECOND_MODEL_BYTES = 3 * GIB // 4  # the second model's seat (~0.6 GB) + client part (~110 MB)


@dataclass(frozen=True)
class NodeCount:
    nodes: int  # compute nodes in all
    replicas: int  # per shard (the first shards get one more when nodes is not a multiple)
    note: str  # the choice, in one line


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """`MemAvailable` in bytes, or None where the file does not say (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == "MemAvailable":
                fields = rest.split()
                if len(fields) == 2 and fields[1] == "kB" and fields[0].isascii():
                    return int(fields[0]) * 1024 if fields[0].isdigit() else None
    except OSError:
        return None
    return None


def devnet_bytes(
    nodes: int, *, validators: int, verifiers: int, gateway: bool, second_model: bool = False
) -> int:
    """The planning figure for a whole devnet's memory (`second_model`: served too)."""
    copies = verifiers + (1 if gateway else 0)
    return (
        BASE_BYTES
        + nodes * NODE_BYTES
        + copies * MODEL_COPY_BYTES
        + validators * VALIDATOR_BYTES
        + (SECOND_MODEL_BYTES if second_model else 0)
    )


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def node_count(
    *,
    nodes: int | None,
    replicas: int | None,
    validators: int,
    verifiers: int,
    gateway: bool,
    available: int | None,
    second_model: bool = False,
) -> NodeCount:
    """The compute nodes to start (see the module docstring); UsageError for both flags or a
    replica count out of range."""
    if nodes is not None and replicas is not None:
        raise UsageError(
            "give --nodes or --replicas, not both",
            hint=f"--replicas N starts N nodes on each of the {DEVNET_SHARDS} shards",
        )
    if nodes is not None:
        return NodeCount(nodes, max(1, nodes // DEVNET_SHARDS), f"{nodes} nodes (--nodes)")

    def need(per_shard: int) -> int:
        return devnet_bytes(
            per_shard * DEVNET_SHARDS,
            validators=validators,
            verifiers=verifiers,
            gateway=gateway,
            second_model=second_model,
        )

    if replicas is not None:
        if not 1 <= replicas <= MAX_REPLICAS:
            raise UsageError(f"--replicas must be 1..{MAX_REPLICAS}, got {replicas}")
        note = f"{replicas} per shard (--replicas)"
        if available is not None and need(replicas) > available:
            note += f"; warning: ~{_gib(need(replicas))} wanted, {_gib(available)} available"
        return NodeCount(replicas * DEVNET_SHARDS, replicas, note)
    if available is None:
        return NodeCount(
            DEVNET_SHARDS,
            1,
            "1 per shard: cannot read the available memory (/proc/meminfo); "
            f"--replicas {DEFAULT_REPLICAS} starts {DEFAULT_REPLICAS}",
        )
    wanted = need(DEFAULT_REPLICAS)
    if wanted > available:
        return NodeCount(
            DEVNET_SHARDS,
            1,
            f"1 per shard, below the replica floor of {DEFAULT_REPLICAS}: {DEFAULT_REPLICAS} per "
            f"shard want ~{_gib(wanted)}, {_gib(available)} available "
            f"(--replicas {DEFAULT_REPLICAS} starts them anyway)",
        )
    return NodeCount(
        DEFAULT_REPLICAS * DEVNET_SHARDS,
        DEFAULT_REPLICAS,
        f"{DEFAULT_REPLICAS} per shard (the replica floor): ~{_gib(wanted)} of "
        f"{_gib(available)} available",
    )
