"""The credit file under payment (node/client/credit_wallet.py `CreditWallet`): `take` moves a
small taken record on instead of rewriting the file, and no crash point brings a taken credit
back or skips one that was not taken."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from node.client.credit_wallet import CreditWallet
from protocol.credits import Credit
from protocol.errors import ProtocolError

pytestmark = pytest.mark.unit


def _credits(count: int, start: int = 0) -> list[Credit]:
    return [
        Credit(
            epoch=5,
            prepared=(start + i).to_bytes(4, "big") * 24,
            signatures=((f"{v:040X}", bytes([v]) * 256) for v in range(4)),
        )
        for i in range(count)
    ]


def _canonical(credits: list[Credit]) -> list[Credit]:
    return [Credit(c.epoch, c.prepared, tuple(c.signatures)) for c in credits]


def test_take_writes_the_taken_record_not_the_file_and_every_reader_agrees(
    tmp_path: Path,
) -> None:
    path = tmp_path / "credits.json"
    wallet = CreditWallet(path)
    every = _canonical(_credits(50))
    wallet.add(every)
    inode, size = path.stat().st_ino, path.stat().st_size
    assert wallet.take(3) == every[:3] and wallet.take(2) == every[3:5]
    assert (path.stat().st_ino, path.stat().st_size) == (inode, size)  # not rewritten
    assert len((tmp_path / "credits.json.taken").read_bytes()) == 64
    other = CreditWallet(path)  # another process on the same file
    assert other.count() == 45 and other.take(1) == every[5:6]
    assert wallet.count() == 44 and wallet.take(1) == every[6:7]
    with pytest.raises(ProtocolError, match="holds 43 credits, 44 asked"):
        wallet.take(44)
    # any other change rewrites the file without the taken credits and voids the record
    wallet.add(_canonical(_credits(2, start=100)))
    doc = json.loads(path.read_text())
    assert len(doc["credits"]) == 45 and CreditWallet(path).count() == 45
    assert wallet.take(1) == every[7:8]


def test_no_crash_point_brings_a_taken_credit_back_or_skips_one(tmp_path: Path) -> None:
    path = tmp_path / "credits.json"
    wallet = CreditWallet(path)
    every = _canonical(_credits(10))
    wallet.add(every)
    wallet.take(4)
    before_rewrite = (path.read_bytes(), (tmp_path / "credits.json.taken").read_bytes())
    wallet.add(_canonical(_credits(1, start=100)))  # rewrite: 7 credits, a new generation
    # a crash after the rename left the old record beside the new file: it is void
    (tmp_path / "credits.json.taken").write_bytes(before_rewrite[1])
    assert CreditWallet(path).count() == 7
    assert CreditWallet(path).take(1) == every[4:5]
    # a crash before the rename: the old file and its record, both still in force
    shutil.copy(path, tmp_path / "after.json")
    path.write_bytes(before_rewrite[0])
    (tmp_path / "credits.json.taken").write_bytes(before_rewrite[1])
    assert CreditWallet(path).count() == 6 and CreditWallet(path).take(1) == every[4:5]


def test_a_file_written_before_the_taken_record_is_read_and_spent(tmp_path: Path) -> None:
    path = tmp_path / "credits.json"
    every = _canonical(_credits(3))
    path.write_text(json.dumps({"credits": [c.to_json() for c in every], "pending": []}))
    os.chmod(path, 0o600)
    wallet = CreditWallet(path)
    assert wallet.count() == 3 and wallet.take(1) == every[:1]  # rewritten once, generation on
    assert json.loads(path.read_text())["generation"]
    assert wallet.take(1) == every[1:2] and CreditWallet(path).count() == 1
    # a record that does not parse, or names more than the file holds, is not trusted past it
    (tmp_path / "credits.json.taken").write_text("junk")
    assert CreditWallet(path).count() == 2
    generation = json.loads(path.read_text())["generation"]
    (tmp_path / "credits.json.taken").write_text(f"{generation} 99")
    assert CreditWallet(path).count() == 0


def test_expired_credits_are_dropped_and_the_rest_kept_in_order(tmp_path: Path) -> None:
    """`drop_expired(e)` forgets credits minted before epoch e (the chain no longer redeems
    them), keeps the others in their order, and leaves purchases in flight alone; a taken
    credit stays taken."""
    wallet = CreditWallet(tmp_path / "credits.json")
    epochs = (3, 4, 5, 4, 6)
    credits = [replace(c, epoch=e) for c, e in zip(_canonical(_credits(5)), epochs, strict=True)]
    wallet.add(credits)
    assert wallet.take(1) == credits[:1]
    assert wallet.drop_expired(3) == 0 and wallet.count() == 4
    assert wallet.drop_expired(5) == 2
    assert wallet.count() == 2 and wallet.take(2) == [credits[2], credits[4]]
    assert wallet.drop_expired(9) == 0
