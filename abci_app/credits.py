"""Bearer credits on the committee: epoch keys, mints paid from a prepaid balance, redemptions.

    credit_key{epoch e, key}   a validator publishes its RSA blind-signing key of epoch e
                               (generated on its own machine, never derived): current ≤ e ≤
                               current + 2 (CREDIT_KEY_EPOCH); once per (validator, e)
                               (DUPLICATE_CREDIT_KEY); an RSA key of 2048–4096 bits in
                               canonical DER, not published by another validator for e
                               (CREDIT_KEY_INVALID: a copied key would count one signature
                               twice). → `ckey/<e>/<validator key>`.
    mint{payer, epoch, blinded, amount, expiry, signature}
                               buy `count` credits: epoch = the block's epoch (CREDIT_EPOCH);
                               every listed validator has a key of that epoch and the listed
                               ones hold ≥ 2/3 of the power (NO_CREDIT_KEYS); each blinded
                               message has its key's length and is below its modulus, amount =
                               count · genesis price, the `CreditPurchase` signature recovers to
                               `payer` (MINT_INVALID); the mint id is new (MINT_REPLAYED); block
                               time ≤ expiry ≤ block time + 7 days (AUTHORIZATION_EXPIRED,
                               AUTHORIZATION_EXPIRY_TOO_FAR); the payer holds fewer than
                               genesis `credits.max_pending_mints` unfunded mints of the epochs
                               still fundable (MINT_PENDING_LIMIT: junk of its own cannot bury
                               its in-flight mint, issue 42). → `mint/<id>`, unfunded
                               (`mpend/<lane>/<id>`: lane 0 when the payer had a mint funded
                               before, so returning buyers list first; `mpay/<payer>/<id>`;
                               `mpp/<payer>/<epoch>` += 1): nothing charged or signed.
    fund_mint{mint}            a validator (its watcher read the payer's escrow balance and it
                               covers the mint: node/watcher/funding.py) vouches for it
                               (NOT_VALIDATOR; MINT_UNKNOWN; MINT_FUND_LATE after the mint's
                               epoch + FUND_EPOCHS or past its expiry). At ≥ 2/3 of the power
                               the mint is funded, once: a purchase of `amount` on the payer's
                               balance at the escrow's own address (`depositBalance(escrow)`):
                               `spent/` and `cpend/<payer>/<escrow>/mint/<id>`, debited by the
                               next close into the escrow's credit pool (settlement.py), and
                               `cissue/<mint epoch>`.funded += count; `mbuyer/<payer>` = the
                               height (a returning buyer from then on).
                               A vote on a funded mint changes nothing. Each validator then
                               blind-signs the mint's messages for it when asked
                               (`/credit_signatures?mint=`, answered from its local key).
    redeem{model, shard, credits}
                               a compute node, not LEFT, on a (model, shard) it registered
                               (REDEEM_SHARD), cashes credits: each of an epoch e with
                               e ≤ current ≤ e + genesis `credits.lifetime_epochs`
                               (CREDIT_EPOCH),
                               valid under e's keys (`protocol.credits.check_credit`:
                               CREDIT_INVALID), its nonce never redeemed nor listed twice
                               (CREDIT_SPENT), nor locked by another node (CREDIT_LOCKED:
                               credit_locks.py); the node's registered price p on the shard
                               (prices.py `redemption_price`) committed served positions of
                               the node on the shard, not yet consumed, per credit (coverage.py
                               `take_positions`: UNCOMMITTED_REDEMPTION, REDEMPTION_OVER_PRICE;
                               consumed).
                               → `cspent/<sha256 nonce>` per credit and
                               `credit/<current epoch>/<evm address>/<shard>/<model>` grows by
                               count · genesis `credits.layer_tokens`: the node's share record for
                               the epoch's payout (docs/shares.md), its only pay; the
                               credits' price is due to the epoch (`cdue/<current epoch>`: the
                               close draws it from the credit pool) and `cissue/<e>`.redeemed
                               grows per credit epoch e.

Whole txs are refused on any failing item (nothing written). Without genesis `credits` (or an
escrow) every credit tx but `credit_key` is CREDITS_DISABLED. The spent set is pruned with the
credit's last redeemable epoch, e + lifetime (`rules.track_at`): since `retention_epochs ≥ 1`,
no entry goes before that epoch has ended, and no credit can be spent twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from abci_app import coverage, credit_buyers, credit_locks, prices, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol import blindrsa
from protocol.blindrsa import RsaPublicKey
from protocol.committee.credits import CreditKey, FundMint, Mint, Redeem
from protocol.committee.envelope import SignedTx
from protocol.committee.threshold_credits import ThresholdMint
from protocol.credits import (
    FUND_EPOCHS,
    CreditInvalidError,
    CreditPurchase,
    EpochKeys,
    check_credit,
    mint_id,
    redeemable,
    spent_id,
)
from protocol.eip712 import recover_digest
from protocol.errors import ProtocolError
from protocol.payment import payment_domain

KEY_AHEAD = 2  # a key may be published for at most the epoch after next
MINT_KIND = "mint"  # the kind of a mint's charge in `spent/` and `cpend/` (settlement.py)
MAX_MINT_LIFETIME_S = 7 * 86_400  # bounds how long a mint's charge guard (`spent/`) is kept


def enabled(state: State) -> None:
    genesis = state.genesis
    if genesis.credit_price_wei is None or not (genesis.escrow_address and genesis.evm_chain_id):
        rules.reject(Code.CREDITS_DISABLED, "genesis has no credits section or no escrow")


def epoch_keys(state: State, epoch: int) -> EpochKeys:
    """The published credit keys of `epoch` with their validators' power (state reads only)."""
    keys: dict[str, tuple[RsaPublicKey, int]] = {}
    for key, record in state.items(schema.CREDIT_KEY, *schema.epoch_range(epoch)):
        validator = state.validator_by_signer(key.split("/", 1)[1])
        if validator is not None:
            public = RsaPublicKey.from_der(bytes.fromhex(record["key"]))
            keys[record["validator"]] = (public, validator["power"])
    return EpochKeys(epoch=epoch, keys=keys, total_power=state.total_power)


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


