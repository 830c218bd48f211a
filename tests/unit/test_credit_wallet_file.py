"""The credit file under payment (node/client/credit_wallet.py `CreditWallet`): `take` moves a
small taken record on instead of rewriting the file, and no crash point brings a taken credit
back or skips one that was not taken."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from node.client.credit_wallet import CreditWallet
from protocol.blind_bls import ThresholdCredit
from protocol.credits import ChainClock
from protocol.errors import ProtocolError
from protocol.paid_credits import credit_json
from tests.credit_fakes import fake_credit, fake_credits, rsa_credit_json

pytestmark = pytest.mark.unit


def _credits(count: int, start: int = 0) -> list[ThresholdCredit]:
    return fake_credits(count, start, period=5)


def _canonical(credits: list[ThresholdCredit]) -> list[ThresholdCredit]:
    return list(credits)


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
    path.write_text(json.dumps({"credits": [credit_json(c) for c in every], "pending": []}))
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
    """`drop_expired(e, clock)` forgets credits whose key period's issue epoch is before e (the
    chain no longer redeems them), keeps the others in their order, and leaves purchases in
    flight alone; a taken credit stays taken."""
    wallet = CreditWallet(tmp_path / "credits.json")
    clock = ChainClock(height=0, epoch_length=5, lifetime=1, period_blocks=5)  # p issues in p+1
    periods = (2, 3, 4, 3, 5)  # issue epochs 3, 4, 5, 4, 6
    credits = [fake_credit(i, period) for i, period in enumerate(periods)]
    wallet.add(credits)
    assert wallet.take(1) == credits[:1]
    assert wallet.drop_expired(3, clock) == 0 and wallet.count() == 4
    assert wallet.drop_expired(5, clock) == 2
    assert wallet.count() == 2 and wallet.take(2) == [credits[2], credits[4]]
    assert wallet.drop_expired(9, clock) == 0


def test_a_file_holding_old_rsa_credits_is_read_and_they_are_named_never_spent(
    tmp_path: Path,
) -> None:
    """The RSA form is retired (issue 42, attack 1): a wallet file from before may still hold RSA
    credits and an RSA purchase in flight. Reading it does not fail; they are counted
    (`retired`, "N old RSA credits can no longer be spent"), never taken nor finished, and kept
    in the file as they were; the taken record of before still counts them."""
    from node.client.credit_wallet import retired_note

    path = tmp_path / "credits.json"
    held = fake_credits(3)
    rsa_pending = {"mint_id": "0x" + "ab" * 32, "body": {}, "secrets": [], "keys": {}}
    doc = {
        "generation": "g1",
        "credits": [
            rsa_credit_json(0),
            credit_json(held[0]),
            rsa_credit_json(1),
            credit_json(held[1]),
            credit_json(held[2]),
        ],
        "pending": [rsa_pending],
    }
    path.write_text(json.dumps(doc))
    (tmp_path / "credits.json.taken").write_text("g1 1")  # the first (RSA) one was spent
    wallet = CreditWallet(path)
    assert wallet.count() == 3 and wallet.retired() == 1 and wallet.pending() == []
    assert retired_note(1).startswith("1 old RSA credits can no longer be spent")
    assert wallet.take(2) == held[:2]
    reread = CreditWallet(path)
    assert reread.count() == 1 and reread.retired() == 1 and reread.take(1) == held[2:]
    kept = json.loads(path.read_text())["retired"]
    assert kept == {"credits": [rsa_credit_json(1)], "pending": [rsa_pending]}
    with pytest.raises(ProtocolError, match="holds 0 credits"):
        reread.take(1)


def test_what_the_wallet_wrote_is_never_parsed_back_and_another_writer_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each credit parsed checks its point (~0.06 ms): a gateway's top-up rewrites a file of
    hundreds twice a mint, so the wallet keeps what it wrote as parsed; a file another
    process wrote is parsed again."""
    import node.client.credit_wallet as module

    parsed: list[object] = []
    real = module.parse_paid_credit
    monkeypatch.setattr(module, "parse_paid_credit", lambda item: parsed.append(1) or real(item))
    path = tmp_path / "credits.json"
    wallet = CreditWallet(path)
    every = _canonical(_credits(40))
    wallet.add(every[:30])
    wallet.add(every[30:])
    assert wallet.count() == 40 and wallet.take(5) == every[:5] and wallet.count() == 35
    assert parsed == []
    other = CreditWallet(path)  # another process: writes the file anew
    assert other.take(1) == every[5:6]
    other.add(_canonical(_credits(1, start=100)))
    assert len(parsed) == 40
    assert wallet.count() == 35 and wallet.take(1) == every[6:7]
    assert len(parsed) == 40 + 35  # the file other wrote, parsed once
