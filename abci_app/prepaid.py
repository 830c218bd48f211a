"""Prepaid charges: a debit of a payer's `QueryEscrow` balance the next payout root carries.

Two rules write them: a gateway's `work_report.prepaid` (settlement.py, one per voucher) and a
`mint` of credits (credits.py, one per purchase). Both check the same things before writing and
write the same records, so the epoch close debits them alike:

    check_new(state, payer, charge_id, fee, cap, expiry, where)
        refuse: no escrow (SETTLEMENT_DISABLED), fee > cap (VOUCHER_INVALID), block time past
        the expiry (VOUCHER_EXPIRED), expiry more than MAX_VOUCHER_LIFETIME_S ahead
        (VOUCHER_EXPIRY_TOO_FAR), (payer, charge id) charged before (VOUCHER_REPLAYED)
    record(state, payer, charge_id, fee, cap, expiry)
        `vpend/<payer>/<charge id>` = {fee, cap} (debited at the close) and the replay guard
        `vseen/<payer>/<charge id>` = expiry, deleted once block time is past the expiry
"""

from __future__ import annotations

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State

MAX_VOUCHER_LIFETIME_S = 7 * 86_400  # bounds how long a charged voucher's guard is kept


def check_new(
    state: State, payer: str, charge_id: str, fee: int, cap: int, expiry: int, where: str
) -> None:
    """Refuse a charge the chain must not debit (module docstring); no writes."""
    genesis = state.genesis
    if not (genesis.escrow_address and genesis.evm_chain_id):
        rules.reject(Code.SETTLEMENT_DISABLED, "genesis has no evm {chain_id, escrow_address}")
    if fee > cap:
        rules.reject(Code.VOUCHER_INVALID, f"{where}: fee {fee} above its cap {cap}")
    if state.block_time > expiry:
        rules.reject(
            Code.VOUCHER_EXPIRED, f"{where}: expired at {expiry} < block time {state.block_time}"
        )
    if expiry > state.block_time + MAX_VOUCHER_LIFETIME_S:
        rules.reject(
            Code.VOUCHER_EXPIRY_TOO_FAR,
            f"{where}: expiry {expiry} is more than {MAX_VOUCHER_LIFETIME_S} s ahead",
        )
    key = schema.charge_key(payer, charge_id)
    if (
        state.get(schema.PENDING_CHARGE, key) is not None
        or state.get(schema.SEEN_VOUCHER, key) is not None
    ):
        rules.reject(Code.VOUCHER_REPLAYED, f"{where}: already charged")


def record(state: State, payer: str, charge_id: str, fee: int, cap: int, expiry: int) -> None:
    """Write the pending debit and its replay guard (module docstring)."""
    key = schema.charge_key(payer, charge_id)
    state.put(schema.PENDING_CHARGE, key, {"fee": str(fee), "cap": str(cap)})
    state.put(schema.SEEN_VOUCHER, key, expiry)
    rules.track_until(state, schema.SEEN_VOUCHER, key, expiry)
