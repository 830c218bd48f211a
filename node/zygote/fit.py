"""Whether a forked child can stand in for `python -m MODULE` started afresh (else: refused,
and the caller starts it with Popen).

A fresh interpreter fixes some things at start-up that a fork inherits from the zygote instead:

- the interpreter itself: argv[0] must be the zygote's `sys.executable`;
- the namespaces (network, mount, pid, ...): a child lives in the zygote's, but for the network
  namespace that `ip netns exec NS` names or that the caller lives in (with its mount
  namespace; node.zygote.netns);
- the environment that is read before or while the preloaded modules import: every variable
  the preload read through `os.environ` (recorded, `Recorder`), and every variable with a
  prefix that C libraries read when they load (OpenMP's thread pool, MKL, the dynamic linker,
  CUDA, the interpreter's own PYTHON* settings) — they must be equal, present or absent alike;
- the modules found through sys.path[0], which `-m` sets to the cwd: a child whose cwd holds a
  package the zygote loaded from elsewhere (or the reverse) would import other code.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from node.zygote import netns
from node.zygote.wire import NAMESPACES, SpawnRequest

# read by C code at load time (not through os.environ), or by the interpreter at start-up
LOAD_TIME_PREFIXES = (
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "DNNL_", "ONEDNN_", "ATEN_", "TORCH_",
    "PYTORCH_", "CUDA_", "NVIDIA_", "LD_", "MALLOC_", "GLIBC_", "PYTHON", "LC_", "LANG", "TZ",
    "TQDM_",
)  # fmt: skip
# PYTHON* variables the child applies itself (node.zygote.child)
APPLIED_IN_CHILD = frozenset({"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
# the entry `-m` put first on sys.path when the zygote started (its cwd): a preloaded module
# may insert others before it
CWD_ENTRY = sys.path[0]


def cwd_index() -> int:
    """Where the cwd entry of `-m` is on sys.path now."""
    return sys.path.index(CWD_ENTRY)


class Recorder(os._Environ):  # type: ignore[name-defined,misc]  # os.environ's own class
    """os.environ while the zygote preloads: every key looked up by name is noted in `READ`.
    Keys read while the mapping is being iterated (`os.environ.items()` looks each one up)
    are not: a module that scans the environment (tqdm's TQDM_* overrides) reads what its
    prefix selects, which `LOAD_TIME_PREFIXES` lists where it matters."""

    READ: ClassVar[set[str]] = set()
    iterating: ClassVar[int] = 0

    def __getitem__(self, key: str) -> str:
        if not Recorder.iterating:
            Recorder.READ.add(key)
        return super().__getitem__(key)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        Recorder.iterating += 1
        try:
            yield from super().__iter__()
        finally:
            Recorder.iterating -= 1


def namespaces() -> dict[str, str]:
    """This thread's namespaces (a thread may enter a network namespace of its own): name ->
    the /proc/thread-self/ns link ("net:[4026531840]")."""
    return {name: os.readlink(f"/proc/thread-self/ns/{name}") for name in NAMESPACES}


def _origin(module: Any) -> str | None:
    spec = getattr(module, "__spec__", None)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(Path(next(iter(spec.submodule_search_locations), "")).resolve())
    return str(Path(spec.origin).resolve()) if spec.has_location and spec.origin else None


def _found_without_cwd(name: str) -> str | None:
    """Where `name` is found with sys.path[0] (the cwd `-m` put there) left out, by every
    finder on sys.meta_path (the editable install's included)."""
    saved = sys.path[:]
    del sys.path[cwd_index()]
    try:
        for finder in sys.meta_path:
            if finder in (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter):
                continue  # not on a path
            finder_spec = getattr(finder, "find_spec", None)
            spec = finder_spec(name, None) if finder_spec else None
            if spec is not None:
                holder = type("found", (), {"__spec__": spec})
                return _origin(holder)
        return None
    finally:
        sys.path[:] = saved


@dataclass
class Fit:
    """What the zygote fixed at start: compare each request against it (`refusal`)."""

    executable: str
    env: dict[str, str]  # the zygote's environment before the preload
    read_at_import: frozenset[str]
    cwd: str
    spaces: dict[str, str]
    loaded: dict[str, str] = field(default_factory=dict)  # top-level module -> its origin
    from_cwd: dict[str, str | None] = field(default_factory=dict)  # ... found elsewhere

    @classmethod
    def after_preload(cls, env: Mapping[str, str], read: Iterable[str]) -> Fit:
        fit = cls(sys.executable, dict(env), frozenset(read), os.getcwd(), namespaces())
        for name, module in list(sys.modules.items()):
            origin = None if "." in name or name.startswith("__") else _origin(module)
            if origin is not None:
                fit.loaded[name] = origin
        for name, origin in fit.loaded.items():
            if origin == fit.cwd or origin.startswith(fit.cwd + os.sep):
                fit.from_cwd[name] = _found_without_cwd(name)
        return fit

    def import_env_keys(self, env: Mapping[str, str]) -> set[str]:
        keys = set(self.read_at_import)
        keys.update(k for k in (*env, *self.env) if k.startswith(LOAD_TIME_PREFIXES))
        return keys - APPLIED_IN_CHILD

    def refusal(self, request: SpawnRequest) -> str | None:
        """Why `request` cannot be served by a fork of this zygote; None if it can."""
        if request.argv[0] != self.executable:
            return f"interpreter {request.argv[0]} is not {self.executable}"
        if request.netns is not None:  # the child leaves the caller's network namespace
            if any(request.namespaces[k] != v for k, v in self.spaces.items() if k != "net"):
                return "other namespaces"
            why = netns.refusal(request.netns)
            if why is not None:
                return why
        elif request.namespaces != self.spaces:
            differ = {k for k, v in self.spaces.items() if request.namespaces[k] != v}
            if "net" not in differ or not differ <= netns.JOINED:
                return "other namespaces"  # else the child joins the caller's (netns.join)
            why = netns.unjoinable(request.caller, request.namespaces)
            if why is not None:
                return why
        differ = sorted(
            k for k in self.import_env_keys(request.env) if request.env.get(k) != self.env.get(k)
        )
        if differ:
            return f"environment read at import differs: {', '.join(differ)}"
        if request.cwd != self.cwd:
            return self._shadowing(request.cwd)
        return None

    def _shadowing(self, cwd: str) -> str | None:
        for name, origin in self.from_cwd.items():
            if origin != self.loaded[name]:
                return f"module {name} comes from the zygote's cwd"
        try:
            entries = os.listdir(cwd)
        except OSError as error:
            return f"cwd {cwd}: {error.strerror}"
        for entry in entries:
            name = entry.split(".", 1)[0]
            origin = self.loaded.get(name)
            if origin is None or not _importable(Path(cwd, entry)):
                continue
            if str(Path(cwd, entry).resolve()) != origin:
                return f"cwd {cwd} holds {entry}, loaded from {origin}"
        return None


def _importable(path: Path) -> bool:
    """Whether `path` in sys.path[0] would be imported ahead of what is further down the
    path: a regular package or a module (a namespace portion never shadows a package)."""
    if path.is_dir():
        return (path / "__init__.py").exists() or (path / "__init__.pyc").exists()
    return path.suffix in (".py", ".pyc", ".so")
