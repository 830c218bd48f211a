"""Bearer credits on the committee: threshold blind BLS credits under the key period's committee
key X_p (abci_app/credit_dkg.py made it), mints paid from a prepaid balance, redemptions.

    credit_mint{payer, period, blinded, amount, expiry, signature}
                               buy len(blinded) credits: period = the block's key period
                               (CREDIT_EPOCH) whose key is formed (NO_CREDIT_KEYS: its DKG is
                               still going, or failed); every blinded point parses strictly as
                               a G1 point, not the identity (MINT_INVALID); amount = count ·
                               genesis price, the `CreditPurchase` signature over
                               `threshold_mint_id` recovers to `payer` (MINT_INVALID); the mint
                               id is new (MINT_REPLAYED); block time ≤ expiry ≤ block time + 7
                               days (AUTHORIZATION_EXPIRED, AUTHORIZATION_EXPIRY_TOO_FAR); the
                               payer holds fewer than genesis `credits.max_pending_mints`
                               unfunded mints of the epochs still fundable (MINT_PENDING_LIMIT:
                               junk of its own cannot bury its in-flight mint, issue 42).
                               → `mint/<id>` with the one list, `period` and `issue_epoch`
                               (`protocol.threshold_mint`), unfunded (`mpend/<lane>/<id>`: lane
                               0 when the payer had a mint funded before, so returning buyers
                               list first; `mpay/<payer>/<id>`; `mpp/<payer>/<epoch>` += 1):
                               nothing charged or signed.
    fund_mint{mint}            a validator (its watcher read the payer's escrow balance and it
                               covers the mint: node/watcher/funding.py) vouches for it
                               (NOT_VALIDATOR; MINT_UNKNOWN; MINT_FUND_LATE after the mint's
                               epoch + FUND_EPOCHS or past its expiry). At ≥ 2/3 of the power
                               the mint is funded, once: a purchase of `amount` on the payer's
                               balance at the escrow's own address (`depositBalance(escrow)`):
                               `spent/` and `cpend/<payer>/<escrow>/mint/<id>`, debited by the
                               next close into the escrow's credit pool (settlement.py), and
                               `cissue/<issue epoch>`.funded += count; `mbuyer/<payer>` = the
                               height (a returning buyer from then on); the payer counts among
                               the period's buyers (`credit_buyers`). A vote on a funded mint
                               changes nothing. Funding opens the mint's signing until
                               `deadline` = the height + genesis `credits.sign_blocks`: each
                               validator's watcher posts its partial signatures over the one
                               list (`mint_partials`, abci_app/mint_partials.py); fewer than t
                               sets by then and the mint is refunded to its payer.
    credit_redeem{model, shard, credits[, assignments]}
                               a compute node, not LEFT, on a (model, shard) it registered,
                               or moved away from within the credits' window (left_shards.py;
                               REDEEM_SHARD otherwise); each credit assigned to it on (model,
                               shard) by its holder (CREDIT_NOT_ASSIGNED: credit_holders.py);
                               each credit of a period whose window
                               holds this epoch (CREDIT_EPOCH: issue epoch + genesis
                               `credits.lifetime_epochs`), the period's key formed
                               (CREDIT_INVALID otherwise), its nonce never redeemed nor listed
                               twice (CREDIT_SPENT: `cspent/<sha256 nonce>`), nor locked by
                               another node (CREDIT_LOCKED: credit_locks.py), and σ valid under
                               X_p: all credits of a period checked in one batch
                               (`blind_bls.verify_credits`, 128-bit coefficients hashed from the
                               credits: deterministic), then one by one only when the batch
                               fails, to name the bad one (CREDIT_INVALID); the node's
                               registered price p on the shard (prices.py `redemption_price`;
                               none above 0: REDEMPTION_UNPRICED) committed served positions
                               of the node on the shard, not yet consumed, per credit
                               (coverage.py `take_positions`: UNCOMMITTED_REDEMPTION,
                               REDEMPTION_OVER_PRICE; consumed).
                               → `cspent/<sha256 nonce>` per credit and
                               `credit/<current epoch>/<evm address>/<shard>/<model>` grows by
                               count credits and count · genesis `credits.layer_tokens`: the
                               node's pay record for the epoch (node_payouts.py: a row at the
                               credits' price less the verifiers' cut), its only pay; the
                               credits' price is due to the epoch (`cdue/<current epoch>`: the
                               close draws it from the credit pool) and `cissue/<e>`.redeemed
                               grows per issue epoch e.

Whole txs are refused on any failing item (nothing written). Without genesis `credits` (or an
escrow) every credit tx is CREDITS_DISABLED. The spent set is pruned with the credit's last
redeemable epoch, e + lifetime (`rules.track_at`): since `retention_epochs ≥ 1`, no entry goes
before that epoch has ended, and no credit can be spent twice. The per-validator RSA `mint`,
`redeem` and `credit_key` txs of before are no tx kinds any more (the envelope refuses them as
unknown).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from abci_app import (
    coverage,
    credit_buyers,
    credit_dkg,
    credit_holders,
    credit_locks,
    left_shards,
    prices,
    rules,
    schema,
)
from abci_app.codes import Code
from abci_app.state import State
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint
from protocol.committee.envelope import SignedTx
from protocol.credits import FUND_EPOCHS, CreditPurchase
from protocol.eip712 import recover_digest
from protocol.errors import ProtocolError
from protocol.paid_credits import spent_id
from protocol.payment import payment_domain
from protocol.threshold_mint import issue_epoch, period_redeemable, threshold_mint_id

MINT_KIND = "mint"  # the kind of a mint's charge in `spent/` and `cpend/` (settlement.py)
MAX_MINT_LIFETIME_S = 7 * 86_400  # bounds how long a mint's charge guard (`spent/`) is kept


def enabled(state: State) -> None:
    genesis = state.genesis
    if genesis.credit_price_wei is None or not (genesis.escrow_address and genesis.evm_chain_id):
        rules.reject(Code.CREDITS_DISABLED, "genesis has no credits section or no escrow")


def count_issued(state: State, epoch: int, field: str, count: int) -> None:
    """`cissue/<epoch>`.`field` ("funded" | "redeemed") += count."""
    key = schema.epoch_key(epoch)
    counts = state.get(schema.CREDIT_ISSUED, key) or {"funded": 0, "redeemed": 0}
    state.put(schema.CREDIT_ISSUED, key, {**counts, field: counts[field] + count})


def owe(state: State, epoch: int, wei: int) -> None:
    """The credit pool owes `wei` more to the workers of `epoch` (`cdue/<epoch>`: its close
    draws it, settlement.py)."""
    if wei > 0:
        key = schema.epoch_key(epoch)
        state.put(schema.CREDIT_DUE, key, str(int(state.get(schema.CREDIT_DUE, key) or 0) + wei))


# --- tx handlers --------------------------------------------------------------------------------


def period_group_key(state: State, period: int) -> bls.G2 | None:
    formed = credit_dkg.period_key(state, period)
    if formed is None:
        return None
    return bls.parse_g2(bytes.fromhex(formed["key"]), "committee key")


def credit_mint(state: State, tx: SignedTx) -> None:
    body: CreditMint = tx.body
    enabled(state)
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
    accept_mint(
        state,
        body,
        identifier,
        {
            "period": period,
            "issue_epoch": issued,
            "points": [point.hex() for point in body.blinded],
        },
    )


def accept_mint(state: State, body: CreditMint, identifier: str, extra: dict[str, Any]) -> None:
    """A mint's payment rules: amount = count · price, a new id, expiry, the payer's
    `CreditPurchase` signature over `identifier`, the payer's bound of unfunded mints; then the
    unfunded record (`extra`: its period, issue epoch and points)."""
    genesis = state.genesis
    current = rules.epoch_of(state, state.block_height)
    count = body.count
    price = genesis.credit_price_wei or 0
    if body.amount != count * price:
        rules.reject(
            Code.MINT_INVALID, f"amount {body.amount} is not {count} credits × {price} wei"
        )
    if state.get(schema.MINT, identifier) is not None:
        rules.reject(Code.MINT_REPLAYED, f"mint {identifier} was already minted")
    where = f"mint {identifier} of {body.payer}"
    if state.block_time > body.expiry:
        rules.reject(
            Code.AUTHORIZATION_EXPIRED,
            f"{where}: expired at {body.expiry} < block time {state.block_time}",
        )
    if body.expiry > state.block_time + MAX_MINT_LIFETIME_S:
        rules.reject(
            Code.AUTHORIZATION_EXPIRY_TOO_FAR,
            f"{where}: expiry {body.expiry} is more than {MAX_MINT_LIFETIME_S} s ahead",
        )
    escrow = (genesis.escrow_address or "").lower()
    charge = schema.charge_key(body.payer, escrow, MINT_KIND, identifier)
    if state.get(schema.SPENT, charge) is not None:
        rules.reject(Code.MINT_REPLAYED, f"{where}: already charged")
    purchase = CreditPurchase(
        mint_id=bytes.fromhex(identifier[2:]),
        credits=count,
        amount=body.amount,
        expiry=body.expiry,
        consumer=genesis.escrow_address or "",
    )
    try:
        domain = payment_domain(genesis.evm_chain_id or 0, genesis.escrow_address or "")
        signer = recover_digest(purchase.digest(domain), bytes.fromhex(body.signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.MINT_INVALID, f"{where}: {error.message}")
    if signer.lower() != body.payer:
        rules.reject(Code.MINT_INVALID, f"{where}: signed by {signer}, not by its payer")
    _bound_pending(state, body.payer, current, where)
    state.put(
        schema.MINT,
        identifier,
        {
            "epoch": current,
            "payer": body.payer,
            "count": count,
            "amount": str(body.amount),
            "expiry": body.expiry,
            **extra,
            "height": state.block_height,
            "vouched": [],
            "funded_height": None,
        },
    )
    lane = schema.NEW_PAYER_LANE
    if state.get(schema.MINT_BUYER, body.payer) is not None:
        lane = schema.BUYER_LANE
    waiting = f"{lane}/{identifier}"
    state.put(schema.MINT_UNFUNDED, waiting, 0)
    state.put(schema.MINT_BY_PAYER, f"{body.payer}/{identifier}", 0)
    _count_pending(state, body.payer, current, +1)
    rules.track(state, schema.MINT, identifier)
    rules.track(state, schema.MINT_UNFUNDED, waiting)
    rules.track(state, schema.MINT_BY_PAYER, f"{body.payer}/{identifier}")
    rules.track(state, schema.MINT_PAYER_PENDING, _pending_key(body.payer, current))
    state.emit("planet.mint", mint=identifier, epoch=current, credits=count)


def pending_held(read: Callable[[str, str], Any], payer: str, current: int) -> int:
    """How many unfunded mints `payer` holds that can still be funded in epoch `current` (of
    epochs current − FUND_EPOCHS … current): two counter reads (`mpp/<payer>/<epoch>`) through
    `read` (`state.get`, or `state.committed` for the mempool)."""
    return sum(
        int(read(schema.MINT_PAYER_PENDING, _pending_key(payer, epoch)) or 0)
        for epoch in range(max(1, current - FUND_EPOCHS), current + 1)
    )


def _bound_pending(state: State, payer: str, current: int, where: str) -> None:
    """MINT_PENDING_LIMIT when `payer` already holds genesis `credits.max_pending_mints`
    unfunded mints that can still be funded, whatever the payer sent before."""
    limit = state.genesis.credit_max_pending_mints
    held = pending_held(state.get, payer, current)
    if held >= limit:
        rules.reject(
            Code.MINT_PENDING_LIMIT,
            f"{where}: its payer already holds {held} unfunded mints (at most {limit}); "
            "one is funded or lapses when its funding window ends",
        )


def admit_mint(state: State, body: CreditMint) -> str | None:
    """Mempool admission of a mint (CheckTx, committed state only): why it would be refused
    MINT_PENDING_LIMIT in the next block, or None. FinalizeBlock decides; this keeps a payer's
    mints beyond its bound out of blocks."""
    if state.genesis.credit_price_wei is None:
        return None
    limit = state.genesis.credit_max_pending_mints
    held = pending_held(state.committed, body.payer, rules.epoch_of(state, state.height + 1))
    if held >= limit:
        return f"payer {body.payer} already holds {held} unfunded mints (at most {limit})"
    return None


def _pending_key(payer: str, epoch: int) -> str:
    return f"{payer}/{schema.epoch_key(epoch)}"


def _count_pending(state: State, payer: str, epoch: int, change: int) -> None:
    """`mpp/<payer>/<epoch>` += change (deleted at 0; pruned with the epoch)."""
    key = _pending_key(payer, epoch)
    count = int(state.get(schema.MINT_PAYER_PENDING, key) or 0) + change
    if count > 0:
        state.put(schema.MINT_PAYER_PENDING, key, count)
    elif count == 0 and state.get(schema.MINT_PAYER_PENDING, key) is not None:
        state.delete(schema.MINT_PAYER_PENDING, key)


def fund_mint(state: State, tx: SignedTx) -> None:
    """A validator vouches for a mint; at ≥ 2/3 of the power it is funded: charged to its
    payer's balance at the escrow (the pending debit of the next payout statement) and signable.
    A vote after that changes nothing (votes race; each validator's watcher sends its own)."""
    body: FundMint = tx.body
    enabled(state)
    validator = rules.validator(state, tx.signer)
    record = state.get(schema.MINT, body.mint)
    if record is None:
        rules.reject(Code.MINT_UNKNOWN, f"no mint {body.mint}")
    if "period" not in record:  # an RSA mint recorded before that form was retired
        rules.reject(Code.MINT_UNKNOWN, f"mint {body.mint} is of the retired RSA form")
    if record["funded_height"] is not None:
        return
    current = rules.epoch_of(state, state.block_height)
    if current > record["epoch"] + FUND_EPOCHS:
        rules.reject(
            Code.MINT_FUND_LATE,
            f"mint {body.mint} of epoch {record['epoch']} can be funded until epoch "
            f"{record['epoch'] + FUND_EPOCHS} (this block is in epoch {current})",
        )
    if state.block_time > record["expiry"]:
        rules.reject(
            Code.MINT_FUND_LATE,
            f"mint {body.mint}: its purchase expired at {record['expiry']} "
            f"< block time {state.block_time}",
        )
    vouched = sorted({*record["vouched"], validator["address"]})
    power = sum(state.by_address[a]["power"] for a in vouched if a in state.by_address)
    funded = state.has_two_thirds(power)
    if not funded:
        state.put(schema.MINT, body.mint, {**record, "vouched": vouched})
        return
    # signable from now until its deadline: t posted partial sets by then, or refunded
    # (mint_partials.py)
    deadline = state.block_height + state.genesis.credit_sign_blocks
    state.put(
        schema.MINT,
        body.mint,
        {
            **record,
            "vouched": vouched,
            "funded_height": state.block_height,
            "deadline": deadline,
            "signers": [],
            "refunded_height": None,
        },
    )
    # what a refund pays, kept with the deadline itself (the record may be pruned before it)
    refund = {"payer": record["payer"], "amount": record["amount"], "count": record["count"]}
    state.put(
        schema.MINT_SIGNING,
        schema.signing_key(deadline, body.mint),
        {**refund, "issue_epoch": record["issue_epoch"]},
    )
    for lane in (schema.BUYER_LANE, schema.NEW_PAYER_LANE):
        if state.get(schema.MINT_UNFUNDED, f"{lane}/{body.mint}") is not None:
            state.delete(schema.MINT_UNFUNDED, f"{lane}/{body.mint}")
    _count_pending(state, record["payer"], record["epoch"], -1)
    state.put(schema.MINT_BUYER, record["payer"], state.block_height)
    # paid for: the record (what `/credit_partials` answers from) stays as long as its credits
    # can be redeemed, so a client that comes back late still finishes its purchase
    state.delete(schema.PRUNE_INDEX, schema.prune_key(record["epoch"], schema.MINT, body.mint))
    lifetime = state.genesis.credit_lifetime_epochs
    issued = record["issue_epoch"]
    rules.track_at(state, schema.MINT, body.mint, issued + lifetime)
    escrow = (state.genesis.escrow_address or "").lower()
    charge = schema.charge_key(record["payer"], escrow, MINT_KIND, body.mint)
    state.put(schema.SPENT, charge, {"total": record["amount"], "expiry": record["expiry"]})
    rules.track_until(state, schema.SPENT, charge, record["expiry"])
    state.put(
        schema.PENDING_CHARGE,
        charge,
        {"from": "0", "total": record["amount"], "height": state.block_height},
    )
    count_issued(state, issued, "funded", record["count"])
    credit_buyers.note(state, record["period"], record["payer"], issued)
    state.emit("planet.mint_funded", mint=body.mint, epoch=record["epoch"])


def credit_redeem(state: State, tx: SignedTx) -> None:
    body: CreditRedeem = tx.body
    enabled(state)
    node = rules.compute_node(state, tx.signer)
    left_shards.check(state, tx.signer, node, body.model, body.shard)  # REDEEM_SHARD
    credit_holders.check_node_redemption(  # CREDIT_NOT_ASSIGNED
        state, tx.signer, body.model, body.shard, body.credits, body.assignments
    )
    spent = check_credits(state, body.credits, tx.signer)
    credit_work(state, tx.signer, node, body.model, body.shard, spent)


def check_credits(
    state: State, credits: Sequence[ThresholdCredit], redeemer: str
) -> list[tuple[str, int]]:
    """The checks every redemption makes (a node's `credit_redeem`, a relay's `relay_redeem`:
    one spent set for both), naming the first bad credit: each redeemable in this epoch
    (CREDIT_EPOCH), never redeemed nor listed twice (CREDIT_SPENT), not locked by another
    than `redeemer` (CREDIT_LOCKED), σ valid under its period's key (CREDIT_INVALID: one batch
    per period, then one by one). Returns (spent id, issue epoch) per credit; writes nothing."""
    plan = credit_dkg.schedule(state)
    epoch_length = state.genesis.epoch_length
    current = rules.epoch_of(state, state.block_height)
    lifetime = state.genesis.credit_lifetime_epochs
    by_period: dict[int, list[int]] = {}
    spent: list[tuple[str, int]] = []
    seen: set[str] = set()
    for index, credit in enumerate(credits):
        where = f"credit {index}"
        if not period_redeemable(plan, credit.period, epoch_length, current, lifetime):
            rules.reject(
                Code.CREDIT_EPOCH,
                f"{where}: a credit of key period {credit.period} is not redeemable in epoch "
                f"{current}",
            )
        identifier = spent_id(credit)
        if identifier in seen or state.get(schema.CREDIT_SPENT, identifier) is not None:
            rules.reject(Code.CREDIT_SPENT, f"{where}: already redeemed")
        credit_locks.check_redeemer(state, identifier, redeemer, where)  # CREDIT_LOCKED
        seen.add(identifier)
        by_period.setdefault(credit.period, []).append(index)
        spent.append((identifier, issue_epoch(plan, credit.period, epoch_length)))
    for period, indices in sorted(by_period.items()):
        key = period_group_key(state, period)
        if key is None:
            rules.reject(Code.CREDIT_INVALID, f"key period {period} has no committee key")
        batch = [credits[i] for i in indices]
        try:
            blind_bls.verify_credits(key, batch)
        except (blind_bls.ThresholdCreditError, bls.BlsError):
            for i in indices:  # name the first bad one
                try:
                    blind_bls.verify_credit(key, credits[i])
                except (blind_bls.ThresholdCreditError, bls.BlsError) as error:
                    rules.reject(Code.CREDIT_INVALID, f"credit {i}: {error.message}")
            rules.reject(Code.CREDIT_INVALID, f"a credit of key period {period} does not verify")
    return spent


def mark_spent(state: State, spent: list[tuple[str, int]]) -> None:
    """`cspent/<id>` per credit (kept until its window is over) and the issue counters."""
    lifetime = state.genesis.credit_lifetime_epochs
    redeemed: dict[int, int] = {}
    for identifier, epoch in spent:
        state.put(schema.CREDIT_SPENT, identifier, state.block_height)
        # kept until the credit's window is over: pruned with epoch e + lifetime, not before
        rules.track_at(state, schema.CREDIT_SPENT, identifier, epoch + lifetime)
        redeemed[epoch] = redeemed.get(epoch, 0) + 1
    for epoch, count in sorted(redeemed.items()):
        count_issued(state, epoch, "redeemed", count)


def credit_work(
    state: State,
    signer: str,
    node: dict[str, Any],
    model: str,
    shard: int,
    spent: list[tuple[str, int]],
) -> None:
    """A redemption's effects once every credit checked out (`spent`: (spent id, the epoch its
    credit counts in)): the node's registered price in committed positions consumed per credit
    (REDEMPTION_OVER_PRICE otherwise), the spent set, the issue counters, the credits' price due
    to this epoch, the node's credits and layer-tokens."""
    current = rules.epoch_of(state, state.block_height)
    price = prices.redemption_price(state, signer, shard)
    coverage.take_positions(state, signer, shard, len(spent), price)
    # a credit nobody locked is locked and spent by its redemption at once: it bought the
    # node's positions as a lock would have (coverage.py rule 5 sees the sale)
    unlocked = [i for i, _ in spent if state.get(schema.CREDIT_LOCK, i) is None]
    coverage.record_bought(state, signer, shard, len(unlocked))
    mark_spent(state, spent)
    owe(state, current, len(spent) * (state.genesis.credit_price_wei or 0))
    layer_tokens = len(spent) * state.genesis.credit_layer_tokens
    account = str(node["evm_address"]).lower()
    key = schema.credit_key(current, account, model, shard)
    previous: dict[str, Any] | None = state.get(schema.CREDIT, key)
    state.put(
        schema.CREDIT,
        key,
        {
            "account": account,
            "model": model,
            "shard": shard,
            "credits": (previous["credits"] if previous else 0) + len(spent),
            "layer_tokens": (previous["layer_tokens"] if previous else 0) + layer_tokens,
        },
    )
    state.emit("planet.redeem", node=signer, epoch=current, credits=len(spent))
