"""Threshold-BLS credits on the chain: ONE list of blinded points per mint, credits checked
under the key period's committee key X_p (abci_app/credit_dkg.py made it).

    credit_mint{payer, period, blinded, amount, expiry, signature}
                        period = the block's key period (CREDIT_EPOCH) whose key is formed
                        (NO_CREDIT_KEYS: the run is still going, or failed); every blinded
                        point parses strictly as a G1 point, not the identity (MINT_INVALID);
                        then the rules every mint shares (`credits.accept_mint`: amount,
                        replay, expiry, the payer's `CreditPurchase` over
                        `threshold_mint_id`, its bound of unfunded mints). The record holds the
                        one list, `period` and `issue_epoch` (`protocol.threshold_mint`).
                        Funding is `fund_mint` as for any mint; a funded mint counts its payer
                        among the period's buyers (`credit_buyers`).
    credit_redeem{model, shard, credits}
                        a compute node, not LEFT, on a (model, shard) it registered
                        (REDEEM_SHARD); each credit of a period whose window holds this epoch
                        (CREDIT_EPOCH: issue epoch + lifetime), the period's key formed
                        (CREDIT_INVALID otherwise), its nonce never redeemed nor listed twice
                        (CREDIT_SPENT: `cspent/<sha256 nonce>`), and σ valid under X_p: all
                        credits of a period checked in one batch (`blind_bls.verify_credits`,
                        128-bit coefficients hashed from the credits: deterministic), then one
                        by one only when the batch fails, to name the bad one (CREDIT_INVALID).
                        The rest is `credits.credit_work` (positions, spent set, pool, pay).

Each validator signs a funded mint's list with its share x_i when asked (`/credit_partials`,
abci_app/threshold_queries.py); anyone checks a partial against the public share X_i.
"""

from __future__ import annotations

import hashlib

from abci_app import credit_dkg, credit_locks, credits, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.envelope import SignedTx
from protocol.committee.threshold_credits import ThresholdMint, ThresholdRedeem
from protocol.threshold_mint import issue_epoch, period_redeemable, threshold_mint_id


def period_group_key(state: State, period: int) -> bls.G2 | None:
    formed = credit_dkg.period_key(state, period)
    if formed is None:
        return None
    return bls.parse_g2(bytes.fromhex(formed["key"]), "committee key")


def threshold_spent_id(credit: ThresholdCredit) -> str:
    """The spent-set key: sha256 of the credit's nonce, as for every credit."""
    return hashlib.sha256(credit.nonce).hexdigest()


def credit_mint(state: State, tx: SignedTx) -> None:
    body: ThresholdMint = tx.body
    credits.enabled(state)
    plan = credit_dkg.schedule(state)
    period = plan.period_of(state.block_height)
    if body.period != period:
        rules.reject(Code.CREDIT_EPOCH, f"a mint of key period {body.period} in period {period}")
    if credit_dkg.period_key(state, period) is None:
        rules.reject(
            Code.NO_CREDIT_KEYS,
            f"key period {period} has no committee key (its DKG is running or failed)",
        )
    for index, point in enumerate(body.blinded):
        try:
            bls.parse_g1(point, f"blinded point {index}")
        except bls.BlsError as error:
            rules.reject(Code.MINT_INVALID, error.message)
    identifier = threshold_mint_id(body.payer, period, body.blinded)
    issued = issue_epoch(plan, period, state.genesis.epoch_length)
    credits.accept_mint(
        state,
        body,
        identifier,
        {
            "period": period,
            "issue_epoch": issued,
            "points": [point.hex() for point in body.blinded],
        },
    )


def credit_redeem(state: State, tx: SignedTx) -> None:
    body: ThresholdRedeem = tx.body
    credits.enabled(state)
    node = rules.compute_node(state, tx.signer)
    if body.model != node["model"] or body.shard not in node["shards"]:
        rules.reject(
            Code.REDEEM_SHARD, f"shard {body.shard} of {body.model} is not registered by this node"
        )
    plan = credit_dkg.schedule(state)
    epoch_length = state.genesis.epoch_length
    current = rules.epoch_of(state, state.block_height)
    lifetime = state.genesis.credit_lifetime_epochs
    by_period: dict[int, list[int]] = {}
    spent: list[tuple[str, int]] = []
    seen: set[str] = set()
    for index, credit in enumerate(body.credits):
        where = f"credit {index}"
        if not period_redeemable(plan, credit.period, epoch_length, current, lifetime):
            rules.reject(
                Code.CREDIT_EPOCH,
                f"{where}: a credit of key period {credit.period} is not redeemable in epoch "
                f"{current}",
            )
        identifier = threshold_spent_id(credit)
        if identifier in seen or state.get(schema.CREDIT_SPENT, identifier) is not None:
            rules.reject(Code.CREDIT_SPENT, f"{where}: already redeemed")
        credit_locks.check_redeemer(state, identifier, tx.signer, where)  # CREDIT_LOCKED
        seen.add(identifier)
        by_period.setdefault(credit.period, []).append(index)
        spent.append((identifier, issue_epoch(plan, credit.period, epoch_length)))
    for period, indices in sorted(by_period.items()):
        key = period_group_key(state, period)
        if key is None:
            rules.reject(Code.CREDIT_INVALID, f"key period {period} has no committee key")
        batch = [body.credits[i] for i in indices]
        try:
            blind_bls.verify_credits(key, batch)
        except (blind_bls.ThresholdCreditError, bls.BlsError):
            for i in indices:  # name the first bad one
                try:
                    blind_bls.verify_credit(key, body.credits[i])
                except (blind_bls.ThresholdCreditError, bls.BlsError) as error:
                    rules.reject(Code.CREDIT_INVALID, f"credit {i}: {error.message}")
            rules.reject(Code.CREDIT_INVALID, f"a credit of key period {period} does not verify")
    credits.credit_work(state, tx.signer, node, body.model, body.shard, spent)
