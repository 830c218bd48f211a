"""Code run around one module's body when it is imported (issue 41: what a process pays to start).

`around_import(name, around)` puts a finder first on `sys.meta_path` for the one module `name`:
when it is imported, its real loader executes the module's body inside `around()` (a context
manager). Used to give a module stand-ins while its body runs (node/lazy_bls.py: web3 without
py_ecc's pairing tables) or to defer what its body would do at once (bench/_lazy_compile.py:
hqq's `torch.compile` decorators). Once per name and process; a module already imported stays
as it is; `unless()` true at import time leaves the import alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

Around = Callable[[], AbstractContextManager[Any]]


class _Loader:
    """`real`, executing the module's body inside `around()`."""

    def __init__(self, real: Any, around: Around) -> None:
        self._real, self._around = real, around

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        with self._around():
            self._real.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, … for tracebacks
        return getattr(self._real, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, around: Around, unless: Callable[[], bool]) -> None:
        self.name, self.around, self.unless = name, around, unless

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self.unless():
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self.around)  # type: ignore[assignment]
        return spec


def around_import(name: str, around: Around, *, unless: Callable[[], bool] = lambda: False) -> None:
    """Run module `name`'s body inside `around()` when it is imported (a finder first on
    `sys.meta_path`, once per name)."""
    if not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, around, unless))
