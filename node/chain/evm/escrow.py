"""`QueryEscrow`: per-query deposits, prepaid balances, committee-signed payout roots, claims.

Deposit status: 0 None, 1 Funded, 2 Settled, 3 Reclaimed, 4 Refunded. Epoch status: 0 None,
1 Posted, 2 Disputed. A payout root's charges (query ids, fees, prepaid payers and debits) are
re-supplied with the statement; payers ascend by address (`EpochSettlement.payers` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from node.chain.evm.sender import Binding, TxResult
from protocol.eip712 import PayoutRoot, as_address


class QueryEscrow(Binding):
    NAME = "QueryEscrow"

    # --- deposits per query ---------------------------------------------------------------------

    def deposit(self, query_id: bytes, model_id: bytes, amount_wei: int) -> TxResult:
        """Prepay `query_id` (the value is the fee cap)."""
        return self.transact("deposit", query_id, model_id, value=amount_wei)

    def is_funded(self, query_id: bytes) -> bool:
        return self.call("isFunded", query_id)

    def deposit_of(self, query_id: bytes) -> dict[str, Any]:
        """{user, amount, status, deposited_at}; status 0 None, 1 Funded, 2 Settled,
        3 Reclaimed, 4 Refunded."""
        user, amount, status, deposited_at = self.call("depositOf", query_id)
        return {"user": user, "amount": amount, "status": status, "deposited_at": deposited_at}

    def refund(self, query_id: bytes) -> TxResult:
        """Take back what `query_id` still holds (all of it after the timeout if unsettled, or
        the part its fee did not use once settled)."""
        return self.transact("refund", query_id)

    def refund_timeout(self) -> int:
        """Seconds before an unsettled deposit refunds, and a requested withdrawal opens."""
        return int(self.call("refundTimeout"))

    # --- payout roots and claims ----------------------------------------------------------------

    def post_payout_root(
        self,
        statement: PayoutRoot,
        query_ids: Sequence[bytes],
        fees: Sequence[int],
        signatures: Sequence[bytes],
        *,
        payers: Sequence[str] = (),
        debits: Sequence[int] = (),
    ) -> TxResult:
        """Post a committee-signed epoch statement (its queriesHash must match ids, fees, payers
        and debits, its consumer must be this deployment's QueryEscrow). Payers ascend by
        address (`EpochSettlement.payers` does)."""
        self.require_consumer(statement)
        return self.transact(
            "postPayoutRoot",
            statement.epoch,
            statement.root,
            statement.total,
            _charges(query_ids, fees, payers, debits),
            list(signatures),
        )

    def claim(self, epoch: int, amount: int, proof: Sequence[bytes]) -> TxResult:
        """Claim this account's leaf `(epoch, sender address, amount)` of the epoch's payout tree
        (only the payee itself may claim: the escrow pays the caller; an epoch that collected
        less than it signed pays pro rata)."""
        return self.transact("claim", epoch, self.sender.address, amount, list(proof))

    def dispute_root(
        self,
        epoch: int,
        query_ids: Sequence[bytes],
        fees: Sequence[int],
        posted_signatures: Sequence[bytes],
        other: PayoutRoot,
        other_signatures: Sequence[bytes],
        *,
        payers: Sequence[str] = (),
        debits: Sequence[int] = (),
    ) -> TxResult:
        """Freeze `epoch` with a second, different committee-signed statement for it (the
        posted charges are re-supplied: query ids, fees, payers, debits)."""
        self.require_consumer(other)
        return self.transact(
            "disputeRoot",
            epoch,
            _charges(query_ids, fees, payers, debits),
            list(posted_signatures),
            (other.root, other.total, other.queries_hash),
            list(other_signatures),
        )

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        """{root, unclaimed, claimable_at, status (0 None 1 Posted 2 Disputed)}."""
        root, unclaimed, claimable_at, status = self.call("epochOf", epoch)
        return {
            "root": root,
            "unclaimed": unclaimed,
            "claimable_at": claimable_at,
            "status": status,
        }

    def is_claimed(self, epoch: int, account: str) -> bool:
        return self.call("claimed", epoch, account)

    def shortfall_of(self, epoch: int) -> dict[str, int]:
        """{total, collected}: both 0 unless the epoch collected less than it signed."""
        total, collected = self.call("shortfallOf", epoch)
        return {"total": int(total), "collected": int(collected)}

    # --- prepaid balances -----------------------------------------------------------------------

    def deposit_balance(self, amount_wei: int) -> TxResult:
        """Add `amount_wei` to this account's prepaid balance (vouchers spend it)."""
        return self.transact("depositBalance", value=amount_wei)

    def request_withdrawal(self) -> TxResult:
        """Start withdrawing the whole prepaid balance (opens after the refund timeout)."""
        return self.transact("requestWithdrawal")

    def cancel_withdrawal(self) -> TxResult:
        return self.transact("cancelWithdrawal")

    def withdraw_balance(self) -> TxResult:
        """Take the remaining prepaid balance once the requested withdrawal has matured."""
        return self.transact("withdrawBalance")

    def prepaid_of(self, payer: str | None = None) -> dict[str, int]:
        """{balance, withdrawable_at} (0: no withdrawal requested) of `payer` (default: self)."""
        balance, withdrawable_at = self.call("prepaidOf", payer or self.sender.address)
        return {"balance": int(balance), "withdrawable_at": int(withdrawable_at)}


def _charges(
    query_ids: Sequence[bytes], fees: Sequence[int], payers: Sequence[str], debits: Sequence[int]
) -> tuple[list[bytes], list[int], list[str], list[int]]:
    """The `Charges` tuple of postPayoutRoot / disputeRoot (payers checksummed for web3)."""
    return (list(query_ids), list(fees), [as_address(p, "payer") for p in payers], list(debits))
