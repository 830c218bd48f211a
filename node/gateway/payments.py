"""The payment desk: a question's payment checked before serving, held while it runs, charged
(or released) once, and the receipt the gateway signs for it.

A request pays with its API key (`protocol.payment.parse_bearer`), one of three kinds:

    planet-pay-v1      a per-query deposit in QueryEscrow (one question)
    planet-voucher-v1  a prepaid payer's voucher (one question, paid from its balance)
    planet-key-v1      a prepaid payer's payment key (many questions, up to its cap in all)

`reserve(proof, required_wei)` checks the kind's rules (each refusal a 402 with its code, the
tables in docs/gateway.md) and returns a `Reservation` that holds `required_wei` = price ×
(prompt tokens + max_tokens); `settle` charges fee = price × (prompt + completion tokens) (never
more than the hold), signs the `Receipt` and logs it (fsync'd, `receipt_log.ReceiptLog`) before
it is returned; `release` returns the hold and frees the query id. Both are idempotent: a
reservation is open until the first of them, the second is a no-op. Which of the two a question
ends in is decided by `payment_state.QuestionPayment` (the per-question state machine).

Per-query deposit (one `depositOf` read, `escrow_reads`):

    the deposit exists and is Funded               else payment_unfunded / payment_closed
    the proof's signer is the depositor            else payment_squatted
    the deposit was made for this gateway          else payment_wrong_gateway
    ... and for this model                         else payment_wrong_model
    its refund opens after now + refund_margin_s   else payment_expiring
    fee cap <= deposit and required <= fee cap     else payment_underfunded
    the query id was never used here               else payment_used

Prepaid (vouchers and keys): the payer is whoever the signature recovers to for this gateway,
model and escrow (anything signed for another recovers to an unfunded stranger). What the desk
holds against a payer = holds of its questions in flight + charges not yet debited on chain;
a question is reserved only if `required <= prepaidOf(payer, this gateway).balance − that`,
checked and held with no await in between, so no interleaving overdraws a balance. A key also
keeps, per (payer, key id), `charged` (the running total the committee is sent), `held`, and
`revoked`; a key question is reserved only if `required <= cap − charged − held`. Vouchers
and keys must stay valid `min_authorization_lifetime_s` after the question (`timeline.py`), so
the committee never sees an expired charge from this gateway.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.gateway.errors import PaymentRequired
from node.gateway.escrow_reads import (
    STATUS_NAMES,
    EscrowReader,
    OnChainBalance,
    OnChainDeposit,
)
from node.gateway.receipt_log import ReceiptLog
from protocol.abi_words import keccak
from protocol.eip712 import Domain, as_address, as_bytes32, sign_digest
from protocol.errors import ProtocolError
from protocol.payment import (
    KeyFormatError,
    KeyRevocation,
    KeyUse,
    PaymentKeyError,
    PaymentKeyProof,
    PaymentProof,
    Proof,
    Receipt,
    VoucherKeyError,
    VoucherProof,
    circuit_hash,
    receipt_json,
)

log = logging.getLogger(__name__)

DEFAULT_MIN_AUTHORIZATION_LIFETIME_S = 185  # reporter max wait 60 + pass 5 + commit margin 120
DEFAULT_MAX_KEY_LIFETIME_S = 90 * 86_400
_tickets = itertools.count(1)

__all__ = ["OnChainBalance", "OnChainDeposit", "PaymentDesk", "Reservation"]


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reserved question: what was checked, who pays, and how much may be charged at most."""

    proof: Proof
    payer: str  # the depositor, or the voucher's / key's payer
    allowed_wei: int  # the hold: price × (prompt tokens + max_tokens)
    query_id: bytes  # the proof's query id, or the one the desk made for a key question
    ticket: int  # unique per reservation: what release / settle act on once
    model_id: bytes = b""  # the model the proof pays for (b"": the desk's first model)

    @property
    def prepaid(self) -> bool:
        return isinstance(self.proof, VoucherProof | PaymentKeyProof)

    @property
    def query_hex(self) -> str:
        return "0x" + self.query_id.hex()


