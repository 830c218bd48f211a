"""Junk credit mints, as an attacker sends them (issue 42, attacks 2 and 3): valid `credit_mint`
txs of one credit each that no balance backs, cheap to make (no blinding: any G1 point other
than the identity will do) and with ids ground below a bound, so they list before an honest
mint on a list ordered by id. Used by the unit and integration tests and bench/credits.py."""

from __future__ import annotations

from protocol import bls
from protocol.committee.credits import CreditMint
from protocol.credits import sign_purchase
from protocol.eip712 import address_of
from protocol.threshold_mint import threshold_mint_id


def junk_mint(
    period: int,
    payer_key: bytes,
    price_wei: int,
    chain_id: int,
    escrow: str,
    expiry: int,
    seed: int,
    below: str = "0x" + "f" * 64,
) -> tuple[str, CreditMint]:
    """(mint id, body) of a one-credit mint of key `period` by `payer_key` whose id is below
    `below` (ground from `seed`: the point (seed · 2^32 + 1)·G, then + G per try, so two seeds
    never meet; an id below "0x8…" takes two tries on average)."""
    payer = address_of(payer_key).lower()
    generator = bls.g1_generator()
    point = bls.g1_mul(generator, ((seed % (1 << 64)) << 32) + 1)
    while True:
        blinded = (bls.g1_bytes(point),)
        identifier = threshold_mint_id(payer, period, blinded)
        if identifier < below:
            break
        point = bls.g1_sum([point, generator])
    amount, signature = sign_purchase(payer_key, identifier, 1, price_wei, expiry, chain_id, escrow)
    body = CreditMint(
        payer=payer,
        period=period,
        blinded=blinded,
        amount=amount,
        expiry=expiry,
        signature=signature,
    )
    return identifier, body
