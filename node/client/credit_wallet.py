"""The client's credit wallet: request a mint, finalize the committee's answers, keep, spend.

    keys = epoch_keys_from_query(answer)          (protocol.credits) /credit_keys → EpochKeys
    request = MintRequest.create(keys, count, payer_key, price_wei, chain_id, escrow, expiry)
    request.body                                  the `mint` tx body (blinded messages only)
    credits = request.finalize(keys, answers)     answers: {validator address: [blind sig]},
                                                  gathered from each validator's
                                                  /credit_signatures?mint=<request.mint_id>
    wallet = CreditWallet(path); wallet.add(credits); wallet.take(n)   spend n credits
    wallet.hold(pending); wallet.pending()
    wallet.settle(mint_id, credits); wallet.drop(mint_id)
                                                  a purchase in flight (`PendingMint`): written
                                                  before its mint tx is sent, so a client that
                                                  dies after paying finishes it on the next run

Everything that links a credit to its mint stays in this process and in the wallet file (mode
0600): the nonces, the RFC 9474 prefixes and the blinding inverses. The file is changed under
an exclusive lock (`<file>.lock`), so two `planet credits` runs at once lose nothing. The
mint tx and the signers see blinded messages only (uniformly random units mod each validator's
modulus). A credit is finalized only with signatures of validators holding ≥ 2/3 of the
epoch's power; a signer whose answer does not unblind to a valid signature is left out (its
answer named in `MintIncomplete` when too few remain).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from node.client.credit_sizes import MAX_BUY as MAX_BUY  # re-exported: where callers look
from node.client.threshold_mint import PendingThresholdMint
from protocol import blindrsa
from protocol.committee.credits import Mint
from protocol.committee.threshold_credits import parse_threshold_credit
from protocol.credits import (
    VARIANT,
    ChainClock,
    Credit,
    CreditInvalidError,
    EpochKeys,
    check_credit,
    credit_message,
    epoch_keys_from_query,
    mint_id,
    sign_purchase,
)
from protocol.eip712 import address_of
from protocol.errors import ProtocolError, UsageError
from protocol.paid_credits import PaidCredit, credit_json, expiry_epoch


class MintIncomplete(ProtocolError):
    """The signers' answers do not give ≥ 2/3 of the power for some credit of the mint."""

    code = "mint_incomplete"


class NoCreditKeys(ProtocolError):
    """Too few validators published credit keys for the current epoch (yet)."""

    code = "no_credit_keys"


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
        published = sum(power for _, power in keys.keys.values())
        if not keys.keys or 3 * published < 2 * keys.total_power:
            raise NoCreditKeys(
                f"validators holding {published} of {keys.total_power} power published credit "
                f"keys for epoch {keys.epoch}; a mint needs 2/3",
                hint="the validators publish each epoch's keys as it starts: try again shortly",
            )
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
        amount, signature = sign_purchase(
            payer_key, identifier, count, price_wei, expiry, chain_id, escrow
        )
        body = Mint(
            payer=payer,
            epoch=keys.epoch,
            blinded=frozen,
            amount=amount,
            expiry=expiry,
            signature=signature,
        )
        return cls(body=body, mint_id=identifier, secrets=tuple(secret_list))

    def to_json(self) -> dict[str, Any]:
        return {
            "mint_id": self.mint_id,
            "body": self.body.to_json(),
            "secrets": [
                {
                    "prepared": secret.prepared.hex(),
                    "inverses": {a: format(v, "x") for a, v in sorted(secret.inverses.items())},
                }
                for secret in self.secrets
            ],
        }

    @classmethod
    def from_json(cls, doc: Any) -> MintRequest:
        """A request as `to_json` wrote it; the mint id is recomputed from the body and must
        match (`ProtocolError` otherwise: the file was altered)."""
        body = Mint.from_json(doc["body"])
        identifier = mint_id(body.payer, body.epoch, body.blinded)
        if identifier != doc["mint_id"]:
            raise ProtocolError(f"pending mint {doc['mint_id']}: its body is of mint {identifier}")
        secret_list = tuple(
            _Secret(
                bytes.fromhex(item["prepared"]),
                {str(a): int(v, 16) for a, v in item["inverses"].items()},
            )
            for item in doc["secrets"]
        )
        if len(secret_list) != body.count:
            raise ProtocolError(f"pending mint {identifier}: {len(secret_list)} secrets")
        return cls(body=body, mint_id=identifier, secrets=secret_list)

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


