"""A committee's DKG run in-process, every participant honest unless told otherwise.

    committee = run_dkg(4)                                  honest, fresh
    committee = run_dkg(4, bad_shares={2: {3}}, answer="none")
                                  dealer 2 seals a wrong share to receiver 3, who complains;
                                  the dealer answers with nothing, a wrong or the right share
    committee = run_dkg(4, offline={4})                     participant 4 neither deals nor opens
    new = reshare(committee, new_size=5, dealers=(1, 2, 3)) the same key, shared to 5 others

Used by the DKG, threshold-credit and benchmark code paths (tests only: the chain's side is
`protocol.dkg.DkgState`, this file plays every participant around it).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from nacl.public import PrivateKey, PublicKey, SealedBox

from protocol import bls, dkg, shamir
from protocol.bls import G2


@dataclass
class Committee:
    config: dkg.DkgConfig
    state: dkg.DkgState
    result: dkg.DkgResult
    shares: dict[int, int]  # receiver index → x_j (online receivers only)
    box_keys: list[PrivateKey] = field(repr=False)

    @property
    def threshold(self) -> int:
        return self.config.threshold

    @property
    def group_key(self) -> G2:
        return bls.parse_g2(self.result.group_key)

    def public_share(self, index: int) -> G2:
        return bls.parse_g2(self.result.public_shares[index])


def _receivers(size: int) -> tuple[list[PrivateKey], tuple[dkg.Receiver, ...]]:
    keys = [PrivateKey.generate() for _ in range(size)]
    return keys, tuple(dkg.Receiver(i + 1, bytes(k.public_key)) for i, k in enumerate(keys))


def _corrupt(
    config: dkg.DkgConfig, deal: dkg.Deal, secret: dkg.DealerSecret, victim: int
) -> dkg.Deal:
    """The deal with a wrong share sealed to `victim` (commitments unchanged)."""
    wrong = (shamir.evaluate(secret.polynomial, victim) + 1) % bls.ORDER
    plaintext = (
        config.session
        + deal.dealer.to_bytes(2, "big")
        + victim.to_bytes(2, "big")
        + bls.scalar_bytes(wrong)
    )
    box = SealedBox(PublicKey(config.receivers[victim - 1].box_key)).encrypt(plaintext)
    ciphertexts = list(deal.ciphertexts)
    ciphertexts[victim - 1] = box
    return dkg.Deal(deal.dealer, deal.commitments, tuple(ciphertexts))


def _run(
    config: dkg.DkgConfig,
    keys: list[PrivateKey],
    old_shares: Mapping[int, int] | None,
    bad_shares: Mapping[int, Collection[int]],
    answer: Literal["none", "wrong", "right"],
    offline: Collection[int],
) -> Committee:
    state = dkg.DkgState(config)
    secrets_by_dealer: dict[int, dkg.DealerSecret] = {}
    deals: dict[int, dkg.Deal] = {}
    for dealer in config.dealers:
        if dealer in offline:
            continue
        old = None if old_shares is None else old_shares[dealer]
        deal, secret = dkg.deal(config, dealer, old)
        for victim in bad_shares.get(dealer, ()):
            deal = _corrupt(config, deal, secret, victim)
        state.submit_deal(deal)
        deals[dealer] = deal
        secrets_by_dealer[dealer] = secret
    state.close_deals()
    online = [r.index for r in config.receivers if r.index not in offline]
    opened: dict[int, dict[int, int]] = {}
    complaints: list[dkg.Complaint] = []
    for receiver in online:
        opened[receiver] = {}
        for dealer, deal in deals.items():
            share = dkg.open_share(config, receiver, keys[receiver - 1], deal)
            if share is None:
                complaints.append(dkg.Complaint(receiver, dealer))
            else:
                opened[receiver][dealer] = share
    for complaint in complaints:
        state.submit_complaint(complaint)
    state.close_complaints()
    for complaint in complaints:
        if answer == "none" or complaint.dealer in state.excluded:
            continue
        good = dkg.justify(secrets_by_dealer[complaint.dealer], complaint)
        if answer == "wrong":
            share = (int.from_bytes(good.share, "big") + 1) % bls.ORDER
            good = dkg.Justification(good.dealer, good.receiver, bls.scalar_bytes(share))
        state.submit_justification(good)
    state.close_justifications()
    result = state.finish()
    shares = {j: dkg.final_share(config, result, j, opened[j]) for j in online}
    return Committee(config, state, result, shares, keys)


def run_dkg(
    size: int,
    *,
    bad_shares: Mapping[int, Collection[int]] | None = None,
    answer: Literal["none", "wrong", "right"] = "none",
    offline: Collection[int] = (),
) -> Committee:
    keys, receivers = _receivers(size)
    config = dkg.DkgConfig(
        secrets.token_bytes(dkg.SESSION_BYTES),
        tuple(range(1, size + 1)),
        receivers,
        dkg.threshold_for(size),
    )
    return _run(config, keys, None, bad_shares or {}, answer, offline)


def reshare(
    old: Committee,
    *,
    new_size: int,
    dealers: tuple[int, ...],
    bad_shares: Mapping[int, Collection[int]] | None = None,
    answer: Literal["none", "wrong", "right"] = "none",
) -> Committee:
    keys, receivers = _receivers(new_size)
    config = dkg.DkgConfig(
        secrets.token_bytes(dkg.SESSION_BYTES),
        dealers,
        receivers,
        dkg.threshold_for(new_size),
        dkg.PreviousKey(old.threshold, old.result.commitments),
    )
    return _run(config, keys, old.shares, bad_shares or {}, answer, ())
