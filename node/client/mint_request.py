"""The client's side of a purchase: blind N credits into ONE list, then combine the validators'
partial signatures into N threshold blind BLS credits (`protocol.blind_bls`).

    period = /credit_period answer (its run's result: the committee key X_p and each X_i)
    request = MintRequest.create(period, count, payer_key, price_wei, chain_id,
                                          escrow, expiry)
    request.body                                   the `credit_mint` tx body
    credits = request.finalize(period, answers)    answers: each validator's
                                                   /credit_partials?mint=<request.mint_id>
                                                   (the set it posted on the chain), or the
                                                   `sets` of /mint_partials (the same shape)

`finalize` trusts no answer, and first takes the quick way: the partials of the t lowest
validators that answered are combined for every credit, unblinded, and the N credits verified
together under X_p (`blind_bls.unblind_all`: one pairing check for the mint, where checking
each partial costs one per validator and credit, ~1 ms each). Only when that fails (an answer
that does not parse or does not check) is each partial checked against the chain's public share
X_i of the validator it names (e(s_i, G2) = e(B, X_i)); a validator whose answer does not check
is left out. Each credit needs t checked partials on its own blinded point; the combined
signature is unblinded and verified under X_p before it is kept (`MintIncomplete` otherwise).
Either way a credit is kept only once it verifies under X_p, and it is the same credit (σ =
x · H(m) whichever t signed). The blinding factors and nonces never leave this process and the
wallet file.

Each credit is holder-bound (`protocol.committee.credit_holder`): its nonce is the public key
of a fresh holder seed, kept with its blinding (`seeds`, one per credit, in order) so that the
buyer can assign the credit to a node or a relay. A purchase in flight written before holder keys
(`[nonce, factor]` blindings) is finished as it was, with no seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from protocol import blind_bls, bls
from protocol.blind_bls import Blinding, ThresholdCredit
from protocol.committee.credit_holder import SEED_BYTES, holder_of, new_seed
from protocol.committee.credits import MAX_MINT, CreditMint
from protocol.credits import sign_purchase
from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from protocol.paid_credits import held
from protocol.threshold_mint import PeriodKey, threshold_mint_id


class MintIncomplete(ProtocolError):
    """Fewer than t validators gave partials that check, for some credit of the mint."""

    code = "mint_incomplete"


@dataclass(frozen=True)
class MintRequest:
    body: CreditMint
    mint_id: str
    blindings: tuple[Blinding, ...]
    seeds: tuple[bytes, ...] = ()  # each credit's holder seed, in order (() before holder keys)

    @classmethod
    def create(
        cls,
        period: PeriodKey,
        count: int,
        payer_key: bytes,
        price_wei: int,
        chain_id: int,
        escrow: str,
        expiry: int,
    ) -> MintRequest:
        if not 1 <= count <= MAX_MINT:
            raise ProtocolError(f"a mint buys 1 … {MAX_MINT} credits")
        seeds = tuple(new_seed() for _ in range(count))
        blindings = tuple(blind_bls.blind(period.period, holder_of(seed)) for seed in seeds)
        points = tuple(b.blinded for b in blindings)
        payer = address_of(payer_key).lower()
        identifier = threshold_mint_id(payer, period.period, points)
        amount, signature = sign_purchase(
            payer_key, identifier, count, price_wei, expiry, chain_id, escrow
        )
        body = CreditMint(
            payer=payer,
            period=period.period,
            blinded=points,
            amount=amount,
            expiry=expiry,
            signature=signature,
        )
        return cls(body, identifier, blindings, seeds)

    def to_json(self) -> dict[str, Any]:
        return {
            "mint_id": self.mint_id,
            "body": self.body.to_json(),
            "blindings": [
                [b.nonce.hex(), format(b.factor, "x"), *([seed.hex()] if seed else [])]
                for b, seed in zip(
                    self.blindings, self.seeds or [b""] * len(self.blindings), strict=True
                )
            ],
        }

    @classmethod
    def from_json(cls, doc: Any) -> MintRequest:
        """As `to_json` wrote it; every blinded point is recomputed and must match the body."""
        body = CreditMint.from_json(doc["body"])
        rows = [list(row) for row in doc["blindings"]]
        blindings = tuple(
            blind_bls.blind(body.period, bytes.fromhex(row[0]), int(row[1], 16)) for row in rows
        )
        if tuple(b.blinded for b in blindings) != body.blinded:
            raise ProtocolError(f"pending mint {doc['mint_id']}: its secrets do not match")
        seeds = tuple(bytes.fromhex(row[2]) for row in rows if len(row) == 3)
        if seeds and (
            len(seeds) != len(rows)
            or any(len(seed) != SEED_BYTES for seed in seeds)
            or any(holder_of(s) != b.nonce for s, b in zip(seeds, blindings, strict=True))
        ):
            raise ProtocolError(f"pending mint {doc['mint_id']}: its holder seeds do not match")
        identifier = threshold_mint_id(body.payer, body.period, body.blinded)
        if identifier != doc["mint_id"]:
            raise ProtocolError(f"pending mint {doc['mint_id']}: its body is of mint {identifier}")
        return cls(body, identifier, blindings, seeds)

    def finalize(
        self, period: PeriodKey, answers: Sequence[Mapping[str, Any]]
    ) -> list[ThresholdCredit]:
        """N credits from the validators' `/credit_partials` answers (module docstring)."""
        quick = self._finalize_quick(period, answers)
        credits = quick if quick is not None else self._finalize_checked(period, answers)
        if not self.seeds:
            return credits  # a purchase in flight from before holder keys
        return [held(credit, seed) for credit, seed in zip(credits, self.seeds, strict=True)]

    def _finalize_quick(
        self, period: PeriodKey, answers: Sequence[Mapping[str, Any]]
    ) -> list[ThresholdCredit] | None:
        """The credits from the t lowest answering validators' partials, verified together
        under the committee key; None when they do not make credits that verify."""
        partials: dict[int, list[bytes]] = {}
        for answer in answers:
            index = period.index_of.get(str(answer.get("validator")))
            if index is None or period.public_shares.get(index) is None:
                continue
            listed = answer.get("partials") or []
            if answer.get("mint") != self.mint_id or len(listed) != len(self.blindings):
                continue
            try:
                partials[index] = [bytes.fromhex(str(partial)) for partial in listed]
            except ValueError:
                partials.pop(index, None)  # as the checked way: a bad answer counts for nothing
        signers = sorted(partials)[: period.threshold]
        if len(signers) < period.threshold:
            return None
        try:
            combined = [
                blind_bls.combine({i: partials[i][slot] for i in signers}, period.threshold)
                for slot in range(len(self.blindings))
            ]
            return blind_bls.unblind_all(self.blindings, combined, period.key)
        except (bls.BlsError, blind_bls.ThresholdCreditError):
            return None

    def _finalize_checked(
        self, period: PeriodKey, answers: Sequence[Mapping[str, Any]]
    ) -> list[ThresholdCredit]:
        """Each validator's partials checked as one batch under its public share (a set with a
        bad partial counts for nothing); MintIncomplete for a credit
        with fewer than t that check."""
        checked: list[dict[int, bytes]] = [{} for _ in self.blindings]
        for answer in answers:
            index = period.index_of.get(str(answer.get("validator")))
            share = None if index is None else period.public_shares.get(index)
            if index is None or share is None or answer.get("mint") != self.mint_id:
                continue
            public = bls.parse_g2(share, "public share")
            partials = answer.get("partials") or []
            if len(partials) != len(self.blindings):
                continue
            try:
                raws = [bytes.fromhex(str(partial)) for partial in partials]
                # the validator's whole set in one batch (two pairings, not two per credit):
                # one bad partial and none of this validator's count, as one by one would
                blind_bls.verify_partials(
                    public,
                    [blinding.blinded for blinding in self.blindings],
                    raws,
                    f"{self.mint_id}/{answer.get('validator')}".encode(),
                )
            except (ValueError, bls.BlsError, blind_bls.ThresholdCreditError):
                continue
            for slot, raw in enumerate(raws):
                checked[slot][index] = raw
        credits = []
        for slot, blinding in enumerate(self.blindings):
            if len(checked[slot]) < period.threshold:
                raise MintIncomplete(
                    f"credit {slot} of mint {self.mint_id}: {len(checked[slot])} validators "
                    f"answered with partials that check, {period.threshold} needed",
                    hint="run `planet credits buy` again later: the purchase is kept",
                )
            combined = blind_bls.combine(checked[slot], period.threshold)
            credit = blind_bls.unblind(blinding, combined, period.key)
            credits.append(credit)
        return credits


