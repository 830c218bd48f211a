"""web3 without py_ecc's import-time pairing tables (issue 41: what a process pays to start).

web3 imports eth_account, which imports eth_keyfile, whose `keyfile` module imports py_ecc's BLS
(`G2ProofOfPossession`, for EIP-2335 keystores, which Planet never writes) and BLS12-381's
`curve_order` at import time. py_ecc computes its pairing tables in pure Python when those
modules load: ~0.45 CPU-s of the ~0.9 s that `import web3` costs, paid by every `planet`
command, node agent, stake watcher, gateway and verifier that reads or writes the EVM chain.

`install()` (node/__init__.py) puts one finder on `sys.meta_path` that acts on one module,
`eth_keyfile.keyfile`: while it executes, `py_ecc.bls` and `py_ecc.bls12_381` are stand-ins
(the curve order as a constant, BLS as an object that imports the real `py_ecc.bls` when first
used), removed again right after, so anything that imports py_ecc itself later gets the real
modules. Where py_ecc's BLS is already loaded the finder does nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

KEYFILE = "eth_keyfile.keyfile"
# BLS12-381's group order r (py_ecc.bls12_381.curve_order; tests/unit/test_lazy_bls.py checks it)
CURVE_ORDER = 0x73EDA753299D7D483339D80809A1D80553BDA402FFFE5BFEFFFFFFFF00000001


class _LazyProofOfPossession:
    """py_ecc.bls.G2ProofOfPossession, imported at its first use."""

    def __getattr__(self, name: str) -> Any:
        real = importlib.import_module("py_ecc.bls").G2ProofOfPossession
        return getattr(real, name)


def _stand_ins() -> dict[str, types.ModuleType]:
    bls = types.ModuleType("py_ecc.bls")
    bls.G2ProofOfPossession = _LazyProofOfPossession()  # type: ignore[attr-defined]
    curve = types.ModuleType("py_ecc.bls12_381")
    curve.curve_order = CURVE_ORDER  # type: ignore[attr-defined]
    return {bls.__name__: bls, curve.__name__: curve}


class _StandInLoader:
    """The real loader of `eth_keyfile.keyfile`, run with the stand-ins in `sys.modules`."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stand_ins = {n: m for n, m in _stand_ins().items() if n not in sys.modules}
        sys.modules.update(stand_ins)
        try:
            self._real.exec_module(module)
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, … for tracebacks
        return getattr(self._real, name)


class _KeyfileFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != KEYFILE or "py_ecc.bls" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _StandInLoader(spec.loader)  # type: ignore[assignment]
        return spec


def install() -> None:
    """Put the finder first on `sys.meta_path` (once)."""
    if not any(isinstance(finder, _KeyfileFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _KeyfileFinder())
