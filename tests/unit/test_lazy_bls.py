"""web3 imported without py_ecc's pairing tables (node/lazy_bls.py, issue 41)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("py_ecc.bls", "py_ecc.bls12_381", "py_ecc.optimized_bls12_381")


def _loaded_after(code: str) -> list[str]:
    """Which of py_ecc's table modules a fresh interpreter has imported after `code`."""
    listed = f"[n for n in {list(TABLES)!r} if n in sys.modules]"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_web3_and_eth_account_import_without_the_pairing_tables() -> None:
    assert _loaded_after("import node, web3, eth_account") == []


def test_the_curve_order_stand_in_is_bls12_381s() -> None:
    from py_ecc.bls12_381 import curve_order

    from node.lazy_bls import CURVE_ORDER

    assert curve_order == CURVE_ORDER


def test_keystores_and_bls_keys_work_as_with_the_real_modules() -> None:
    code = """
import node
from eth_account import Account
import eth_keyfile.keyfile as keyfile
key = bytes(range(1, 33))
assert Account.decrypt(Account.encrypt(key, "pw"), "pw") == key
lazy = keyfile.bls.SkToPk(12345)
from py_ecc.bls import G2ProofOfPossession
assert type(G2ProofOfPossession).__name__ != "_LazyProofOfPossession"
assert lazy == G2ProofOfPossession.SkToPk(12345)
import py_ecc.bls12_381
assert keyfile.MAX_V4_PRIVATE_KEY == py_ecc.bls12_381.curve_order - 1
"""
    # the real modules load on first use, and `import py_ecc.bls` then gets the real one
    assert set(_loaded_after(code)) == set(TABLES)
