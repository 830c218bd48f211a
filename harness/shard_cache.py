"""`prepared_manifest`: a SmolLM2 shard set's manifest from the shared model cache
($PLANET_HOME/models), prepared on first use. Its own module, without harness/gateway_net.py's
network imports (web3, eth_account, the contracts' deployment: ~1 CPU-s a process), for the
benchmarks that only load shards in process."""

from __future__ import annotations

from pathlib import Path


def prepared_manifest(parts: int = 2, quant: str = "int8") -> Path:
    """The prepared SmolLM2 shards' manifest: the cached one when present (each node re-checks
    its shard file's hash at start), else `node.model.prepare`."""
    from node.model.source import models_dir

    cached = models_dir() / f"smollm2-135m-{parts}p-{quant}" / "manifest.json"
    if cached.exists():
        return cached
    from node.model.prepare import prepare

    return Path(prepare(parts=parts, quant=quant, progress=lambda _m: None))