@dataclass
class KeyAccount:
    """One payment key as this gateway knows it, per (payer, key id)."""

    charged: int = 0  # wei charged under the key in all (the cumulative total reported)
    held: int = 0  # wei held for its questions in flight
    debited: int = 0  # how much of `charged` a posted root debited
    questions: int = 0  # query ids made for it so far
    revoked: bool = False
    # the (cap, expiry) the key id was first used with here: a key id binds them (the committee
    # charges a key id under one expiry, abci_app/settlement.py), so another key signed with the
    # same id is refused (`key_id_conflict`) before anything is served on it; None: not used yet
    terms: tuple[int, int] | None = None
    model_id: bytes | None = None  # the model the key id was first used for here


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
        more_model_ids: Sequence[bytes] = (),
        receipts_path: Path | None = None,
        max_voucher_lifetime_s: int = 86_400,
        max_key_lifetime_s: int = DEFAULT_MAX_KEY_LIFETIME_S,
        min_authorization_lifetime_s: int = DEFAULT_MIN_AUTHORIZATION_LIFETIME_S,
        refund_margin_s: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.escrow = escrow
        self.domain = domain
        self.gateway = gateway_address
        self._key = gateway_key
        self.model_id = model_id  # the first model: questions naming none pay for it
        # every model this desk takes payments for (a multi-model gateway: app.py `routes`)
        self.model_ids: tuple[bytes, ...] = (model_id, *more_model_ids)
        self.price = price_wei_per_token
        self.receipts_path = receipts_path
        self._log = ReceiptLog(receipts_path) if receipts_path is not None else None
        self.max_voucher_lifetime_s = max_voucher_lifetime_s
        self.max_key_lifetime_s = max_key_lifetime_s
        # a voucher or key must stay valid this long after the question (timeline.py)
        self.min_authorization_lifetime_s = min_authorization_lifetime_s
        # a deposit whose refund opens sooner is refused (timeline.py)
        self.refund_margin_s = refund_margin_s
        self._clock = clock
        self._open: dict[int, Reservation] = {}  # ticket → reservation in flight
        self._in_flight: set[bytes] = set()  # query ids of open reservations
        self._receipts: dict[bytes, dict[str, Any]] = {}
        self._holders: dict[bytes, bytes] = {}  # query id → holder_digest of the proof used
        # query id → its receipt's number: 1, 2, … in the order the log holds them (the work
        # ledger records receipts in this order and catches up on a restart from the last)
        self._numbers: dict[bytes, int] = {}
        self._last_number = 0
        # payer → wei held for its questions in flight + charged here, not yet debited
        self._outstanding: dict[str, int] = {}
        self._undebited: dict[bytes, tuple[str, int]] = {}  # voucher query id → (payer, fee)
        self._keys: dict[tuple[str, bytes], KeyAccount] = {}  # (payer, key id) → account
        if self._log is not None:
            for entry in self._log.entries():
                self._replay(entry)

    # --- restart ---------------------------------------------------------------------------

    @property
    def signing_key(self) -> bytes:
        """The gateway wallet's secp256k1 key (receipts; the committee binding, binding.py)."""
        return self._key

    def _replay(self, entry: dict[str, Any]) -> None:
        try:
            if "debited" in entry:
                self._forget([as_bytes32(q, "debited") for q in entry["debited"]])
            elif "key_debited" in entry:
                item = entry["key_debited"]
                self._key_debited(
                    as_address(item["payer"]), as_bytes32(item["key_id"]), int(item["total_wei"])
                )
            elif "revoked" in entry:
                item = entry["revoked"]
                self._account(as_address(item["payer"]), as_bytes32(item["key_id"])).revoked = True
            else:
                number = int(entry.get("n", self._last_number + 1))
                self._replay_receipt(entry["receipt"], bytes.fromhex(entry["holder"]), number)
        except (ValueError, KeyError, TypeError, AttributeError, ProtocolError):
            log.warning("skipping a damaged receipt entry file=%s", self.receipts_path)

    def _replay_receipt(self, doc: dict[str, Any], holder: bytes, number: int) -> None:
        query = as_bytes32(doc["query_id"], "query_id")
        fee = int(doc["fee_wei"])
        self._receipts[query] = doc
        self._holders[query] = holder
        self._numbers[query] = number
        self._last_number = max(self._last_number, number)
        if "key" in doc:
            payer = as_address(doc["payer"])
            account = self._account(payer, as_bytes32(doc["key"]["key_id"]))
            total = int(doc["key"]["total_wei"])
            if account.terms is None:
                account.terms = (int(doc["key"]["cap_wei"]), int(doc["key"]["expiry"]))
            if account.model_id is None and "model_id" in doc:
                account.model_id = as_bytes32(doc["model_id"], "model_id")
            account.questions += 1
            grown = max(0, total - account.charged)
            account.charged += grown
            self._hold(payer, grown)
        elif "payer" in doc:
            self._charge(query, as_address(doc["payer"]), fee)

    # --- reserving -------------------------------------------------------------------------

    def required_wei(self, prompt_tokens: int, max_tokens: int) -> int:
        return self.price * (prompt_tokens + max_tokens)

    async def reserve(
        self, proof: Proof | PaymentKeyError, required_wei: int, model_id: bytes | None = None
    ) -> Reservation:
        """Check and hold the payment for a question on `model_id` (None: the desk's first
        model): every proof signs the model it pays for, so one signed for another model
        recovers another payer (or names another deposit's model) and is refused."""
        model = self._model(model_id)
        if isinstance(proof, PaymentKeyError):
            raise _malformed(proof)
        if isinstance(proof, PaymentKeyProof):
            return await self._reserve_key(proof, required_wei, model)
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
                payer = await self._check_voucher(proof, required_wei, model)
            else:
                payer = await self._check_deposit(proof, required_wei, model)
        except BaseException:
            self._in_flight.discard(query)
            raise
        return self._opened(proof, payer, required_wei, query, model)

    def _model(self, model_id: bytes | None) -> bytes:
        if model_id is None:
            return self.model_id
        if model_id not in self.model_ids:
            raise ValueError(f"model 0x{model_id.hex()} is not one this desk takes payments for")
        return model_id

    def _opened(
        self, proof: Proof, payer: str, required_wei: int, query: bytes, model: bytes
    ) -> Reservation:
        reservation = Reservation(proof, payer, required_wei, query, next(_tickets), model)
        self._open[reservation.ticket] = reservation
        self._in_flight.add(query)
        log.info(
            "payment reserved query=%s kind=%s hold=%d",
            reservation.query_hex[:18],
            _kind(proof),
            required_wei,
        )
        return reservation

    def _check_lifetime(self, expiry: int, kind: str, max_lifetime_s: int) -> None:
        now = int(self._clock())
        if expiry <= now:
            raise PaymentRequired(
                f"{kind}_expired", f"the {kind} expired at {expiry} (now {now}); sign a new one"
            )
        floor = now + self.min_authorization_lifetime_s
        if expiry < floor:
            raise PaymentRequired(
                f"{kind}_expiring",
                f"the {kind} expires at {expiry}, {expiry - now} s from now; this gateway needs "
                f"at least {self.min_authorization_lifetime_s} s so the committee can still "
                f"charge it after the question; sign one that expires later",
            )
        if expiry > now + max_lifetime_s:
            raise PaymentRequired(
                f"{kind}_expiry_too_far",
                f"the {kind} expires at {expiry}, more than {max_lifetime_s} s from now; "
                "sign one that expires sooner",
            )

    async def _check_voucher(self, proof: VoucherProof, required_wei: int, model: bytes) -> str:
        self._check_lifetime(proof.expiry, "voucher", self.max_voucher_lifetime_s)
        if required_wei > proof.fee_cap:
            raise PaymentRequired(
                "voucher_over_cap",
                f"this question may cost up to {required_wei} wei (price {self.price} wei × "
                f"(prompt tokens + max_tokens)); the voucher allows {proof.fee_cap} wei",
            )
        try:
            payer = proof.payer(model, self.gateway, self.domain)
        except ProtocolError as error:
            raise PaymentRequired(
                "voucher_invalid", f"the voucher signature is invalid: {error}"
            ) from None
        account = await self.escrow.prepaid(payer)
        # No await from here to the hold: concurrent questions see each other's holds.
        self._check_balance(payer, account, required_wei, key=False)
        self._hold(payer, required_wei)
        return payer

    async def _check_deposit(self, proof: PaymentProof, required_wei: int, model: bytes) -> str:
        query = "0x" + proof.query_id.hex()
        deposit = await self.escrow.deposit(proof.query_id)
        if deposit.status == 0:
            raise PaymentRequired("payment_unfunded", f"query {query} has no deposit in the escrow")
        if not deposit.funded:
            state = STATUS_NAMES.get(deposit.status, str(deposit.status))
            raise PaymentRequired(
                "payment_closed", f"query {query} is {state}, not funded; make a new deposit"
            )
        try:
            signer = proof.signer(model, self.gateway, self.domain)
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
        if deposit.gateway is not None and deposit.gateway.lower() != self.gateway.lower():
            raise PaymentRequired(
                "payment_wrong_gateway",
                f"query {query} was deposited for gateway {deposit.gateway}, not this one "
                f"({self.gateway}); a deposit pays one gateway only: ask that gateway, or "
                "deposit again for this one",
            )
        if deposit.model_id != model:
            raise PaymentRequired(
                "payment_wrong_model", f"query {query} was deposited for another model"
            )
        now = int(self._clock())
        if deposit.refund_at and deposit.refund_at < now + self.refund_margin_s:
            raise PaymentRequired(
                "payment_expiring",
                f"the deposit of query {query} becomes refundable at {deposit.refund_at}, "
                f"{deposit.refund_at - now} s from now; this gateway needs {self.refund_margin_s} "
                "s to settle it; make a new deposit",
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
        return deposit.user

    async def _reserve_key(
        self, proof: PaymentKeyProof, required_wei: int, model: bytes
    ) -> Reservation:
        self._check_lifetime(proof.expiry, "key", self.max_key_lifetime_s)
        payer = self.key_payer(proof, model)
        self._check_key_room(payer, proof, required_wei, model)  # before reading the chain
        balance = await self.escrow.prepaid(payer)
        # No await from here to the hold: concurrent questions see each other's holds.
        self._check_key_room(payer, proof, required_wei, model)
        self._check_balance(payer, balance, required_wei, key=True)
        account = self._account(payer, proof.key_id)
        account.terms = (proof.cap, proof.expiry)  # checked unbound or equal just above
        account.model_id = model
        account.held += required_wei
        self._hold(payer, required_wei)
        query = self._key_query_id(payer, proof.key_id, account)
        return self._opened(proof, payer, required_wei, query, model)

    def key_payer(self, proof: PaymentKeyProof, model_id: bytes | None = None) -> str:
        """Who signed this key for this gateway, model (None: the desk's first) and escrow
        (402 `key_invalid`)."""
        try:
            return proof.payer(self._model(model_id), self.gateway, self.domain)
        except ProtocolError as error:
            raise PaymentRequired(
                "key_invalid", f"the payment key's signature is invalid: {error}"
            ) from None

    def _check_key_room(
        self, payer: str, proof: PaymentKeyProof, required_wei: int, model: bytes
    ) -> None:
        account = self._bound_account(payer, proof, model)
        if account.revoked:
            raise PaymentRequired(
                "key_revoked",
                f"the payer revoked this payment key (0x{proof.key_id.hex()[:16]}…) at this "
                "gateway; make a new key (planet key new)",
            )
        left = proof.cap - account.charged - account.held
        if required_wei > left:
            raise PaymentRequired(
                "key_exhausted",
                f"the payment key's cap of {proof.cap} wei is used up: {account.charged} wei "
                f"charged and {account.held} wei held for questions in flight leave "
                f"{max(left, 0)} wei, and this question may cost up to {required_wei} wei "
                f"(price {self.price} wei × (prompt tokens + max_tokens)); make a new key "
                "(planet key new) or ask with a smaller max_tokens",
            )

    def _check_balance(
        self, payer: str, account: OnChainBalance, required_wei: int, *, key: bool
    ) -> None:
        if account.withdrawable_at != 0:
            raise PaymentRequired(
                "balance_withdrawing",
                f"the prepaid balance of {payer} is being withdrawn; cancel the withdrawal "
                "or deposit from another wallet",
            )
        held = self._outstanding.get(payer, 0)
        available = account.balance - held
        if required_wei <= available:
            return
        if key and account.balance == 0 and held == 0:
            raise PaymentRequired(
                "key_unfunded",
                f"the payment key's signer {payer} has no prepaid balance for this gateway "
                f"({self.gateway}): the balance was never funded (planet balance deposit), or "
                "the key was made for another gateway, model, escrow or chain (its signature "
                "then recovers to an unfunded address); make the key for this gateway "
                "(planet key new --gateway URL)",
            )
        raise PaymentRequired(
            "balance_insufficient",
            f"this question may cost up to {required_wei} wei but the prepaid balance of "
            f"{payer} for this gateway ({account.balance} wei) has {max(available, 0)} wei not "
            f"yet committed here ({held} wei held or charged, not yet debited); deposit more "
            "(planet balance deposit)",
        )

    def _key_query_id(self, payer: str, key_id: bytes, account: KeyAccount) -> bytes:
        """A fresh query id for the next question paid by the key (receipts are found by it)."""
        while True:
            account.questions += 1
            query = keccak(
                b"planet-key-question"
                + bytes.fromhex(payer[2:])
                + key_id
                + account.questions.to_bytes(8, "big")
            )
            if query not in self._receipts and query not in self._in_flight:
                return query

    # --- ending a reservation (once) -------------------------------------------------------

    def release(self, reservation: Reservation) -> bool:
        """The question ends with nothing delivered: return the hold, free the id. False (and
        nothing done) when the reservation was already released or settled."""
        if self._open.pop(reservation.ticket, None) is None:
            return False
        self._in_flight.discard(reservation.query_id)
        self._unhold(reservation)
        log.info("payment released (no charge) query=%s", reservation.query_hex[:18])
        return True

    def settle(
        self,
        reservation: Reservation,
        prompt_tokens: int,
        completion_tokens: int,
        node_keys: Sequence[str],
    ) -> dict[str, Any]:
        """Charge for what was delivered: the signed receipt (as JSON), on disk before it is
        returned. Settling a settled reservation returns its receipt again; a released one
        cannot be settled."""
        if self._open.pop(reservation.ticket, None) is None:
            done = self._receipts.get(reservation.query_id)
            if done is None:
                raise RuntimeError(f"query {reservation.query_hex} was released, not settled")
            return done
        fee = min(self.price * (prompt_tokens + completion_tokens), reservation.allowed_wei)
        receipt = Receipt(
            query_id=reservation.query_id,
            gateway=self.gateway,
            model_id=reservation.model_id or self.model_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            fee=fee,
            circuit_hash=circuit_hash(node_keys),
        )
        signature = sign_digest(self._key, receipt.digest(self.domain))
        self._unhold(reservation)
        proof, payer = reservation.proof, reservation.payer
        voucher, key = None, None
        if isinstance(proof, VoucherProof):
            voucher = (payer, proof)
            self._charge(reservation.query_id, payer, fee)
        elif isinstance(proof, PaymentKeyProof):
            account = self._account(payer, proof.key_id)
            account.charged += fee
            self._hold(payer, fee)
            key = KeyUse(payer, proof, account.charged)
        doc = receipt_json(receipt, signature, node_keys, voucher, key)
        holder = holder_digest(proof)
        self._last_number += 1
        number = self._last_number
        self._receipts[reservation.query_id] = doc
        self._holders[reservation.query_id] = holder
        self._numbers[reservation.query_id] = number
        self._in_flight.discard(reservation.query_id)
        if self._log is not None:
            self._log.append({"receipt": doc, "holder": holder.hex(), "n": number})
        log.info(
            "payment charged query=%s fee=%d prompt=%d completion=%d",
            reservation.query_hex[:18],
            fee,
            prompt_tokens,
            completion_tokens,
        )
        return doc

    def _unhold(self, reservation: Reservation) -> None:
        if isinstance(reservation.proof, PaymentKeyProof):
            self._account(
                reservation.payer, reservation.proof.key_id
            ).held -= reservation.allowed_wei
        if reservation.prepaid:
            self._hold(reservation.payer, -reservation.allowed_wei)

    # --- keys: revocation and status ------------------------------------------------------

    async def revoke(self, key_id: bytes, signature: bytes) -> str:
        """A payer-signed `KeyRevocation(this gateway, key_id)`: refuse that key from now on
        (logged, so a restart keeps it). Returns the payer. 402 when the signature does not
        recover, or when its signer has nothing here to revoke (no balance, no key use)."""
        try:
            payer = KeyRevocation(self.gateway, key_id).recover(signature, self.domain)
        except ProtocolError as error:
            raise PaymentRequired(
                "revocation_invalid", f"the revocation's signature is invalid: {error}"
            ) from None
        if (payer, key_id) not in self._keys:
            balance = await self.escrow.prepaid(payer)
            if balance.balance == 0 and self._outstanding.get(payer, 0) == 0:
                raise PaymentRequired(
                    "key_unfunded",
                    f"the revocation's signer {payer} has no prepaid balance for this gateway: "
                    "no key of it can be spent here (sign the revocation with the key's payer "
                    "wallet, for this gateway)",
                )
        account = self._account(payer, key_id)
        if not account.revoked:
            account.revoked = True
            if self._log is not None:
                self._log.append({"revoked": {"payer": payer, "key_id": "0x" + key_id.hex()}})
            log.info("payment key revoked payer=%s key=%s", payer, key_id.hex()[:16])
        return payer

    def _bound_account(
        self, payer: str, proof: PaymentKeyProof, model: bytes | None = None
    ) -> KeyAccount:
        """The key's account here (a blank one if never used); 402 `key_id_conflict` when its id
        was first used under another cap or expiry, or for another model (`model`; None: not
        checked)."""
        account = self._keys.get((payer, proof.key_id)) or KeyAccount()
        if model is not None and account.model_id not in (None, model):
            raise PaymentRequired(
                "key_id_conflict",
                f"the payment key id 0x{proof.key_id.hex()[:16]}… was first used here for "
                "another model; a key id pays for one model (the committee charges a key id's "
                "running total under one model); make a new key for this model (planet key new)",
            )
        if account.terms is not None and account.terms != (proof.cap, proof.expiry):
            cap, expiry = account.terms
            raise PaymentRequired(
                "key_id_conflict",
                f"the payment key id 0x{proof.key_id.hex()[:16]}… was first used here with cap "
                f"{cap} wei and expiry {expiry}; this key names cap {proof.cap} wei and expiry "
                f"{proof.expiry}. A key id binds its cap and expiry (the committee charges a key "
                "id under one expiry); make a new key (planet key new)",
            )
        return account

    def key_status(self, proof: PaymentKeyProof, model_id: bytes | None = None) -> dict[str, Any]:
        """What the holder of a key may know about it here (`GET /v1/key`; `model_id`: the
        model the key was signed for, None: the desk's first)."""
        payer = self.key_payer(proof, model_id)
        account = self._bound_account(payer, proof)
        return {
            "key_id": "0x" + proof.key_id.hex(),
            "payer": payer,
            "gateway": self.gateway,
            "cap_wei": str(proof.cap),
            "charged_wei": str(account.charged),
            "held_wei": str(account.held),
            "left_wei": str(max(proof.cap - account.charged - account.held, 0)),
            "debited_wei": str(account.debited),
            "expiry": proof.expiry,
            "revoked": account.revoked,
            "payer_outstanding_wei": str(self._outstanding.get(payer, 0)),
        }

    def _account(self, payer: str, key_id: bytes) -> KeyAccount:
        account = self._keys.get((payer, key_id))
        if account is None:
            account = self._keys[(payer, key_id)] = KeyAccount()
        return account

    # --- what is held, charged and debited ------------------------------------------------

    def receipt(self, query_id: bytes) -> dict[str, Any] | None:
        return self._receipts.get(query_id)

    def receipt_number(self, query_id: bytes) -> int:
        """The number of a settled question's receipt (1, 2, … in log order)."""
        return self._numbers[query_id]

    def receipts_after(self, number: int) -> list[tuple[int, dict[str, Any]]]:
        """(number, receipt) of every receipt numbered above `number`, in order: what a work
        ledger that recorded up to `number` has not seen (a crash between the two files)."""
        later = [(n, self._receipts[q]) for q, n in self._numbers.items() if n > number]
        return sorted(later, key=lambda pair: pair[0])

    def outstanding(self, payer: str) -> int:
        """Wei this gateway holds against `payer`'s balance: in flight + charged, not debited."""
        return self._outstanding.get(payer, 0)

    def in_flight(self) -> tuple[int, int]:
        """(questions reserved and not yet charged or released, wei they hold)."""
        return len(self._open), sum(r.allowed_wei for r in self._open.values())

    def undebited(self) -> dict[bytes, tuple[str, int]]:
        """Voucher charges served here and not yet debited on chain: query id → (payer, fee)."""
        return dict(self._undebited)

    def undebited_keys(self) -> dict[tuple[str, bytes], tuple[int, int]]:
        """Key totals not yet all debited: (payer, key id) → (charged, debited)."""
        return {
            key: (account.charged, account.debited)
            for key, account in self._keys.items()
            if account.charged > account.debited
        }

    def mark_debited(self, query_ids: Iterable[bytes]) -> int:
        """The posted root debited these voucher charges: stop counting them against their
        payers' balances (logged). Returns how many were outstanding."""
        ids = [q for q in query_ids if q in self._undebited]
        self._forget(ids)
        if ids and self._log is not None:
            self._log.append({"debited": ["0x" + q.hex() for q in ids]})
        return len(ids)

    def mark_key_debited(self, payer: str, key_id: bytes, total: int) -> int:
        """A posted root debited the key's cumulative total up to `total`: stop counting that
        much against the payer (logged). Returns the wei newly debited."""
        newly = self._key_debited(payer, key_id, total)
        if newly and self._log is not None:
            self._log.append(
                {
                    "key_debited": {
                        "payer": payer,
                        "key_id": "0x" + key_id.hex(),
                        "total_wei": str(total),
                    }
                }
            )
        return newly

    def _key_debited(self, payer: str, key_id: bytes, total: int) -> int:
        account = self._account(payer, key_id)
        debited = min(total, account.charged)
        newly = max(0, debited - account.debited)
        if newly:
            account.debited = debited
            self._hold(payer, -newly)
            self._balance_changed(payer)
        return newly

    def _hold(self, payer: str, delta: int) -> None:
        left = self._outstanding.get(payer, 0) + delta
        if left < 0:
            log.error("payer outstanding below zero payer=%s delta=%d", payer, delta)
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
                self._balance_changed(entry[0])

    def _balance_changed(self, payer: str) -> None:
        forget = getattr(self.escrow, "forget_balance", None)
        if forget is not None:
            forget(payer)

    # --- receipts for their holders -------------------------------------------------------

    def receipt_for(self, proof: Proof | PaymentKeyError, query_id: bytes) -> dict[str, Any] | None:
        """The receipt of `query_id`, only for the holder of the proof that paid it (a receipt
        links a query id to the circuit's nodes: strangers get nothing)."""
        if isinstance(proof, PaymentKeyError):
            return None
        holder = self._holders.get(query_id)
        if holder is None or not hmac.compare_digest(holder, holder_digest(proof)):
            return None
        return self._receipts.get(query_id)


def _kind(proof: Proof) -> str:
    if isinstance(proof, VoucherProof):
        return "voucher"
    if isinstance(proof, PaymentKeyProof):
        return "key"
    return "deposit"


def _malformed(error: PaymentKeyError) -> PaymentRequired:
    if isinstance(error, VoucherKeyError):
        return PaymentRequired(
            "voucher_malformed",
            f"payment required: {error.message}. Send planet-voucher-v1.<query id>."
            "<fee cap>.<expiry>.<signature> as the API key",
        )
    if isinstance(error, KeyFormatError):
        return PaymentRequired(
            "key_malformed",
            f"payment required: {error.message}. Send the planet-key-v1.<key id>.<cap>."
            "<expiry>.<signature> that `planet key new` printed as the API key",
        )
    return PaymentRequired(
        "payment_malformed",
        f"payment required: {error.message}. Deposit into QueryEscrow and send "
        "planet-pay-v1.<query id>.<fee cap>.<signature> as the API key (or a prepaid "
        "voucher or payment key, docs/gateway.md)",
    )


def holder_digest(proof: Proof) -> bytes:
    """sha256 over the proof that paid a query (what `GET /v1/receipts` asks for again)."""
    if isinstance(proof, VoucherProof):
        return hashlib.sha256(
            b"voucher"
            + proof.query_id
            + proof.fee_cap.to_bytes(32, "big")
            + proof.expiry.to_bytes(8, "big")
            + proof.signature
        ).digest()
    if isinstance(proof, PaymentKeyProof):
        return hashlib.sha256(
            b"key"
            + proof.key_id
            + proof.cap.to_bytes(32, "big")
            + proof.expiry.to_bytes(8, "big")
            + proof.signature
        ).digest()
    return hashlib.sha256(
        proof.query_id + proof.fee_cap.to_bytes(32, "big") + proof.signature
    ).digest()
