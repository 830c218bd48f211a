"""`prepared_manifest`: a SmolLM2 shard set's manifest from the shared model cache
($PLANET_HOME/models), prepared on first use. Its own module, without harness/gateway_net.py's
network imports (web3, eth_account, the contracts' deployment: ~1 CPU-s a process), for the
benchmarks that only load shards in process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# layers per shard of the uneven 3-part fp32 set (tests/integration's plain circuits: the
# pipeline and speculation tests), prepared with the others before the lanes (warm_models)
UNEVEN_SPLIT = (4, 17, 9)


def prepared_manifest(
    parts: int = 2, quant: str = "int8", split: Sequence[int] | None = None
) -> Path:
    """The prepared SmolLM2 shards' manifest (`split`: layers per shard, as `planet prepare
    --split` takes them): the cached one when present, else `node.model.prepare`. The cached
    one's files are not hashed here (`prepare` re-hashes every shard of a reused output, ~1.4
    CPU-s for the fp32 model): each node re-checks its shard file's hash at start."""
    from node.model.source import DEFAULT_MODEL_ID, default_out_dir

    cached = default_out_dir(DEFAULT_MODEL_ID, parts, quant, split) / "manifest.json"
    if cached.exists():
        return cached
    from node.model.prepare import prepare

    return Path(prepare(parts=parts, quant=quant, split=split, progress=lambda _m: None))
