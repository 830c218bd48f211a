"""Junk credit mints, as an attacker sends them (issue 42, attacks 2 and 3): valid `mint` txs of
one credit each that no balance backs, cheap to make (no blinding: any message below each key's
modulus will do) and with ids ground below a bound, so they list before an honest mint on a
list ordered by id. Used by the unit and integration tests and bench/credits.py."""

from __future__ import annotations

from protocol.committee.credits import Mint
from protocol.credits import EpochKeys, mint_id, sign_purchase
from protocol.eip712 import address_of


def junk_mint(
    keys: EpochKeys,
    payer_key: bytes,
    price_wei: int,
    chain_id: int,
    escrow: str,
    expiry: int,
    seed: int,
    below: str = "0x" + "f" * 64,
) -> tuple[str, Mint]:
    """(mint id, body) of a one-credit mint by `payer_key` whose id is below `below` (ground
    from `seed`; an id below "0x8…" takes two tries on average)."""
    payer = address_of(payer_key).lower()
    counter = seed << 32
    while True:
        blinded = {
            address: ((counter + 1).to_bytes(public.modulus_len, "big"),)
            for address, (public, _) in sorted(keys.keys.items())
        }
        identifier = mint_id(payer, keys.epoch, blinded)
        if identifier < below:
            break
        counter += 1
    amount, signature = sign_purchase(payer_key, identifier, 1, price_wei, expiry, chain_id, escrow)
    body = Mint(
        payer=payer,
        epoch=keys.epoch,
        blinded=blinded,
        amount=amount,
        expiry=expiry,
        signature=signature,
    )
    return identifier, body
