"""Credits made up for tests that never check a signature (wallets, payers, fake nodes), and
the RSA credits an old wallet file may still hold."""

from __future__ import annotations

from protocol import bls
from protocol.blind_bls import ThresholdCredit

SIGMA = bls.g1_bytes(bls.g1_generator())  # a valid point (files are parsed strictly), no σ


def fake_credit(index: int, period: int = 7) -> ThresholdCredit:
    """A distinct credit of `period` (nonce = `index`), well-formed, signed by nobody."""
    return ThresholdCredit(period, index.to_bytes(32, "big"), SIGMA)


def fake_credits(count: int, first: int = 0, period: int = 7) -> list[ThresholdCredit]:
    return [fake_credit(first + i, period) for i in range(count)]


def rsa_credit_json(index: int) -> list[object]:
    """An RSA credit as a wallet file of before held it: [epoch, prepared hex, signatures]."""
    prepared = index.to_bytes(81, "big")
    return [1, prepared.hex(), [["A" * 40, "01" * 256], ["B" * 40, "02" * 256]]]
