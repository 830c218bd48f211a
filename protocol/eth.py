"""Amounts of ETH a person types (`planet balance deposit 0.05`, `stake --amount 1`,
`devnet fund ADDRESS 10`, `key new --cap 0.01`): one parser for every command.

    parse_eth("0.05", what="the deposit", max_wei=MAX_UINT128)  →  50_000_000_000_000_000

Plain decimal digits only (`12`, `0.5`, `.5`; no sign, exponent, `_`, spaces inside or non-ASCII
digits), at most 18 decimals (a whole number of wei), positive, at most `max_wei`. Integer
arithmetic throughout: no Decimal context to overflow or round.

And `NONCE_TAKEN`: how an EVM node refuses a transaction whose nonce another send from the same
account took, for every sender that sends again (node.chain.evm.sender, `planet devnet fund`).
"""

from __future__ import annotations

import re

from protocol.errors import UsageError

WEI_PER_ETH = 10**18
# an EVM node's refusal of a transaction whose nonce another send of the account took: it never
# entered the pool, so sending it again (with the next nonce) cannot pay twice
NONCE_TAKEN = ("nonce too low", "replacement transaction underpriced")
MAX_UINT128 = (1 << 128) - 1  # what the escrow and staking contracts keep an amount in
_AMOUNT = re.compile(r"(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?")
MAX_CHARS = 60


def parse_eth(
    text: object,
    *,
    what: str = "the amount",
    max_wei: int = MAX_UINT128,
    most: str | None = None,
    hint: str = "e.g. 0.5",
) -> int:
    """`text` ETH as wei; UsageError (naming `what`, with `hint`) for anything else; `most`
    says what the limit is (default: `max_wei` in ETH)."""
    shown = ascii(text)[:40]
    stripped = text.strip() if isinstance(text, str) else ""
    if stripped.startswith("-") and _AMOUNT.fullmatch(stripped[1:]):
        raise UsageError(f"{what} must be positive ETH (got {shown})", hint=hint)
    match = _AMOUNT.fullmatch(stripped) if len(stripped) <= MAX_CHARS else None
    if match is None or not (match["whole"] or match["fraction"]):
        raise UsageError(f"{what} {shown} is not an amount of ETH", hint=hint)
    fraction = match["fraction"] or ""
    if len(fraction) > 18:
        raise UsageError(
            f"{what} {shown} has more than 18 decimals", hint="1 wei is 0.000000000000000001"
        )
    wei = int(match["whole"] or "0") * WEI_PER_ETH + int(fraction.ljust(18, "0"))
    if wei == 0:
        raise UsageError(f"{what} must be positive ETH (got {shown}: out of range)", hint=hint)
    if wei > max_wei:
        limit = most or f"{max_wei / WEI_PER_ETH:.6g} ETH (out of range)"
        raise UsageError(f"{what} {stripped[:40]} ETH is more than {limit}", hint=hint)
    return wei
