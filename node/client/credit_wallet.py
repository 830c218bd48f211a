"""The client's credit wallet: request a mint, finalize the committee's answers, keep, spend.

    keys = epoch_keys_from_query(answer)          (protocol.credits) /credit_keys → EpochKeys
    request = MintRequest.create(keys, count, payer_key, price_wei, chain_id, escrow, expiry)
    request.body                                  the `mint` tx body (blinded messages only)
    credits = request.finalize(keys, answers)     answers: {validator address: [blind sig]},
                                                  gathered from each validator's
                                                  /credit_signatures?mint=<request.mint_id>
    wallet = CreditWallet(path); wallet.add(credits); wallet.take(n)   spend n credits

Everything that links a credit to its mint stays in this process and in the wallet file (mode
0600): the nonces, the RFC 9474 prefixes and the blinding inverses. The mint tx and the
signers see blinded messages only (uniformly random units mod each validator's modulus). A
credit is finalized only with signatures of validators holding ≥ 2/3 of the epoch's power; a
signer whose answer does not unblind to a valid signature is left out (its answer named in
`MintIncomplete` when too few remain).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from protocol import blindrsa
from protocol.committee.credits import Mint
from protocol.credits import (
    VARIANT,
    Credit,
    CreditInvalidError,
    CreditPurchase,
    EpochKeys,
    check_credit,
    credit_message,
    mint_id,
)
from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from protocol.payment import payment_domain


class MintIncomplete(ProtocolError):
    """The signers' answers do not give ≥ 2/3 of the power for some credit of the mint."""

    code = "mint_incomplete"


@dataclass(frozen=True)
class _Secret:
    """One credit being minted: its prepared message and, per validator, the blinding inverse."""

    prepared: bytes
    inverses: dict[str, int]


@dataclass(frozen=True)
class MintRequest:
    """A mint in flight: the tx body to send and the secrets to finalize it with."""

    body: Mint
    mint_id: str
    secrets: tuple[_Secret, ...]

    @classmethod
    def create(
        cls,
        keys: EpochKeys,
        count: int,
        payer_key: bytes,
        price_wei: int,
        chain_id: int,
        escrow: str,
        expiry: int,
    ) -> MintRequest:
        """Draw `count` nonces, blind each under every key of `keys`, sign the purchase."""
        if not 1 <= count <= 64:
            raise ProtocolError("a mint buys 1 … 64 credits")
        payer = address_of(payer_key).lower()
        secret_list: list[_Secret] = []
        blinded: dict[str, list[bytes]] = {address: [] for address in keys.keys}
        for _ in range(count):
            prepared = blindrsa.prepare(credit_message(secrets.token_bytes(32)), VARIANT)
            inverses = {}
            for address, (public, _) in sorted(keys.keys.items()):
                blinding = blindrsa.blind(public, prepared, VARIANT)
                blinded[address].append(blinding.blinded_msg)
                inverses[address] = blinding.inv
            secret_list.append(_Secret(prepared, inverses))
        frozen = {address: tuple(messages) for address, messages in blinded.items()}
        identifier = mint_id(payer, keys.epoch, frozen)
        amount = count * price_wei
        purchase = CreditPurchase(
            mint_id=bytes.fromhex(identifier[2:]),
            credits=count,
            amount=amount,
            expiry=expiry,
            consumer=escrow,
        )
        signature = purchase.sign(payer_key, payment_domain(chain_id, escrow))
        body = Mint(
            payer=payer,
            epoch=keys.epoch,
            blinded=frozen,
            amount=amount,
            expiry=expiry,
            signature="0x" + signature.hex(),
        )
        return cls(body=body, mint_id=identifier, secrets=tuple(secret_list))

    def finalize(self, keys: EpochKeys, answers: Mapping[str, list[bytes]]) -> list[Credit]:
        """Unblind every signer's answer; each credit keeps the signatures that verify and must
        reach 2/3 of the power (`MintIncomplete` otherwise)."""
        credits = []
        for index, secret in enumerate(self.secrets):
            signatures = []
            for address in sorted(answers):
                entry = keys.keys.get(address)
                blind_sigs = answers[address]
                if entry is None or address not in secret.inverses or len(blind_sigs) <= index:
                    continue
                try:
                    signature = blindrsa.finalize(
                        entry[0], secret.prepared, blind_sigs[index], secret.inverses[address]
                    )
                except blindrsa.BlindRsaError:
                    continue
                signatures.append((address, signature))
            credit = Credit(keys.epoch, secret.prepared, tuple(signatures))
            try:
                check_credit(keys, credit)
            except CreditInvalidError as error:
                raise MintIncomplete(
                    f"credit {index} of mint {self.mint_id}: {error.reason}"
                ) from None
            credits.append(credit)
        return credits


class CreditWallet:
    """Finalized credits in a JSON file (mode 0600): `add`, `take`, `count`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> list[Credit]:
        if not self.path.exists():
            return []
        doc = json.loads(self.path.read_text())
        return [
            Credit(
                epoch=item[0],
                prepared=bytes.fromhex(item[1]),
                signatures=tuple((a, bytes.fromhex(s)) for a, s in item[2]),
            )
            for item in doc["credits"]
        ]

    def _save(self, credits: list[Credit]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"credits": [credit.to_json() for credit in credits]}, handle)
        tmp.replace(self.path)

    def add(self, credits: list[Credit]) -> None:
        self._save(self._load() + list(credits))

    def count(self) -> int:
        return len(self._load())

    def take(self, n: int) -> list[Credit]:
        """Remove and return the `n` oldest credits (ProtocolError when fewer are held)."""
        held = self._load()
        if n > len(held):
            raise ProtocolError(f"the wallet holds {len(held)} credits, {n} asked")
        self._save(held[n:])
        return held[:n]
