"""Buying credits against a live committee: request → mint tx → funded (validators with ≥ 2/3
of the power vouched that the payer's prepaid balance covers it, node/watcher/funding.py) →
each validator's blind signatures → finalized credits in the wallet.

    credits = await buy_credits(validator_rpcs, payer_key, count, wallet, expiry=now + 3600)

`validator_rpcs` lists one CometBFT RPC URL per validator: each validator's app answers
`/credit_signatures` with its own key only, so the client asks every one of them (and needs
answers from validators holding ≥ 2/3 of the power). The mint tx is signed with a fresh ed25519
key drawn for this purchase (it only carries the tx; the payer is authenticated by its EIP-712
`CreditPurchase` signature), so mints of one payer share no committee account. Price, escrow
and chain id come from the committee's `/params`. Errors are `PlanetError`s: `MintIncomplete`
when too few validators answered, `MintRefused` when the chain refused the mint (by code),
`MintUnfunded` when the validators did not vouch for it in time (nothing is charged then).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from nacl.signing import SigningKey

from node.chain.committee_link import CommitteeLink
from node.client.credit_wallet import CreditWallet, MintRequest
from protocol.credits import Credit, epoch_keys_from_query
from protocol.errors import PlanetError, ProtocolError

log = logging.getLogger(__name__)


class MintRefused(ProtocolError):
    """The committee refused the mint tx; `tx_code` is its result code (docs/credits.md)."""

    code = "mint_refused"

    def __init__(self, tx_code: int, text: str) -> None:
        super().__init__(f"the committee refused the mint (code {tx_code}): {text}")
        self.tx_code = tx_code


class MintUnfunded(ProtocolError):
    """The validators did not vouch that the payer's balance covers the mint: never charged."""

    code = "mint_unfunded"


async def wait_funded(
    link: CommitteeLink,
    mint_id: str,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    progress: Callable[[str], None] = log.info,
) -> int:
    """The height that funded mint `mint_id`, polled until `timeout_s` (then `MintUnfunded`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    progress(f"mint {mint_id[:18]}… sent; waiting for the validators to check your balance")
    while True:
        record = await link.query("/mints", id=mint_id)
        funded = record.get("funded_height") if isinstance(record, dict) else None
        if type(funded) is int:
            return funded
        if loop.time() >= deadline:
            vouched = record.get("vouched") if isinstance(record, dict) else None
            raise MintUnfunded(
                f"mint {mint_id} was not funded within {timeout_s:.0f} s "
                f"({len(vouched) if isinstance(vouched, list) else 0} validators vouched): "
                "nothing was charged",
                hint="deposit to your balance at the escrow's own address (`planet balance "
                "deposit --gateway <escrow>`), wait for it to be mined, and buy again",
            )
        await asyncio.sleep(poll_s)


async def buy_credits(
    validator_rpcs: Sequence[str],
    payer_key: bytes,
    count: int,
    wallet: CreditWallet,
    *,
    expiry: int,
    timeout_s: float = 20.0,
    fund_timeout_s: float = 60.0,
    progress: Callable[[str], None] = log.info,
) -> list[Credit]:
    """Mint `count` credits paid from `payer_key`'s prepaid balance; store and return them."""
    link = CommitteeLink(list(validator_rpcs), SigningKey.generate())
    try:
        params = await link.query("/params")
        genesis = params["genesis"]
        evm, credits = genesis.get("evm") or {}, genesis.get("credits")
        if not credits or not evm.get("escrow_address"):
            raise ProtocolError("this committee does not sell credits (no genesis credits)")
        keys = epoch_keys_from_query(await link.query("/credit_keys"))
        request = MintRequest.create(
            keys,
            count,
            payer_key,
            int(credits["price_wei"]),
            int(evm["chain_id"]),
            evm["escrow_address"],
            expiry,
        )
        sent = await link.submit(request.body)
        code, text = await link.committed_code(sent.hash, timeout_s=timeout_s)
        if code != 0:
            raise MintRefused(code, text)
        await wait_funded(link, request.mint_id, timeout_s=fund_timeout_s, progress=progress)
        progress("funded; gathering the validators' blind signatures")
    finally:
        await link.close()
    answers: dict[str, list[bytes]] = {}
    for url in validator_rpcs:
        one = CommitteeLink([url], timeout_s=timeout_s)
        try:
            answer = await one.query("/credit_signatures", mint=request.mint_id)
        except PlanetError as error:
            log.warning("validator %s gave no signatures: %s", url, error.message)
            continue
        finally:
            await one.close()
        for address, signatures in answer["signatures"].items():
            answers[address] = [bytes.fromhex(s) for s in signatures]
    finalized = request.finalize(keys, answers)
    wallet.add(finalized)
    return finalized
