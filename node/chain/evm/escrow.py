"""`QueryEscrow`: per-query deposits, prepaid balances, committee-signed payout roots, claims.

Every payment names one gateway: a per-query deposit is bound to the gateway that may serve it,
and a prepaid balance belongs to a (payer, gateway) pair, spendable at that gateway only.

Deposit status: 0 None, 1 Funded, 2 Settled, 3 Reclaimed, 4 Refunded. Epoch status: 0 None,
1 Posted, 2 Disputed. A payout root's charges (query ids, fees, and the prepaid debits as
payers, gateways, debits) are re-supplied with the statement; the (payer, gateway) pairs ascend,
payer first (`EpochSettlement` lists them so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from node.chain.evm.sender import Binding, TxResult
from protocol.eip712 import PayoutRoot, as_address
from protocol.errors import ProtocolError


class QueryEscrow(Binding):
    NAME = "QueryEscrow"

    # --- deposits per query ---------------------------------------------------------------------

    def deposit(self, query_id: bytes, model_id: bytes, gateway: str, amount_wei: int) -> TxResult:
        """Prepay `query_id` for `model_id` at `gateway` (its signing address; the value is the
        fee cap). Only that gateway serves the query."""
        return self.transact(
            "deposit", query_id, model_id, as_address(gateway, "gateway"), value=amount_wei
        )

    def is_funded(self, query_id: bytes) -> bool:
        return self.call("isFunded", query_id)

    def deposit_of(self, query_id: bytes) -> dict[str, Any]:
        """{user, amount, status, deposited_at, model_id (bytes), gateway} in one call: everything
        a gateway checks before serving. Status 0 None, 1 Funded, 2 Settled, 3 Reclaimed,
        4 Refunded; model id and gateway are zero for an unknown query."""
        user, amount, status, deposited_at, model_id, gateway = self.call("depositOf", query_id)
        return {
            "user": user,
            "amount": int(amount),
            "status": int(status),
            "deposited_at": int(deposited_at),
            "model_id": bytes(model_id),
            "gateway": gateway,
        }

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
        gateways: Sequence[str] = (),
        debits: Sequence[int] = (),
    ) -> TxResult:
        """Post a committee-signed epoch statement (its queriesHash must match ids, fees and the
        prepaid debits — payers, gateways, debits —, its consumer must be this deployment's
        QueryEscrow). The (payer, gateway) pairs ascend, payer first."""
        self.require_consumer(statement)
        return self.transact(
            "postPayoutRoot",
            statement.epoch,
            statement.root,
            statement.total,
            _charges(query_ids, fees, payers, gateways, debits),
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
        gateways: Sequence[str] = (),
        debits: Sequence[int] = (),
    ) -> TxResult:
        """Freeze `epoch` with a second, different committee-signed statement for it (the
        posted charges are re-supplied: query ids, fees, payers, gateways, debits)."""
        self.require_consumer(other)
        return self.transact(
            "disputeRoot",
            epoch,
            _charges(query_ids, fees, payers, gateways, debits),
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

    def uncharged_of(self, epoch: int, payer: str, gateway: str) -> int:
        """The part of `payer`'s debit at `gateway` in `epoch` its balance there could not cover."""
        return int(
            self.call(
                "unchargedOf", epoch, as_address(payer, "payer"), as_address(gateway, "gateway")
            )
        )

    # --- prepaid balances, one per (payer, gateway) ---------------------------------------------

    def deposit_balance(self, gateway: str, amount_wei: int) -> TxResult:
        """Add `amount_wei` to this account's prepaid balance at `gateway` (only that gateway's
        charges spend it)."""
        return self.transact("depositBalance", as_address(gateway, "gateway"), value=amount_wei)

    def request_withdrawal(self, gateway: str) -> TxResult:
        """Start withdrawing the whole balance at `gateway` (opens after the refund timeout)."""
        return self.transact("requestWithdrawal", as_address(gateway, "gateway"))

    def cancel_withdrawal(self, gateway: str) -> TxResult:
        return self.transact("cancelWithdrawal", as_address(gateway, "gateway"))

    def withdraw_balance(self, gateway: str) -> TxResult:
        """Take what is left of the balance at `gateway` once its withdrawal has matured."""
        return self.transact("withdrawBalance", as_address(gateway, "gateway"))

    def prepaid_of(self, payer: str, gateway: str) -> dict[str, int]:
        """{balance, withdrawable_at} (0: no withdrawal requested) of `payer` at `gateway`."""
        balance, withdrawable_at = self.call(
            "prepaidOf", as_address(payer, "payer"), as_address(gateway, "gateway")
        )
        return {"balance": int(balance), "withdrawable_at": int(withdrawable_at)}


def _charges(
    query_ids: Sequence[bytes],
    fees: Sequence[int],
    payers: Sequence[str],
    gateways: Sequence[str],
    debits: Sequence[int],
) -> tuple[list[bytes], list[int], list[str], list[str], list[int]]:
    """The `Charges` tuple of postPayoutRoot / disputeRoot (addresses checksummed for web3)."""
    if not len(payers) == len(gateways) == len(debits):
        raise ProtocolError(
            f"{len(payers)} payers, {len(gateways)} gateways and {len(debits)} debits: "
            "one of each per prepaid debit"
        )
    return (
        list(query_ids),
        list(fees),
        [as_address(p, "payer") for p in payers],
        [as_address(g, "gateway") for g in gateways],
        list(debits),
    )