@dataclass(frozen=True)
class PendingMint:
    """A purchase not yet in the wallet: the request, the `/credit_period` answer of
    its key period (to finalize with), the epoch it was drawn in (its funding window starts
    there or later: the record's own epoch wins once the mint is on chain) and whether its
    mint tx was seen committed."""

    request: MintRequest
    period_answer: Mapping[str, Any]
    epoch: int
    landed: bool = False

    KIND = "threshold"

    @property
    def mint_id(self) -> str:
        return self.request.mint_id

    @property
    def period(self) -> PeriodKey:
        return PeriodKey.from_answer(self.period_answer)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.request.to_json(),
            "kind": self.KIND,
            "period_answer": dict(self.period_answer),
            "epoch": self.epoch,
            "landed": self.landed,
        }

    @classmethod
    def from_json(cls, doc: Any) -> PendingMint:
        pending = cls(
            MintRequest.from_json(doc),
            dict(doc["period_answer"]),
            int(doc["epoch"]),
            bool(doc["landed"]),
        )
        if pending.period.period != pending.request.body.period:
            raise ProtocolError(f"pending mint {pending.mint_id}: the key of another period")
        return pending

    def seen_landed(self) -> PendingMint:
        return replace(self, landed=True)


class AnonymitySetTooSmall(ProtocolError):
    """The key period's buyers so far are fewer than the client's `--min-anonymity`."""

    code = "anonymity_set_too_small"


def check_anonymity(answer: Mapping[str, Any], minimum: int) -> int:
    """The period's anonymity set (`buyers` of a `/credit_period` answer), or
    AnonymitySetTooSmall when it is below `minimum` (this purchase would make it one more)."""
    buyers = answer.get("buyers")
    if not isinstance(buyers, int) or isinstance(buyers, bool) or buyers < 0:
        raise ProtocolError(f"/credit_period: buyers {buyers!a} is not a count")
    if buyers + 1 < minimum:
        raise AnonymitySetTooSmall(
            f"key period {answer.get('period')} has {buyers} other buyers so far; with you "
            f"{buyers + 1}, under your --min-anonymity {minimum}: a credit of this period would "
            "point at one of so few buyers",
            hint="buy later in the period (`planet credits buy … --min-anonymity N` waits for "
            "nobody: run it again), or lower --min-anonymity if you accept the smaller set",
        )
    return buyers + 1