@dataclass(frozen=True)
class PendingMint:
    """A purchase not yet in the wallet: the request, the `/credit_keys` answer of its epoch
    (to finalize with, whatever epoch it is later) and whether its mint tx was seen committed."""

    request: MintRequest
    keys_answer: Mapping[str, Any]
    landed: bool = False

    @property
    def mint_id(self) -> str:
        return self.request.mint_id

    @property
    def keys(self) -> EpochKeys:
        return epoch_keys_from_query(self.keys_answer)

    def to_json(self) -> dict[str, Any]:
        return {**self.request.to_json(), "keys": dict(self.keys_answer), "landed": self.landed}

    @classmethod
    def from_json(cls, doc: Any) -> PendingMint:
        pending = cls(MintRequest.from_json(doc), dict(doc["keys"]), bool(doc["landed"]))
        if pending.keys.epoch != pending.request.body.epoch:
            raise ProtocolError(f"pending mint {pending.mint_id}: keys of another epoch")
        return pending

    def seen_landed(self) -> PendingMint:
        return replace(self, landed=True)


Pending = PendingMint | PendingThresholdMint


def pending_from_json(doc: Any) -> Pending:
    if isinstance(doc, dict) and doc.get("kind") == PendingThresholdMint.KIND:
        return PendingThresholdMint.from_json(doc)
    return PendingMint.from_json(doc)


def _credit_from_file(item: Any) -> PaidCredit:
    if isinstance(item, str):
        return parse_threshold_credit(item, "credit")
    return Credit(
        epoch=item[0],
        prepared=bytes.fromhex(item[1]),
        signatures=tuple((a, bytes.fromhex(s)) for a, s in item[2]),
    )


@dataclass
class _Contents:
    credits: list[PaidCredit]
    pending: list[Pending]
    generation: str = ""  # the file's write id (`_save`); "" in files written before it


TAKEN_RECORD = 64  # bytes of the taken record: "<generation> <offset>", space-padded


