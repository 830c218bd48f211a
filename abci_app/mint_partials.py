"""A funded mint's partial signatures on the chain, its signing deadline and its refund.

A paid mint gives exactly its N credits or its price back, by a deadline (docs/credits.md,
"A paid mint gives credits or a refund"):

    mint_partials{mint, partials}
                   a validator (NOT_VALIDATOR) posts s_i = x_i · B for every blinded point B of
                   a threshold mint (MINT_UNKNOWN), funded (MINT_UNFUNDED), in a block ≤ its
                   deadline and not refunded (MINT_SIGNING_CLOSED), the signer a receiver of the
                   formed key of the mint's period (NOT_DKG_PARTICIPANT), its first set for that
                   mint (PARTIALS_REPLAYED), one partial per point (PARTIALS_INVALID) and all of
                   them verifying under the signer's public share X_i, checked at once
                   (`blind_bls.verify_partials`: a random linear combination whose 128-bit
                   coefficients are hashed from the mint id, the signer's address, X_i and every
                   point — deterministic, two pairings a set; PARTIALS_INVALID otherwise).
                   → `mpart/<mint>/<address>` = {index, partials, height}, the address joins the
                   record's `signers`; at the t-th signer (t: the period's threshold) the mint
                   leaves `msign/`: it can never be refunded. One validator's bad set is refused
                   alone: it changes nobody else's.

    fund_mint at ≥ 2/3 (credits.py) → `deadline` = funding height + genesis
                   `credits.sign_blocks`, `signers` = [], `refunded_height` = null, and
                   `msign/<deadline>/<mint>`.

    EndBlock of height h (`end_block`, before the epoch close): every mint of `msign/` with a
                   deadline ≤ h (fewer than t signers: the t-th deleted its entry) is refunded,
                   once, from that entry (payer, amount, count, issue epoch: kept there, so a
                   record pruned first changes nothing): `refunded_height` = h on its record,
                   `cissue/<issue epoch>`.funded −= its count, and `mrefund/<epoch of h>/<mint>`
                   = {payer, amount}. The close of that epoch pays the
                   payer `amount` — what the mint charged, exactly — as a direct row on the credit
                   pool's page, before any other row (settlement.py), or moves the refund whole
                   to the next epoch when the pool cannot pay it in full yet.

No partial of a refunded mint is accepted, and `/credit_partials` answers only the sets on the
chain (threshold_queries.py): a client combines posted partials, so credits exist only for a
mint that reached t, and a mint that reached t is never refunded.
"""

from __future__ import annotations

from typing import Any

from abci_app import credit_dkg, credits, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol import blind_bls, bls
from protocol.committee.credits import MintPartials
from protocol.committee.envelope import SignedTx


def challenge_context(mint: str, address: str) -> bytes:
    """What the chain's batch coefficients bind besides the points: the mint id and the
    posting validator's address."""
    return bytes.fromhex(mint[2:]) + address.encode()


def signer_of(state: State, period: int, address: str) -> tuple[int, bls.G2, int] | None:
    """(index, public share X_i, threshold) of `address` under `period`'s formed key."""
    formed = credit_dkg.period_key(state, period)
    run = credit_dkg.run_record(state, period)
    if formed is None or run is None:
        return None
    share = formed["public_shares"].get(address)
    if share is None:
        return None
    index = next(i for i, (a, _) in enumerate(run["receivers"], start=1) if a == address)
    return index, bls.parse_g2(bytes.fromhex(share), "public share"), int(formed["threshold"])


