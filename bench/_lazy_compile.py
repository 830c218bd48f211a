"""hqq's `torch.compile()` decorators deferred to their first call, in a bench's own process.

transformers imports `hqq.core.quantize` whenever hqq is installed (`transformers.cache_utils`,
so every shard or head load), and that module decorates three functions with `@torch.compile()`
in its body: the decorator imports torch._dynamo and torch._inductor then and there, ~3.4 CPU-s
of a bench process's ~6 for torch + transformers (measured on the 2-core CI box), though no
bench calls those functions (they serve hqq's `forward_pytorch_compile` backend, which nodes do
not select). `install()` runs that one module's body with `torch.compile` swapped for `lazy`
(node/import_hooks.py): each decorated function is compiled by the real
`torch.compile`, with the same arguments, on its first call. Nothing else changes: torch.compile
itself only compiles on the first call, so what a bench measures stays the same.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from node.import_hooks import around_import

DEFERRED = frozenset({"hqq.core.quantize"})


def lazy(real: Callable[..., Any]) -> Callable[..., Any]:
    """A `torch.compile` (`real`) whose result compiles with `real`, with the same arguments,
    when first called."""

    def later(fn: Any = None, *args: Any, **options: Any) -> Any:
        if fn is None:  # `@torch.compile(...)`: the decorator
            return lambda f: later(f, *args, **options)
        done: Any = None

        @functools.wraps(fn)
        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            nonlocal done
            if done is None:
                done = real(fn, *args, **options)
            return done(*call_args, **call_kwargs)

        return call

    return later


@contextlib.contextmanager
def _compile_later() -> Iterator[None]:
    """`torch.compile` is `lazy(torch.compile)` while the module's body runs."""
    import torch

    real = torch.compile
    torch.compile = lazy(real)
    try:
        yield
    finally:
        torch.compile = real


def install() -> None:
    """Once per process; a module already imported stays as it is (node/import_hooks.py)."""
    for name in DEFERRED:
        around_import(name, _compile_later)
