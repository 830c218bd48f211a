"""Distributed key generation for the committee's credit key: joint-Feldman VSS with complaints,
and resharing to a new validator set under the same key. No party ever holds the whole key.

Threshold: `threshold_for(n) = floor(2n/3) + 1` of n participants (n = 4 → 3, n = 16 → 11).
Fewer than t shares reveal nothing about the key and sign nothing; any t of them sign. The
committee signs as long as t validators are honest and online, so up to n - t (< n/3) may be
faulty or offline.

Phases (`DkgState`, the part the committee chain runs: deterministic, integers and bytes, no
clock, no randomness; it moves to the next phase only when the chain says so, e.g. at a height):

    DEAL        each dealer i publishes a `Deal`: Feldman commitments C_{i,k} = a_{i,k} · G2 to
                its polynomial f_i of degree t - 1, and for each receiver j its share f_i(j)
                in a PyNaCl sealed box to j's X25519 key (the plaintext binds the session, the
                dealer and the receiver). The chain checks the shape, never the ciphertexts.
    COMPLAINT   a receiver whose share does not decrypt, is not its own, or fails Feldman's
                check f_i(j) · G2 = Σ_k j^k C_{i,k} files a `Complaint` against the dealer.
    JUSTIFY     the dealer answers each complaint with a `Justification` revealing f_i(j); the
                chain checks it against the commitments. A dealer is excluded when a complaint
                against it is not answered or answered with a share that fails the check, or
                when t or more receivers complain (revealing t shares would reveal f_i).
    DONE        `finish()`: the qualified set QUAL (dealt, not excluded; at least t of them,
                else `DkgFailedError`), the group commitments C_k = Σ_{i ∈ QUAL} C_{i,k}, the
                committee key X = C_0 and every receiver's public share X_j = Σ_k j^k C_k.
                Receiver j's secret share is x_j = Σ_{i ∈ QUAL} f_i(j) (`final_share`).

Resharing (`DkgConfig.previous` set): the dealers are the old committee's share holders; dealer
i deals a polynomial whose constant is its old share x_i, and the chain checks C_{i,0} = X_i,
its old public share. With QUAL ⊆ old indices, |QUAL| ≥ old t, the new shares are
x'_j = Σ_{i ∈ QUAL} λ_i f_i(j) (Lagrange at 0 over QUAL), a sharing of the same x with the new
threshold: the committee key X is unchanged and every credit signed before stays valid.

A dealer that does not deal (offline) is simply not in QUAL. Known limit of joint-Feldman
(Gennaro et al. 1999): a rushing dealer can bias the distribution of X; the resulting
threshold BLS signatures stay unforgeable (the reason drand and Ethereum's DKGs use it).

Errors (all `ProtocolError`, each a named result code for the chain):

    DkgError                  root; `.reason` says why
    ├── DkgPhaseError         a message for a phase that is over or not open yet
    ├── DkgMessageError       a malformed message, an unknown index, a duplicate, a share
    │                         commitment that does not match the old key when resharing
    └── DkgFailedError        fewer qualified dealers than the threshold needs
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from nacl.bindings import crypto_box_SEALBYTES
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from protocol import bls, shamir
from protocol.bls import G2, ORDER
from protocol.errors import ProtocolError

SESSION_BYTES: Final = 32
BOX_KEY_BYTES: Final = 32
MAX_PARTICIPANTS: Final = 1024
_INDEX_BYTES: Final = 2
_PLAINTEXT_BYTES: Final = SESSION_BYTES + 2 * _INDEX_BYTES + bls.SCALAR_BYTES
CIPHERTEXT_BYTES: Final = _PLAINTEXT_BYTES + crypto_box_SEALBYTES  # ephemeral key + MAC


def threshold_for(n: int) -> int:
    """t = floor(2n/3) + 1: more than two thirds of the n participants."""
    if not 1 <= n <= MAX_PARTICIPANTS:
        raise DkgMessageError(f"a committee has 1 to {MAX_PARTICIPANTS} participants")
    return 2 * n // 3 + 1


class DkgError(ProtocolError):
    code = "dkg_invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(f"dkg: {reason}")
        self.reason = reason


class DkgPhaseError(DkgError):
    code = "dkg_phase"


class DkgMessageError(DkgError):
    code = "dkg_message"


class DkgFailedError(DkgError):
    code = "dkg_failed"


class Phase(enum.Enum):
    DEAL = "deal"
    COMPLAINT = "complaint"
    JUSTIFY = "justify"
    DONE = "done"


@dataclass(frozen=True)
class Receiver:
    """A participant that receives shares: its index (1..n) and its X25519 public key."""

    index: int
    box_key: bytes


@dataclass(frozen=True)
class PreviousKey:
    """The key being reshared: the old threshold and the old group commitments (C_0 = X)."""

    threshold: int
    commitments: tuple[bytes, ...]


@dataclass(frozen=True)
class DkgConfig:
    """One DKG run: a session id (unique per run), dealer indices, receivers, new threshold."""

    session: bytes
    dealers: tuple[int, ...]
    receivers: tuple[Receiver, ...]
    threshold: int
    previous: PreviousKey | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.session, bytes) or len(self.session) != SESSION_BYTES:
            raise DkgMessageError(f"a session id is {SESSION_BYTES} bytes")
        n = len(self.receivers)
        if [r.index for r in self.receivers] != list(range(1, n + 1)):
            raise DkgMessageError("receivers are indexed 1..n in order")
        if self.threshold != threshold_for(n):
            raise DkgMessageError(f"the threshold for {n} participants is {threshold_for(n)}")
        for receiver in self.receivers:
            if not isinstance(receiver.box_key, bytes) or len(receiver.box_key) != BOX_KEY_BYTES:
                raise DkgMessageError(f"a box key is {BOX_KEY_BYTES} bytes")
        if len(set(self.dealers)) != len(self.dealers) or not self.dealers:
            raise DkgMessageError("dealers are distinct and at least one")
        if list(self.dealers) != sorted(self.dealers) or self.dealers[0] < 1:
            raise DkgMessageError("dealer indices are ascending and ≥ 1")
        if self.previous is None:
            if self.dealers != tuple(range(1, n + 1)):
                raise DkgMessageError("a fresh DKG's dealers are its receivers")
        else:
            if len(self.previous.commitments) != self.previous.threshold:
                raise DkgMessageError("the old key has one commitment per coefficient")
            if len(self.dealers) < self.previous.threshold:
                raise DkgMessageError("resharing needs at least the old threshold of dealers")

    @property
    def needed(self) -> int:
        """How many qualified dealers `finish` needs."""
        return self.threshold if self.previous is None else self.previous.threshold


@dataclass(frozen=True)
class Deal:
    dealer: int
    commitments: tuple[bytes, ...]  # t compressed G2 points
    ciphertexts: tuple[bytes, ...]  # one sealed box per receiver, in receiver order


@dataclass(frozen=True)
class Complaint:
    receiver: int
    dealer: int


@dataclass(frozen=True)
class Justification:
    dealer: int
    receiver: int
    share: bytes  # f_dealer(receiver), 32 bytes


@dataclass(frozen=True)
class DkgResult:
    qualified: tuple[int, ...]
    commitments: tuple[bytes, ...]  # the group polynomial's: commitments[0] is the key X
    public_shares: Mapping[int, bytes]  # receiver index → X_j (compressed G2)
    revealed: Mapping[tuple[int, int], int]  # (dealer, receiver) → share made public
    threshold: int

    @property
    def group_key(self) -> bytes:
        return self.commitments[0]


@dataclass
class DkgState:
    """The chain's side of one run (module docstring). Submit messages, close phases, finish."""

    config: DkgConfig
    phase: Phase = Phase.DEAL
    deals: dict[int, tuple[G2, ...]] = field(default_factory=dict)
    complaints: dict[int, set[int]] = field(default_factory=dict)  # dealer → receivers
    answered: dict[tuple[int, int], int] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    _old_shares: dict[int, bytes] = field(default_factory=dict)

    def _need(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise DkgPhaseError(f"the {self.phase.value} phase is open, not {phase.value}")

    def _receiver(self, index: int) -> None:
        if not 1 <= index <= len(self.config.receivers):
            raise DkgMessageError(f"no receiver {index}")

    def submit_deal(self, deal: Deal) -> None:
        self._need(Phase.DEAL)
        if deal.dealer not in self.config.dealers:
            raise DkgMessageError(f"no dealer {deal.dealer}")
        if deal.dealer in self.deals:
            raise DkgMessageError(f"dealer {deal.dealer} already dealt")
        if len(deal.commitments) != self.config.threshold:
            raise DkgMessageError(f"a deal commits to {self.config.threshold} coefficients")
        if len(deal.ciphertexts) != len(self.config.receivers):
            raise DkgMessageError("a deal has one ciphertext per receiver")
        for ciphertext in deal.ciphertexts:
            if not isinstance(ciphertext, bytes) or len(ciphertext) != CIPHERTEXT_BYTES:
                raise DkgMessageError(f"an encrypted share is {CIPHERTEXT_BYTES} bytes")
        points = tuple(
            bls.parse_g2(c, f"commitment {k}", allow_identity=k > 0)
            for k, c in enumerate(deal.commitments)
        )
        previous = self.config.previous
        if previous is not None:
            expected = self._old_public_share(previous, deal.dealer)
            if deal.commitments[0] != expected:
                raise DkgMessageError("a reshare's constant term is not the dealer's old share")
        self.deals[deal.dealer] = points

    def _old_public_share(self, previous: PreviousKey, index: int) -> bytes:
        if index not in self._old_shares:
            old = [
                bls.parse_g2(c, "old commitment", allow_identity=k > 0)
                for k, c in enumerate(previous.commitments)
            ]
            self._old_shares[index] = bls.g2_bytes(shamir.public_share(old, index))
        return self._old_shares[index]

    def close_deals(self) -> None:
        self._need(Phase.DEAL)
        self.phase = Phase.COMPLAINT

    def submit_complaint(self, complaint: Complaint) -> None:
        self._need(Phase.COMPLAINT)
        self._receiver(complaint.receiver)
        if complaint.dealer not in self.deals:
            raise DkgMessageError(f"dealer {complaint.dealer} did not deal")
        against = self.complaints.setdefault(complaint.dealer, set())
        if complaint.receiver in against:
            raise DkgMessageError("a receiver complains once per dealer")
        against.add(complaint.receiver)

    def close_complaints(self) -> None:
        self._need(Phase.COMPLAINT)
        for dealer, receivers in self.complaints.items():
            if len(receivers) >= self.config.threshold:
                self.excluded.add(dealer)  # answering would reveal its polynomial
        self.phase = Phase.JUSTIFY

    def submit_justification(self, answer: Justification) -> None:
        self._need(Phase.JUSTIFY)
        if answer.receiver not in self.complaints.get(answer.dealer, set()):
            raise DkgMessageError("no complaint to answer")
        if answer.dealer in self.excluded:
            raise DkgMessageError(f"dealer {answer.dealer} is excluded")
        if (answer.dealer, answer.receiver) in self.answered:
            raise DkgMessageError("a complaint is answered once")
        share = bls.parse_scalar(answer.share, "revealed share", allow_zero=True)
        if shamir.share_matches(self.deals[answer.dealer], answer.receiver, share):
            self.answered[(answer.dealer, answer.receiver)] = share
        else:
            self.excluded.add(answer.dealer)  # the dealer's own answer proves it dealt badly

    def close_justifications(self) -> None:
        self._need(Phase.JUSTIFY)
        for dealer, receivers in self.complaints.items():
            if any((dealer, receiver) not in self.answered for receiver in receivers):
                self.excluded.add(dealer)
        self.phase = Phase.DONE

    def qualified(self) -> tuple[int, ...]:
        return tuple(d for d in sorted(self.deals) if d not in self.excluded)

    def finish(self) -> DkgResult:
        self._need(Phase.DONE)
        qualified = self.qualified()
        if len(qualified) < self.config.needed:
            raise DkgFailedError(f"{len(qualified)} qualified dealers, {self.config.needed} needed")
        weights = _dealer_weights(self.config, qualified)
        group: list[G2] = []
        for k in range(self.config.threshold):
            total = bls.g2_identity()
            for dealer in qualified:
                total = total + bls.g2_mul(self.deals[dealer][k], weights[dealer])
            group.append(total)
        public = {
            r.index: bls.g2_bytes(shamir.public_share(group, r.index))
            for r in self.config.receivers
        }
        revealed = {key: share for key, share in self.answered.items() if key[0] in qualified}
        return DkgResult(
            qualified,
            tuple(bls.g2_bytes(c) for c in group),
            public,
            revealed,
            self.config.threshold,
        )


def _dealer_weights(config: DkgConfig, qualified: Sequence[int]) -> dict[int, int]:
    """1 for every dealer of a fresh run; Lagrange at 0 over QUAL when resharing."""
    if config.previous is None:
        return dict.fromkeys(qualified, 1)
    return shamir.lagrange_at_zero(qualified)


# -- the participants' side (randomness and private keys: never run by the chain) --


@dataclass(frozen=True)
class DealerSecret:
    """A dealer's polynomial, kept until the run is over to answer complaints."""

    dealer: int
    polynomial: tuple[int, ...]


def _plaintext(config: DkgConfig, dealer: int, receiver: int, share: int) -> bytes:
    return (
        config.session
        + dealer.to_bytes(_INDEX_BYTES, "big")
        + receiver.to_bytes(_INDEX_BYTES, "big")
        + bls.scalar_bytes(share)
    )


def deal(config: DkgConfig, dealer: int, old_share: int | None = None) -> tuple[Deal, DealerSecret]:
    """A fresh random polynomial (or, resharing, one whose constant is `old_share`), its
    commitments and every receiver's share sealed to its box key."""
    if (config.previous is None) != (old_share is None):
        raise DkgMessageError("resharing deals an old share; a fresh DKG deals none")
    poly = shamir.random_polynomial(config.threshold, old_share)
    commitments = tuple(bls.g2_bytes(c) for c in shamir.commit(poly))
    ciphertexts = tuple(
        SealedBox(PublicKey(r.box_key)).encrypt(
            _plaintext(config, dealer, r.index, shamir.evaluate(poly, r.index))
        )
        for r in config.receivers
    )
    return Deal(dealer, commitments, ciphertexts), DealerSecret(dealer, tuple(poly))


def open_share(config: DkgConfig, receiver: int, box_key: PrivateKey, deal: Deal) -> int | None:
    """The receiver's share from `deal`, or None when it must complain (does not decrypt, is
    bound to another session, dealer or receiver, or fails the Feldman check)."""
    try:
        plaintext = SealedBox(box_key).decrypt(deal.ciphertexts[receiver - 1])
    except (CryptoError, IndexError, ValueError):
        return None
    if len(plaintext) != _PLAINTEXT_BYTES:
        return None
    share_bytes = plaintext[-bls.SCALAR_BYTES :]
    if (
        plaintext[: -bls.SCALAR_BYTES]
        != _plaintext(config, deal.dealer, receiver, 0)[: -bls.SCALAR_BYTES]
    ):
        return None
    try:
        share = bls.parse_scalar(share_bytes, "share", allow_zero=True)
        commitments = [
            bls.parse_g2(c, "commitment", allow_identity=k > 0)
            for k, c in enumerate(deal.commitments)
        ]
    except bls.BlsError:
        return None
    if not shamir.share_matches(commitments, receiver, share):
        return None
    return share


def justify(secret: DealerSecret, complaint: Complaint) -> Justification:
    """The dealer's answer to a complaint: the complainer's share, in the clear."""
    share = shamir.evaluate(secret.polynomial, complaint.receiver)
    return Justification(secret.dealer, complaint.receiver, bls.scalar_bytes(share))


def final_share(
    config: DkgConfig, result: DkgResult, receiver: int, shares: Mapping[int, int]
) -> int:
    """x_j from the shares this receiver opened (`shares`: dealer → share) and the shares the
    chain made public for it; checked against the result's public share X_j."""
    weights = _dealer_weights(config, result.qualified)
    total = 0
    for dealer in result.qualified:
        share = result.revealed.get((dealer, receiver), shares.get(dealer))
        if share is None:
            raise DkgMessageError(f"no share from qualified dealer {dealer}")
        total = (total + weights[dealer] * share) % ORDER
    expected = result.public_shares[receiver]
    if bls.g2_bytes(bls.g2_mul(bls.g2_generator(), total)) != expected:
        raise DkgMessageError("the assembled share does not match its public share")
    return total
