"""The client's credit wallet: keep credits and purchases in flight, spend.

    wallet = CreditWallet(path); wallet.add(credits); wallet.take(n)   spend n credits
    wallet.hold(pending); wallet.pending()
    wallet.settle(mint_id, credits); wallet.drop(mint_id)
                                                  a purchase in flight (`PendingMint`,
                                                  node/client/mint_request.py): written before
                                                  its mint tx is sent, so a client that dies
                                                  after paying finishes it on the next run
    wallet.retired()                              how many RSA credits (and RSA purchases in
                                                  flight) of before the file holds

Everything that links a credit to its mint stays in this process and in the wallet file (mode
0600): the nonces and the blinding factors. Each credit bought since holder keys is kept with
its holder seed (`{"credit": hex, "seed": hex}`, a `HeldCredit`: only this seed can give the
credit to a node or relay, protocol/committee/credit_holder.py); a credit of before is its hex
string, read and spent as it was (a chain whose genesis binds credits to holders refuses it:
it pays only nodes of chains that do not). The file is changed under an exclusive lock
(`<file>.lock`), so two `planet credits` runs at once lose nothing.

A file written before the RSA credit form was retired may still hold RSA credits (`[epoch,
prepared, signatures]`) and RSA purchases in flight: the committee no longer redeems or mints
them, so they are never spent or finished; they are kept in the file as they were (under
`retired`), counted by `retired()` and named to the user (`retired_note`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.client.credit_sizes import MAX_BUY as MAX_BUY  # re-exported: where callers look
from node.client.mint_request import PendingMint
from protocol.credits import ChainClock
from protocol.errors import ProtocolError, UsageError
from protocol.paid_credits import (
    HeldCredit,
    PaidCredit,
    credit_json,
    expiry_epoch,
    held,
    parse_paid_credit,
)


def _is_rsa_credit(item: Any) -> bool:
    """An RSA credit of before: `[epoch, prepared hex, [[validator, signature hex], ...]]`."""
    return isinstance(item, list) and len(item) == 3


def _is_rsa_pending(item: Any) -> bool:
    """An RSA purchase in flight of before: a pending entry without `kind` (its body per
    validator)."""
    return isinstance(item, dict) and "kind" not in item and "keys" in item


def retired_note(count: int) -> str:
    """What a user is told about the RSA credits a file holds."""
    return (
        f"{count} old RSA credits can no longer be spent: the committee redeems threshold "
        "credits only (they stay in the file, ignored)"
    )


@dataclass
class _Contents:
    credits: list[PaidCredit]
    pending: list[PendingMint]
    generation: str = ""  # the file's write id (`_save`); "" in files written before it
    # RSA credits and purchases of before, as the file had them: kept, never spent
    retired: dict[str, list[Any]] = field(default_factory=lambda: {"credits": [], "pending": []})


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
    skipped. The parsed file is kept while its inode, size and mtime stay the same, and what
    this wallet wrote itself is kept as written (never parsed back)."""

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
        """The whole file as written (taken credits included), parsed once per version. A file
        that still lists RSA credits among its credits is read with its taken record applied
        (generation ""): the record counts the RSA ones too, which are set apart here."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return _Contents([], [])
        version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        try:
            doc = json.loads(self.path.read_text())
            items = list(doc["credits"])
            generation = doc.get("generation", "")
            if not isinstance(generation, str) or len(generation) > 32:
                raise ValueError("bad generation")
            retired = doc.get("retired") or {"credits": [], "pending": []}
            retired = {"credits": list(retired["credits"]), "pending": list(retired["pending"])}
            if any(_is_rsa_credit(item) for item in items):
                items = items[self._taken(generation, len(items)) :]
                generation = ""
                retired["credits"] += [item for item in items if _is_rsa_credit(item)]
            credits = [_parse_held(item) for item in items if not _is_rsa_credit(item)]
            pending = []
            for item in doc.get("pending", []):
                if _is_rsa_pending(item):
                    retired["pending"].append(item)
                else:
                    pending.append(PendingMint.from_json(item))
        except (ValueError, KeyError, TypeError, IndexError, ProtocolError) as error:
            raise UsageError(
                f"{self.path} is not a credit file ({type(error).__name__}: {error})",
                hint="restore it from a backup: it holds bearer credits and paid purchases",
            ) from None
        contents = _Contents(credits, pending, generation, retired)
        self._cache = (version, contents)
        return contents

    def retired(self) -> int:
        """How many RSA credits of before the file holds (never spent: `retired_note`)."""
        return len(self._read().retired["credits"])

    def _taken(self, generation: str, count: int) -> int:
        """How many of the file's `count` credits the taken record of `generation` says are
        gone (0 without a record of that generation)."""
        if not generation:
            return 0
        try:
            fields = self.taken_path.read_text().split()
        except FileNotFoundError:
            return 0
        if len(fields) != 2 or fields[0] != generation or not fields[1].isdigit():
            return 0  # a record of an older file (voided by its rewrite)
        return min(int(fields[1]), count)

    def _offset(self, contents: _Contents) -> int:
        """How many credits at the front of `contents` (the file as written) are taken."""
        return self._taken(contents.generation, len(contents.credits))

    def _load(self) -> _Contents:
        """The credits held (taken ones left out) and the purchases in flight: fresh lists."""
        contents = self._read()
        offset = self._offset(contents)
        return _Contents(
            contents.credits[offset:], list(contents.pending), contents.generation, contents.retired
        )

    def _save(self, contents: _Contents) -> None:
        """Write `contents` (the credits held, none taken) under a new generation, and keep
        them as the parsed file: what this wallet wrote is not parsed again (every credit's
        point is checked when parsed, ~0.06 ms each: a top-up's mints re-read a file of
        hundreds of credits twice a mint). Called under the lock, so the file is ours."""
        generation = secrets.token_hex(16)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(
                {
                    "generation": generation,
                    "credits": [_held_json(credit) for credit in contents.credits],
                    "pending": [item.to_json() for item in contents.pending],
                    **({"retired": contents.retired} if any(contents.retired.values()) else {}),
                },
                handle,
            )
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)
        _fsync_dir(self.path.parent)
        stat = self.path.stat()
        retired = {key: list(items) for key, items in contents.retired.items()}
        written = _Contents(list(contents.credits), list(contents.pending), generation, retired)
        self._cache = ((stat.st_ino, stat.st_size, stat.st_mtime_ns), written)

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
                self._save(_Contents(held[n:], list(contents.pending), "", contents.retired))
        return held[:n]

    def drop_expired(self, oldest_epoch: int, clock: ChainClock | None = None) -> int:
        """Forget the credits whose period's issue epoch is before `oldest_epoch` (read on
        `clock`; all kept without one): the chain no longer redeems them, so every node refuses
        them. Returns how many went."""

        def kept_one(credit: PaidCredit) -> bool:
            return clock is None or expiry_epoch(credit, clock) >= oldest_epoch

        with self._locked():
            contents = self._read()
            held = contents.credits[self._offset(contents) :]
            kept = [credit for credit in held if kept_one(credit)]
            if len(kept) < len(held):
                self._save(_Contents(kept, list(contents.pending), "", contents.retired))
        return len(held) - len(kept)

    # -- purchases in flight -------------------------------------------------------------------

    def pending(self) -> list[PendingMint]:
        return self._load().pending

    def hold(self, pending: PendingMint) -> None:
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


def _held_json(credit: PaidCredit) -> Any:
    if isinstance(credit, HeldCredit):
        return {"credit": credit_json(credit), "seed": credit.seed.hex()}
    return credit_json(credit)


def _parse_held(item: Any) -> PaidCredit:
    """A wallet entry: `{"credit", "seed"}` (a holder-bound credit) or a credit of before."""
    if isinstance(item, dict):
        if set(item) != {"credit", "seed"}:
            raise ValueError(f"a credit entry has keys credit, seed: {sorted(item)!a}")
        seed = bytes.fromhex(str(item["seed"]))
        return held(parse_paid_credit(item["credit"]), seed)
    return parse_paid_credit(item)


def _fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in `directory` survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