class CreditWallet:
    """Finalized credits and purchases in flight in a JSON file (mode 0600).

    Paying takes credits from the front of the list, one per hop and chunk, while an answer
    runs: rewriting the whole file each time cost 47 ms at 1,000 credits and 212 ms at 5,000
    (this box, 2026-11-27), on the answer's critical path. So `take` writes only how many
    credits of the file are gone: a fixed-size record `<file>.taken` ("<generation> <offset>",
    rewritten in place, fsynced). The file's other changes rewrite it without those credits
    under a new `generation`, which voids the record: a crash before the rename keeps the old
    file and its record, after it the new file and no offset — no credit comes back, none is
    skipped. The parsed file is kept while its inode, size and mtime stay the same."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.taken_path = path.with_name(path.name + ".taken")
        self._cache: tuple[tuple[int, int, int], _Contents] | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read(self) -> _Contents:
        """The whole file as written (taken credits included), parsed once per version."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return _Contents([], [])
        version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        try:
            doc = json.loads(self.path.read_text())
            credits = [_credit_from_file(item) for item in doc["credits"]]
            pending = [pending_from_json(item) for item in doc.get("pending", [])]
            generation = doc.get("generation", "")
            if not isinstance(generation, str) or len(generation) > 32:
                raise ValueError("bad generation")
        except (ValueError, KeyError, TypeError, IndexError, ProtocolError) as error:
            raise UsageError(
                f"{self.path} is not a credit file ({type(error).__name__}: {error})",
                hint="restore it from a backup: it holds bearer credits and paid purchases",
            ) from None
        contents = _Contents(credits, pending, generation)
        self._cache = (version, contents)
        return contents

    def _offset(self, contents: _Contents) -> int:
        """How many credits at the front of `contents` (the file as written) are taken."""
        generation = contents.generation
        if not generation:
            return 0
        try:
            fields = self.taken_path.read_text().split()
        except FileNotFoundError:
            return 0
        if len(fields) != 2 or fields[0] != generation or not fields[1].isdigit():
            return 0  # a record of an older file (voided by its rewrite)
        return min(int(fields[1]), len(contents.credits))

    def _load(self) -> _Contents:
        """The credits held (taken ones left out) and the purchases in flight: fresh lists."""
        contents = self._read()
        offset = self._offset(contents)
        return _Contents(contents.credits[offset:], list(contents.pending), contents.generation)

    def _save(self, contents: _Contents) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(
                {
                    "generation": secrets.token_hex(16),
                    "credits": [credit_json(credit) for credit in contents.credits],
                    "pending": [item.to_json() for item in contents.pending],
                },
                handle,
            )
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)
        _fsync_dir(self.path.parent)

    def _write_offset(self, generation: str, offset: int) -> None:
        record = f"{generation} {offset}".ljust(TAKEN_RECORD - 1) + "\n"
        created = not self.taken_path.exists()
        fd = os.open(self.taken_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, record.encode(), 0)  # one small write in place: all or nothing
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self.path.parent)

    def add(self, credits: Sequence[PaidCredit]) -> None:
        with self._locked():
            contents = self._load()
            contents.credits.extend(credits)
            self._save(contents)

    def count(self) -> int:
        contents = self._read()
        return len(contents.credits) - self._offset(contents)

    def take(self, n: int) -> list[PaidCredit]:
        """Remove and return the `n` oldest credits (ProtocolError when fewer are held): on
        disk, the taken record moves on by `n` (the class docstring)."""
        with self._locked():
            contents = self._read()
            offset = self._offset(contents)
            held = contents.credits[offset:]
            if n > len(held):
                raise ProtocolError(f"the wallet holds {len(held)} credits, {n} asked")
            if contents.generation:
                self._write_offset(contents.generation, offset + n)
            else:  # a file from before the taken record: rewritten once, with a generation
                self._save(_Contents(held[n:], list(contents.pending)))
        return held[:n]

    def drop_expired(self, oldest_epoch: int, clock: ChainClock | None = None) -> int:
        """Forget the credits minted before `oldest_epoch` (a threshold credit: whose period's
        issue epoch is before it, read on `clock`; kept without one): the chain no longer
        redeems them, so every node refuses them. Returns how many went."""

        def kept_one(credit: PaidCredit) -> bool:
            if isinstance(credit, Credit):
                return credit.epoch >= oldest_epoch
            return clock is None or expiry_epoch(credit, clock) >= oldest_epoch

        with self._locked():
            contents = self._read()
            held = contents.credits[self._offset(contents) :]
            kept = [credit for credit in held if kept_one(credit)]
            if len(kept) < len(held):
                self._save(_Contents(kept, list(contents.pending)))
        return len(held) - len(kept)

    # -- purchases in flight -------------------------------------------------------------------

    def pending(self) -> list[Pending]:
        return self._load().pending

    def hold(self, pending: Pending) -> None:
        """Record (or update) a purchase in flight, on disk before this returns."""
        with self._locked():
            contents = self._load()
            contents.pending = [p for p in contents.pending if p.mint_id != pending.mint_id]
            contents.pending.append(pending)
            self._save(contents)

    def settle(self, mint_id: str, credits: Sequence[PaidCredit]) -> None:
        """Add a purchase's finalized credits and forget the purchase, in one write."""
        with self._locked():
            contents = self._load()
            if not any(p.mint_id == mint_id for p in contents.pending):
                raise ProtocolError(f"no pending mint {mint_id} (settled by another run?)")
            contents.pending = [p for p in contents.pending if p.mint_id != mint_id]
            contents.credits.extend(credits)
            self._save(contents)

    def drop(self, mint_id: str) -> None:
        """Forget a purchase that can never be charged."""
        with self._locked():
            contents = self._load()
            contents.pending = [p for p in contents.pending if p.mint_id != mint_id]
            self._save(contents)


def _fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in `directory` survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
