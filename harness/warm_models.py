"""`python -m harness.warm_models`: prepare, one after another, the SmolLM2 shard sets that
tests, benchmarks and the devnet take from the shared cache ($PLANET_HOME/models), so that
test lanes running side by side (deploy/test.sh) find them ready instead of preparing the same
one at once. A set already in the cache is taken as it is (`prepared_manifest`: sets appear by
rename, whole; each node checks its shard's hash when it starts); the first run on a new machine
converts the GGUF and quantizes (a few minutes)."""

from __future__ import annotations

import sys
import time

from harness.shard_cache import UNEVEN_SPLIT, prepared_manifest
from node.model.source import ensure_default_fp32

# (parts, quant, split): every cached set that bench/, tests/ and `planet devnet up` ask for by
# default; (1, "int8"): the devnet's second model (deploy/devnet/second_model.py)
SHARD_SETS = (
    (1, "int8", None),
    (2, "int8", None),
    (2, "none", None),
    (3, "int8", None),
    (3, "none", None),
    (3, "none", UNEVEN_SPLIT),
    (3, "int4", None),
    (5, "none", None),
)


def main() -> int:
    started = time.monotonic()
    ensure_default_fp32(progress=lambda _m: None)
    for parts, quant, split in SHARD_SETS:
        prepared_manifest(parts=parts, quant=quant, split=split)
    print(
        f"models ready: fp32 and {len(SHARD_SETS)} shard sets ({time.monotonic() - started:.1f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
