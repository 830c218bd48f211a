"""web3 imported without py_ecc's pairing tables (node/lazy_bls.py, issue 41)."""

from __future__ import annotations

from tests.unit.fresh_imports import loaded_after

TABLES = ("py_ecc.bls", "py_ecc.bls12_381", "py_ecc.optimized_bls12_381")


def test_web3_and_eth_account_import_without_the_pairing_tables() -> None:
    assert loaded_after("import node, web3, eth_account", *TABLES) == []


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
    assert set(loaded_after(code, *TABLES)) == set(TABLES)
