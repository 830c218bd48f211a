"""web3 without py_ecc's import-time pairing tables (issue 41: what a process pays to start).

web3 imports eth_account, which imports eth_keyfile, whose `keyfile` module imports py_ecc's BLS
(`G2ProofOfPossession`, for EIP-2335 keystores, which Planet never writes) and BLS12-381's
`curve_order` at import time. py_ecc computes its pairing tables in pure Python when those
modules load: ~0.45 CPU-s of the ~0.9 s that `import web3` costs, paid by every `planet`
command, node agent, stake watcher, gateway and verifier that reads or writes the EVM chain.

`install()` (node/__init__.py) puts one finder on `sys.meta_path` (node/import_hooks.py) that
acts on one module, `eth_keyfile.keyfile`: while it executes, `py_ecc.bls` and
`py_ecc.bls12_381` are stand-ins (the curve order as a constant, BLS as an object that imports
the real `py_ecc.bls` when first used), removed again right after, so anything that imports
py_ecc itself later gets the real modules. Where py_ecc's BLS is already loaded the finder does
nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from node.import_hooks import around_import

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


@contextlib.contextmanager
def _with_stand_ins() -> Iterator[None]:
    """`eth_keyfile.keyfile`'s body runs with the stand-ins in `sys.modules`, removed after."""
    stand_ins = {n: m for n, m in _stand_ins().items() if n not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


def install() -> None:
    """The finder first on `sys.meta_path` (once; node/import_hooks.py)."""
    around_import(KEYFILE, _with_stand_ins, unless=lambda: "py_ecc.bls" in sys.modules)
