"""Payment checks against QueryEscrow and the receipts the gateway signs.

A request pays with its API key (see `protocol.payment`): a per-query deposit proof
(`planet-pay-v1`) or a prepaid voucher (`planet-voucher-v1`).

Per-query: `PaymentDesk.reserve` accepts it only when, on chain (`QueryEscrow.depositOf` and the
`Deposited` event):

    the deposit exists and is Funded               else 402 payment_unfunded / payment_closed
    the proof's signer is the depositor            else 402 payment_squatted
    the deposit was made for this model            else 402 payment_wrong_model
    fee cap <= deposit, and price × (prompt tokens + max_tokens) <= fee cap
                                                   else 402 payment_underfunded
    the query id was never served by this gateway  else 402 payment_used
    its refund opens more than `refund_margin_s` from now (default 0: not yet open)
                                                   else 402 payment_expiring

The query id is reserved before the first await (two requests racing with one id: one wins).
`settle` charges fee = price × (prompt + completion tokens) (<= the checked amount <= fee cap
<= deposit), signs a `Receipt` with the gateway wallet and records the id as used; `release`
(the question failed) frees the id and charges nothing — the deposit stays refundable through
`QueryEscrow.refund` after its timeout. Receipts are kept in memory and appended to a JSON-lines
file when one is configured (reloaded at start, so a restart does not serve an id twice).

Prepaid: the voucher's payer is whoever its signature recovers to (for this gateway, model and
escrow); `reserve` accepts it only when

    the voucher has not expired and expires within `max_voucher_lifetime_s`
                                                   else 402 voucher_expired / voucher_expiry_too_far
    price × (prompt tokens + max_tokens) <= its fee cap          else 402 voucher_over_cap
    its query id was never served by this gateway                else 402 voucher_replayed
    the payer has no withdrawal pending (`prepaidOf`)            else 402 balance_withdrawing
    that amount <= balance − this gateway's outstanding for the payer
                                                   else 402 balance_insufficient

The outstanding amount is what this gateway reserved for the payer's questions in flight plus
the fees it charged that are not yet debited on chain; checking and reserving happen with no
await in between, so concurrent questions cannot overdraw the balance. A prepaid receipt
carries `payer` and the signed voucher (the committee's input for the debit). When the root that
debits those fees is posted, the gateway→chain reporting calls `mark_debited(query_ids)` (also
persisted in the receipts file); until then a restart keeps them outstanding.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from node.gateway.errors import NoCircuit, PaymentRequired
from protocol.eip712 import Domain, sign_digest
from protocol.errors import PlanetError, ProtocolError
from protocol.payment import (
    PaymentKeyError,
    PaymentProof,
    Receipt,
    VoucherKeyError,
    VoucherProof,
    circuit_hash,
    receipt_json,
)

log = logging.getLogger(__name__)

FUNDED = 1
STATUS_NAMES = {0: "none", 1: "funded", 2: "settled", 3: "reclaimed", 4: "refunded"}


@dataclass(frozen=True, slots=True)
class OnChainDeposit:
    user: str  # checksummed depositor
    amount: int  # wei the query still holds
    status: int  # 0 None, 1 Funded, 2 Settled, 3 Reclaimed, 4 Refunded
    model_id: bytes | None  # from the Deposited event (None when not found)
    refund_at: int = 0  # unix s when the depositor may take an unsettled deposit back (0: unknown)


@dataclass(frozen=True, slots=True)
class OnChainBalance:
    balance: int  # prepaid wei left (`QueryEscrow.prepaidOf`)
    withdrawable_at: int  # 0: no withdrawal requested


class EscrowReader(Protocol):
    async def deposit(self, query_id: bytes) -> OnChainDeposit: ...

    async def prepaid(self, payer: str) -> OnChainBalance: ...


class ChainEscrow:
    """QueryEscrow read through `node.chain.evm.account.PlanetChain` (blocking web3 in a thread)."""

    def __init__(self, chain: Any) -> None:
        self.chain = chain
        self._escrow = chain.deployment.address("QueryEscrow")
        self._topic = chain.contracts["QueryEscrow"].events.Deposited().topic
        self._from_block = max(0, int(getattr(chain.deployment, "block", 0) or 0) - 1)
        self._refund_timeout: int | None = None

    def _read(self, query_id: bytes) -> OnChainDeposit:
        state = self.chain.escrow.deposit_of(query_id)
        logs = self.chain._rpc(
            lambda: self.chain.w3.eth.get_logs(
                {
                    "address": self._escrow,
                    "fromBlock": self._from_block,
                    "toBlock": "latest",
                    "topics": [self._topic, "0x" + query_id.hex()],
                }
            )
        )
        model_id = bytes(logs[0]["topics"][3]) if logs else None
        if self._refund_timeout is None:
            self._refund_timeout = self.chain.escrow.refund_timeout()
        deposited_at = int(state["deposited_at"])
        refund_at = deposited_at + self._refund_timeout if deposited_at else 0
        return OnChainDeposit(
            state["user"], int(state["amount"]), int(state["status"]), model_id, refund_at
        )

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        try:
            return await asyncio.to_thread(self._read, query_id)
        except PlanetError as error:
            raise NoCircuit(
                "chain_unavailable", f"cannot read the deposit from the EVM chain: {error}"
            ) from None

    async def prepaid(self, payer: str) -> OnChainBalance:
        try:
            state = await asyncio.to_thread(self.chain.escrow.prepaid_of, payer, self.chain.address)
        except PlanetError as error:
            raise NoCircuit(
                "chain_unavailable", f"cannot read the balance from the EVM chain: {error}"
            ) from None
        return OnChainBalance(state["balance"], state["withdrawable_at"])


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reserved query: what was checked and how much may be charged at most."""

    proof: PaymentProof | VoucherProof
    depositor: str  # the depositor, or the voucher's payer
    allowed_wei: int

    @property
    def prepaid(self) -> bool:
        return isinstance(self.proof, VoucherProof)

    @property
    def query_hex(self) -> str:
        return "0x" + self.proof.query_id.hex()