def mint_partials(state: State, tx: SignedTx) -> None:
    body: MintPartials = tx.body
    credits.enabled(state)
    address = rules.validator(state, tx.signer)["address"]
    record = state.get(schema.MINT, body.mint)
    if record is None or "points" not in record:
        rules.reject(Code.MINT_UNKNOWN, f"no threshold mint {body.mint}")
    if record["funded_height"] is None:
        rules.reject(Code.MINT_UNFUNDED, f"mint {body.mint} is not funded: nothing to sign")
    if record.get("refunded_height") is not None or state.block_height > record["deadline"]:
        rules.reject(
            Code.MINT_SIGNING_CLOSED,
            f"mint {body.mint}: its signing deadline (block {record['deadline']}) is past",
        )
    signer = signer_of(state, int(record["period"]), address)
    if signer is None:
        rules.reject(
            Code.NOT_DKG_PARTICIPANT,
            f"validator {address} holds no share of key period {record['period']}",
        )
    index, public_share, threshold = signer
    key = f"{body.mint}/{address}"
    if address in record["signers"] or state.get(schema.MINT_PARTIALS, key) is not None:
        rules.reject(
            Code.PARTIALS_REPLAYED, f"validator {address} posted its partials of {body.mint}"
        )
    points = [bytes.fromhex(p) for p in record["points"]]
    if len(body.partials) != len(points):
        rules.reject(
            Code.PARTIALS_INVALID,
            f"validator {address}: {len(body.partials)} partials for {len(points)} points",
        )
    try:
        blind_bls.verify_partials(
            public_share, points, body.partials, challenge_context(body.mint, address)
        )
    except (blind_bls.ThresholdCreditError, bls.BlsError) as error:
        rules.reject(Code.PARTIALS_INVALID, f"validator {address}: {error.message}")
    state.put(
        schema.MINT_PARTIALS,
        key,
        {
            "index": index,
            "partials": [p.hex() for p in body.partials],
            "height": state.block_height,
        },
    )
    lifetime = state.genesis.credit_lifetime_epochs
    rules.track_at(state, schema.MINT_PARTIALS, key, int(record["issue_epoch"]) + lifetime)
    signers = sorted({*record["signers"], address})
    state.put(schema.MINT, body.mint, {**record, "signers": signers})
    if len(signers) == threshold:
        state.delete(schema.MINT_SIGNING, schema.signing_key(record["deadline"], body.mint))
        state.emit("planet.mint_signed", mint=body.mint, signers=len(signers))


def end_block(state: State, height: int) -> None:
    """Refund every mint whose signing deadline is this block (or before) that has fewer than
    t posted partial sets (the module docstring)."""
    if state.genesis.credit_price_wei is None:
        return
    for key, due in state.items(schema.MINT_SIGNING, "", f"{height + 1:020d}"):
        state.delete(schema.MINT_SIGNING, key)
        refund(state, key.split("/", 1)[1], due, height)


def refund(state: State, mint: str, due: dict[str, Any], height: int) -> None:
    """Refund `mint` (its `msign/` entry `due`: payer, amount, count, issue epoch) at `height`:
    its record marked (when not pruned yet: nothing can sign it then either), the close of
    this epoch owes its payer its amount."""
    record = state.get(schema.MINT, mint)
    if record is not None:  # within its credits' window: their issue count drops too
        state.put(schema.MINT, mint, {**record, "refunded_height": height})
        credits.count_issued(state, int(due["issue_epoch"]), "funded", -int(due["count"]))
    epoch = rules.epoch_of(state, height)
    owe_refund(state, epoch, mint, str(due["payer"]).lower(), int(due["amount"]))
    state.emit("planet.mint_refunded", mint=mint, payer=due["payer"], amount=due["amount"])


def owe_refund(state: State, epoch: int, mint: str, payer: str, amount: int) -> None:
    """`mrefund/<epoch>/<mint>`: the close of `epoch` pays `amount` to `payer`."""
    value = {"payer": payer, "amount": str(amount)}
    state.put(schema.MINT_REFUND, schema.in_epoch(epoch, mint), value)


def take_refunds(state: State, epoch: int) -> list[tuple[str, str, int]]:
    """The refunds the close of `epoch` owes, deleted: (mint, payer, amount) by mint id."""
    taken = []
    for key, value in state.items(schema.MINT_REFUND, *schema.epoch_range(epoch)):
        state.delete(schema.MINT_REFUND, key)
        taken.append((key.split("/", 1)[1], str(value["payer"]), int(value["amount"])))
    return sorted(taken)


def payable(refunds: list[tuple[str, str, int]], available: int) -> int:
    """How many of `refunds`, in order, the pool's `available` wei pays in full (a refund is
    paid whole or not yet: never a part)."""
    paid = 0
    for _, _, amount in refunds:
        if amount > available:
            break
        available -= amount
        paid += 1
    return paid


def carry_refunds(state: State, epoch: int, refunds: list[tuple[str, str, int]]) -> None:
    """Refunds the close of `epoch` did not pay move, whole, to epoch + 1 (never dropped)."""
    for mint, payer, amount in refunds:
        owe_refund(state, epoch + 1, mint, payer, amount)