def credit_key(state: State, tx: SignedTx) -> None:
    body: CreditKey = tx.body
    validator = rules.validator(state, tx.signer)
    current = rules.epoch_of(state, state.block_height)
    if not current <= body.epoch <= current + KEY_AHEAD:
        rules.reject(
            Code.CREDIT_KEY_EPOCH,
            f"a credit key for epoch {body.epoch} must be published during epochs "
            f"{body.epoch - KEY_AHEAD} … {body.epoch} (this block is in epoch {current})",
        )
    entry = schema.in_epoch(body.epoch, tx.signer)
    if state.get(schema.CREDIT_KEY, entry) is not None:
        rules.reject(
            Code.DUPLICATE_CREDIT_KEY, f"a credit key for epoch {body.epoch} is already published"
        )
    try:
        public = RsaPublicKey.from_der(body.key)
    except blindrsa.BlindRsaError as error:
        rules.reject(Code.CREDIT_KEY_INVALID, error.message)
    if public.to_der() != body.key:
        rules.reject(Code.CREDIT_KEY_INVALID, "the key is not in canonical DER")
    for _, record in state.items(schema.CREDIT_KEY, *schema.epoch_range(body.epoch)):
        if record["key"] == body.key.hex():
            rules.reject(
                Code.CREDIT_KEY_INVALID, f"validator {record['validator']} published this key"
            )
    state.put(
        schema.CREDIT_KEY,
        entry,
        {
            "epoch": body.epoch,
            "validator": validator["address"],
            "key": body.key.hex(),
            "height": state.block_height,
        },
    )
    state.emit("planet.credit_key", epoch=body.epoch, validator=validator["address"])


def mint(state: State, tx: SignedTx) -> None:
    body: Mint = tx.body
    enabled(state)
    current = rules.epoch_of(state, state.block_height)
    if body.epoch != current:
        rules.reject(Code.CREDIT_EPOCH, f"a mint of epoch {body.epoch} in epoch {current}")
    keys = epoch_keys(state, current)
    power = 0
    for address, messages in body.blinded.items():
        entry = keys.keys.get(address)
        if entry is None:
            rules.reject(
                Code.NO_CREDIT_KEYS, f"validator {address} has no credit key in epoch {current}"
            )
        public, weight = entry
        power += weight
        for message in messages:
            if len(message) != public.modulus_len or int.from_bytes(message, "big") >= public.n:
                rules.reject(Code.MINT_INVALID, f"a blinded message does not fit {address}'s key")
    if not state.has_two_thirds(power):
        rules.reject(
            Code.NO_CREDIT_KEYS, f"the listed keys hold {power} of {state.total_power} power"
        )
    identifier = mint_id(body.payer, body.epoch, body.blinded)
    blinded = {a: [m.hex() for m in body.blinded[a]] for a in sorted(body.blinded)}
    accept_mint(state, body, identifier, {"blinded": blinded})