class PaymentDesk:
    def __init__(
        self,
        escrow: EscrowReader,
        *,
        domain: Domain,
        gateway_address: str,
        gateway_key: bytes,
        model_id: bytes,
        price_wei_per_token: int,
        receipts_path: Path | None = None,
        max_voucher_lifetime_s: int = 86_400,
        refund_margin_s: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.escrow = escrow
        self.domain = domain
        self.gateway = gateway_address
        self._key = gateway_key
        self.model_id = model_id
        self.price = price_wei_per_token
        self.receipts_path = receipts_path
        self._in_flight: set[bytes] = set()
        self._receipts: dict[bytes, dict[str, Any]] = {}
        self._holders: dict[bytes, bytes] = {}  # query id → holder_digest of the proof used
        self._file_lock = threading.Lock()
        self.max_voucher_lifetime_s = max_voucher_lifetime_s
        # A deposit whose refund opens sooner is refused: its user could take it back before the
        # epoch's root lands (the escrow then skips it and the epoch pays pro rata).
        self.refund_margin_s = refund_margin_s
        self._clock = clock
        # payer → wei reserved for its questions in flight + fees charged, not yet debited
        self._outstanding: dict[str, int] = {}
        self._undebited: dict[bytes, tuple[str, int]] = {}  # query id → (payer, fee)
        if receipts_path is not None and receipts_path.exists():
            self._load(receipts_path)

    def _load(self, path: Path) -> None:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                entry = json.loads(line)
                if "debited" in entry:
                    self._forget([bytes.fromhex(q[2:]) for q in entry["debited"]])
                    continue
                doc, holder = entry["receipt"], bytes.fromhex(entry["holder"])
                query = bytes.fromhex(doc["query_id"][2:])
                self._receipts[query] = doc
                self._holders[query] = holder
                if "payer" in doc:
                    self._charge(query, doc["payer"], int(doc["fee_wei"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("skipping a damaged receipt line=%d file=%s", number, path)

    def required_wei(self, prompt_tokens: int, max_tokens: int) -> int:
        return self.price * (prompt_tokens + max_tokens)

    async def reserve(
        self, proof: PaymentProof | VoucherProof | PaymentKeyError, required_wei: int
    ) -> Reservation:
        if isinstance(proof, VoucherKeyError):
            raise PaymentRequired(
                "voucher_malformed",
                f"payment required: {proof.message}. Send planet-voucher-v1.<query id>."
                "<fee cap>.<expiry>.<signature> as the API key",
            )
        if isinstance(proof, PaymentKeyError):
            raise PaymentRequired(
                "payment_malformed",
                f"payment required: {proof.message}. Deposit into QueryEscrow and send "
                "planet-pay-v1.<query id>.<fee cap>.<signature> as the API key",
            )
        query = proof.query_id
        if query in self._receipts or query in self._in_flight:
            if isinstance(proof, VoucherProof):
                raise PaymentRequired(
                    "voucher_replayed",
                    f"query 0x{query.hex()} was already used; sign a voucher with a new query id",
                )
            raise PaymentRequired(
                "payment_used", f"query 0x{query.hex()} was already used; make a new deposit"
            )
        self._in_flight.add(query)
        try:
            if isinstance(proof, VoucherProof):
                return await self._check_voucher(proof, required_wei)
            return await self._check(proof, required_wei)
        except BaseException:
            self._in_flight.discard(query)
            raise

    async def _check_voucher(self, proof: VoucherProof, required_wei: int) -> Reservation:
        now = int(self._clock())
        if proof.expiry <= now:
            raise PaymentRequired(
                "voucher_expired",
                f"the voucher expired at {proof.expiry} (now {now}); sign a new one",
            )
        if proof.expiry > now + self.max_voucher_lifetime_s:
            raise PaymentRequired(
                "voucher_expiry_too_far",
                f"the voucher expires at {proof.expiry}, more than "
                f"{self.max_voucher_lifetime_s} s from now; sign one that expires sooner",
            )
        if required_wei > proof.fee_cap:
            raise PaymentRequired(
                "voucher_over_cap",
                f"this question may cost up to {required_wei} wei (price {self.price} wei × "
                f"(prompt tokens + max_tokens)); the voucher allows {proof.fee_cap} wei",
            )
        try:
            payer = proof.payer(self.model_id, self.gateway, self.domain)
        except ProtocolError as error:
            raise PaymentRequired(
                "voucher_invalid", f"the voucher signature is invalid: {error}"
            ) from None
        account = await self.escrow.prepaid(payer)
        # No await from here to the reservation: concurrent questions see each other's holds.
        if account.withdrawable_at != 0:
            raise PaymentRequired(
                "balance_withdrawing",
                f"the prepaid balance of {payer} is being withdrawn; cancel the withdrawal "
                "or deposit from another wallet",
            )
        available = account.balance - self._outstanding.get(payer, 0)
        if required_wei > available:
            raise PaymentRequired(
                "balance_insufficient",
                f"this question may cost up to {required_wei} wei but the prepaid balance of "
                f"{payer} has {max(available, 0)} wei not yet committed at this gateway; "
                "deposit more (planet balance deposit)",
            )
        self._outstanding[payer] = self._outstanding.get(payer, 0) + required_wei
        return Reservation(proof, payer, required_wei)

    async def _check(self, proof: PaymentProof, required_wei: int) -> Reservation:
        query = "0x" + proof.query_id.hex()
        deposit = await self.escrow.deposit(proof.query_id)
        if deposit.status == 0:
            raise PaymentRequired("payment_unfunded", f"query {query} has no deposit in the escrow")
        if deposit.status != FUNDED:
            state = STATUS_NAMES.get(deposit.status, str(deposit.status))
            raise PaymentRequired(
                "payment_closed", f"query {query} is {state}, not funded; make a new deposit"
            )
        try:
            signer = proof.signer(self.model_id, self.gateway, self.domain)
        except ProtocolError as error:
            raise PaymentRequired(
                "payment_squatted", f"the payment signature is invalid: {error}"
            ) from None
        if signer != deposit.user:
            raise PaymentRequired(
                "payment_squatted",
                f"the payment proof for query {query} is not signed by its depositor "
                "(or not for this gateway and model)",
            )
        if deposit.model_id != self.model_id:
            raise PaymentRequired(
                "payment_wrong_model", f"query {query} was deposited for another model"
            )
        if deposit.refund_at and deposit.refund_at < int(self._clock()) + self.refund_margin_s:
            raise PaymentRequired(
                "payment_expiring",
                f"the deposit of query {query} becomes refundable at {deposit.refund_at}, too "
                "soon for this gateway to settle it; make a new deposit",
            )
        if proof.fee_cap > deposit.amount:
            raise PaymentRequired(
                "payment_underfunded",
                f"the fee cap {proof.fee_cap} wei exceeds the deposit of {deposit.amount} wei",
            )
        if required_wei > proof.fee_cap:
            raise PaymentRequired(
                "payment_underfunded",
                f"this question may cost up to {required_wei} wei (price {self.price} wei × "
                f"(prompt tokens + max_tokens)); the payment allows {proof.fee_cap} wei",
            )
        return Reservation(proof, deposit.user, required_wei)

    def release(self, reservation: Reservation) -> None:
        """The question failed: no charge, the id can be used again."""
        self._in_flight.discard(reservation.proof.query_id)
        if reservation.prepaid:
            self._hold(reservation.depositor, -reservation.allowed_wei)
        log.info("payment released (no charge) query=%s", reservation.query_hex[:18])

    def settle(
        self,
        reservation: Reservation,
        prompt_tokens: int,
        completion_tokens: int,
        node_keys: Sequence[str],
    ) -> dict[str, Any]:
        """Charge for what was served; the signed receipt (as JSON)."""
        fee = min(self.price * (prompt_tokens + completion_tokens), reservation.allowed_wei)
        receipt = Receipt(
            query_id=reservation.proof.query_id,
            gateway=self.gateway,
            model_id=self.model_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            fee=fee,
            circuit_hash=circuit_hash(node_keys),
        )
        signature = sign_digest(self._key, receipt.digest(self.domain))
        voucher = None
        if isinstance(reservation.proof, VoucherProof):
            voucher = (reservation.depositor, reservation.proof)
            self._hold(reservation.depositor, -reservation.allowed_wei)
            self._charge(reservation.proof.query_id, reservation.depositor, fee)
        doc = receipt_json(receipt, signature, node_keys, voucher)
        holder = holder_digest(reservation.proof)
        self._receipts[reservation.proof.query_id] = doc
        self._holders[reservation.proof.query_id] = holder
        self._in_flight.discard(reservation.proof.query_id)
        if self.receipts_path is not None:
            line = json.dumps({"receipt": doc, "holder": holder.hex()}, separators=(",", ":"))
            with self._file_lock, open(self.receipts_path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        log.info(
            "served query=%s fee=%d tokens=%d", reservation.query_hex[:18], fee, completion_tokens
        )
        return doc

    def receipt(self, query_id: bytes) -> dict[str, Any] | None:
        return self._receipts.get(query_id)

    def outstanding(self, payer: str) -> int:
        """Wei this gateway holds against `payer`'s balance: in flight + charged, not debited."""
        return self._outstanding.get(payer, 0)

    def undebited(self) -> dict[bytes, tuple[str, int]]:
        """Prepaid charges served here and not yet debited on chain: query id → (payer, fee)."""
        return dict(self._undebited)

    def mark_debited(self, query_ids: Iterable[bytes]) -> int:
        """The posted root debited these prepaid queries: stop counting them against their
        payers' balances (persisted in the receipts file). Returns how many were outstanding."""
        ids = [q for q in query_ids if q in self._undebited]
        self._forget(ids)
        if ids and self.receipts_path is not None:
            line = json.dumps({"debited": ["0x" + q.hex() for q in ids]}, separators=(",", ":"))
            with self._file_lock, open(self.receipts_path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return len(ids)

    def _hold(self, payer: str, delta: int) -> None:
        left = self._outstanding.get(payer, 0) + delta
        if left > 0:
            self._outstanding[payer] = left
        else:
            self._outstanding.pop(payer, None)

    def _charge(self, query: bytes, payer: str, fee: int) -> None:
        self._undebited[query] = (payer, fee)
        self._hold(payer, fee)

    def _forget(self, query_ids: Iterable[bytes]) -> None:
        for query in query_ids:
            entry = self._undebited.pop(query, None)
            if entry is not None:
                self._hold(entry[0], -entry[1])

    def receipt_for(
        self, proof: PaymentProof | VoucherProof | PaymentKeyError
    ) -> dict[str, Any] | None:
        """The receipt of the query this proof paid, only for the holder of that proof (a
        receipt links a query id, public on chain, to the circuit's nodes: strangers get
        nothing)."""
        if isinstance(proof, PaymentKeyError):
            return None
        holder = self._holders.get(proof.query_id)
        if holder is None or not hmac.compare_digest(holder, holder_digest(proof)):
            return None
        return self._receipts.get(proof.query_id)


def holder_digest(proof: PaymentProof | VoucherProof) -> bytes:
    """sha256 over the proof that paid a query (what `GET /v1/receipts` asks for again)."""
    if isinstance(proof, VoucherProof):
        return hashlib.sha256(
            b"voucher"
            + proof.query_id
            + proof.fee_cap.to_bytes(32, "big")
            + proof.expiry.to_bytes(8, "big")
            + proof.signature
        ).digest()
    return hashlib.sha256(
        proof.query_id + proof.fee_cap.to_bytes(32, "big") + proof.signature
    ).digest()
