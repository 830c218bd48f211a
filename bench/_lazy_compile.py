"""hqq's `torch.compile()` decorators deferred to their first call, in a bench's own process.

transformers imports `hqq.core.quantize` whenever hqq is installed (`transformers.cache_utils`,
so every shard or head load), and that module decorates three functions with `@torch.compile()`
in its body: the decorator imports torch._dynamo and torch._inductor then and there, ~3.4 CPU-s
of a bench process's ~6 for torch + transformers (measured on the 2-core CI box), though no
bench calls those functions (they serve hqq's `forward_pytorch_compile` backend, which nodes do
not select). `install()` puts a finder first on `sys.meta_path` that runs that one module with
`torch.compile` swapped for `lazy`: each decorated function is compiled by the real
`torch.compile`, with the same arguments, on its first call. Nothing else changes: torch.compile
itself only compiles on the first call, so what a bench measures stays the same.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

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


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        import torch

        real = torch.compile
        torch.compile = lazy(real)
        try:
            self.inner.exec_module(module)
        finally:
            torch.compile = real


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in DEFERRED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Once per process; a module already imported stays as it is."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