def accept_mint(state: State, body: Any, identifier: str, extra: dict[str, Any]) -> None:
    """The rules every mint form shares (RSA `mint`, threshold `credit_mint`): amount = count ·
    price, a new id, expiry, the payer's `CreditPurchase` signature over `identifier`, the
    payer's bound of unfunded mints; then the unfunded record (`extra` adds its own fields)."""
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


def admit_mint(state: State, body: Mint | ThresholdMint) -> str | None:
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
    state.put(
        schema.MINT,
        body.mint,
        {**record, "vouched": vouched, "funded_height": state.block_height if funded else None},
    )
    if not funded:
        return
    for lane in (schema.BUYER_LANE, schema.NEW_PAYER_LANE):
        if state.get(schema.MINT_UNFUNDED, f"{lane}/{body.mint}") is not None:
            state.delete(schema.MINT_UNFUNDED, f"{lane}/{body.mint}")
    _count_pending(state, record["payer"], record["epoch"], -1)
    state.put(schema.MINT_BUYER, record["payer"], state.block_height)
    # paid for: the record (what `/credit_signatures` answers from) stays as long as its credits
    # can be redeemed, so a client that comes back late still finishes its purchase
    state.delete(schema.PRUNE_INDEX, schema.prune_key(record["epoch"], schema.MINT, body.mint))
    lifetime = state.genesis.credit_lifetime_epochs
    issued = record.get("issue_epoch", record["epoch"])  # a threshold mint's: its period's
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
    if "period" in record:
        credit_buyers.note(state, record["period"], record["payer"], issued)
    state.emit("planet.mint_funded", mint=body.mint, epoch=record["epoch"])


def redeem(state: State, tx: SignedTx) -> None:
    body: Redeem = tx.body
    enabled(state)
    node = rules.compute_node(state, tx.signer)
    if body.model != node["model"] or body.shard not in node["shards"]:
        rules.reject(
            Code.REDEEM_SHARD, f"shard {body.shard} of {body.model} is not registered by this node"
        )
    current = rules.epoch_of(state, state.block_height)
    lifetime = state.genesis.credit_lifetime_epochs
    keys_of: dict[int, EpochKeys] = {}
    spent: list[tuple[str, int]] = []
    for index, credit in enumerate(body.credits):
        where = f"credit {index}"
        if not redeemable(credit.epoch, current, lifetime):
            rules.reject(
                Code.CREDIT_EPOCH,
                f"{where}: a credit of epoch {credit.epoch} is not redeemable in epoch {current}",
            )
        keys = keys_of.get(credit.epoch) or epoch_keys(state, credit.epoch)
        keys_of[credit.epoch] = keys
        try:
            check_credit(keys, credit)
            identifier = spent_id(credit.prepared)
        except CreditInvalidError as error:
            rules.reject(Code.CREDIT_INVALID, f"{where}: {error.reason}")
        if (
            any(identifier == seen for seen, _ in spent)
            or state.get(schema.CREDIT_SPENT, identifier) is not None
        ):
            rules.reject(Code.CREDIT_SPENT, f"{where}: already redeemed")
        credit_locks.check_redeemer(state, identifier, tx.signer, where)
        spent.append((identifier, credit.epoch))
    credit_work(state, tx.signer, node, body.model, body.shard, spent)


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
    to this epoch, the node's layer-tokens."""
    current = rules.epoch_of(state, state.block_height)
    lifetime = state.genesis.credit_lifetime_epochs
    price = prices.redemption_price(state, signer, shard)
    coverage.take_positions(state, signer, shard, len(spent), price)
    redeemed: dict[int, int] = {}
    for identifier, epoch in spent:
        state.put(schema.CREDIT_SPENT, identifier, state.block_height)
        # kept until the credit's window is over: pruned with epoch e + lifetime, not before
        rules.track_at(state, schema.CREDIT_SPENT, identifier, epoch + lifetime)
        redeemed[epoch] = redeemed.get(epoch, 0) + 1
    for epoch, count in sorted(redeemed.items()):
        count_issued(state, epoch, "redeemed", count)
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
            "layer_tokens": (previous["layer_tokens"] if previous else 0) + layer_tokens,
        },
    )
    state.emit("planet.redeem", node=signer, epoch=current, credits=len(spent))
