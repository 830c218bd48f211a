"""Keep the quantization libraries a process will not use out of it: `skip_unused_backends`.

transformers imports the quantization libraries it finds installed whether or not a model uses
them. `transformers.cache_utils` (which every decoder layer, and even `AutoConfig`, pulls in)
runs `if is_hqq_available(): from hqq.core.quantize import Quantizer`, and hqq's module-level
`@torch.compile` decorators load torch._dynamo's debugging and AOT-autograd modules; and
`transformers.quantizers` imports torchao's safetensors support when `is_torchao_available()`.
Measured here (2 shared cores), loading one fp32 shard: ~1 s of CPU for hqq, ~0.3 s for torchao,
of a ~5 s start. Only int4 shards run hqq (node.model.quant) and only int8 shards run torchao.

`is_hqq_available()` / `is_torchao_available()` ask `importlib.util.find_spec(name)`; a `None`
entry in `sys.modules` is the import system's own way to say a module is absent (`import name`
then raises ModuleNotFoundError and `find_spec(name)` returns None; the Python reference,
"The module cache"). So a process that knows, before anything imports transformers, that it
runs only some quants marks the other quants' libraries absent:

    skip_unused_backends({manifest_entry.quant})   # `planet node serve`: one shard, one quant

It is a decision for the whole process, so only a process's entry point makes it (never a
library function that a test process calls twice with different shards), and it changes nothing
once transformers or the library is imported. A process that then tried to run a skipped quant
fails with ModuleNotFoundError naming the library, not silently.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

# quant (node.model.quant.QUANTS) -> the library that runs it; "none" needs neither
BACKEND_OF_QUANT: dict[str, str] = {"int8": "torchao", "int4": "hqq"}


def skip_unused_backends(quants: Iterable[str]) -> tuple[str, ...]:
    """Mark the quantization libraries that none of `quants` needs as absent from this process,
    before transformers is imported. Returns the libraries marked (none when transformers, or
    the library itself, is already loaded: then it is too late, or already paid for)."""
    needed = {BACKEND_OF_QUANT.get(quant) for quant in quants}
    if "transformers" in sys.modules:
        return ()
    skipped = []
    for library in sorted(set(BACKEND_OF_QUANT.values()) - needed):
        if library not in sys.modules:
            sys.modules[library] = None  # type: ignore[assignment]
            skipped.append(library)
    return tuple(skipped)
