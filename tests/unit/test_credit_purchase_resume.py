"""A paid purchase is never lost (node/client/credit_purchase.py): the request with its blinding
inverses is in the wallet file before the mint is sent, and `complete` takes it on from wherever
the chain has it — after the client died at each point, or gave up waiting for the funding.

The chain is the in-process committee app (`tests.committee_chain.Chain`); `ChainLink` answers
`CommitteeLink`'s calls from it, each submit one block."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from nacl.signing import SigningKey

from abci_app.codes import Code
from abci_app.queries import query
from node.chain.committee_link import Submitted
from node.client import credit_purchase
from node.client.credit_purchase import MintLost, MintUnfunded, complete
from node.client.credit_wallet import CreditWallet, MintRequest, NoCreditKeys, PendingMint
from protocol.committee.credits import FundMint
from protocol.credits import FUND_EPOCHS, Credit, EpochKeys, check_credit
from protocol.errors import RemoteError, UnavailableError, UsageError
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_credits import (
    PAYER,
    _pending_debits,
    answers,
    credit_chain,
    epoch_now,
    keys_of,
    mint,
    publish_keys,
)
from tests.unit.test_abci_settlement import ask, next_epoch_end

pytestmark = pytest.mark.unit


class Died(BaseException):
    """The client process ends here (as kill -9 would: nothing after it runs)."""


@dataclass
class ChainLink:
    chain: Chain
    key: SigningKey = field(default_factory=lambda: seeded_key("resume-link"))
    die_on_submit: bool = False
    results: dict[str, tuple[int, str]] = field(default_factory=dict)
    submitted: int = 0

    async def query(self, path: str, **params: Any) -> Any:
        full = path + ("?" + urlencode(params) if params else "")
        code, value, log = query(self.chain.state, full, b"")
        if code != Code.OK:
            raise RemoteError("chain", f"query_{code}", log)
        return json.loads(value)

    async def submit(self, body: Any) -> Submitted:
        if self.die_on_submit:
            raise Died
        self.submitted += 1
        [result] = self.chain.block([self.chain.tx(body, self.key)])
        hash_hex = f"{self.submitted:064X}"
        self.results[hash_hex] = (int(result.code), result.log)
        return Submitted(hash=hash_hex, nonce=self.submitted)

    async def committed_code(self, tx_hash: str, *, timeout_s: float = 15.0) -> tuple[int, str]:
        return self.results[tx_hash]

    async def close(self) -> None:
        pass


def _setup(tmp: Path) -> tuple[Chain, list, MintRequest, PendingMint, CreditWallet]:
    chain = credit_chain()
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 6:
        next_epoch_end(chain)
    epoch = epoch_now(chain)
    stores = publish_keys(chain, epoch, tmp)
    request = mint(chain, keys_of(chain, epoch), 3)
    pending = PendingMint(request, ask(chain, f"/credit_keys?epoch={epoch}"))
    wallet = CreditWallet(tmp / "credits.json")
    wallet.hold(pending)
    return chain, stores, request, pending, wallet


def _gather(chain: Chain, stores: list) -> Any:
    """Each validator's blind signatures, straight from the in-process app."""

    async def gather(mint_id: str) -> dict[str, list[bytes]]:
        return answers(chain, stores, mint_id)

    return gather


def _finish(chain: Chain, stores: list, wallet: CreditWallet, **kwargs: Any) -> list[Credit]:
    [pending] = wallet.pending()
    return asyncio.run(
        complete(
            ChainLink(chain),
            _gather(chain, stores),
            wallet,
            pending,
            timeout_s=1.0,
            fund_timeout_s=kwargs.get("fund_timeout_s", 0.01),
            progress=lambda line: None,
        )
    )


def _fund(chain: Chain, mint_id: str) -> list[int]:
    results = chain.block([chain.tx(FundMint(mint_id), v.key) for v in chain.validators])
    return [int(r.code) for r in results]


def test_a_client_that_died_after_the_funding_gets_its_credits_on_the_next_run(
    tmp_path: Path,
) -> None:
    chain, stores, request, _, wallet = _setup(tmp_path)
    [landed] = chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    assert landed.code == Code.OK
    assert _fund(chain, request.mint_id) == [Code.OK] * len(chain.validators)
    # the process that sent it is gone; a new one reads the purchase from the file
    credits = _finish(chain, stores, CreditWallet(tmp_path / "credits.json"))
    assert len(credits) == 3 and wallet.count() == 3 and wallet.pending() == []
    for credit in credits:
        check_credit(keys_of(chain, request.body.epoch), credit)
    assert len(_pending_debits(chain)) == 1  # charged once


def test_a_purchase_is_on_disk_before_its_mint_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """buy_credits dies at the send: the purchase is in the file; the next run sends it."""
    chain = credit_chain()
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 6:
        next_epoch_end(chain)
    stores = publish_keys(chain, epoch_now(chain), tmp_path)
    dying = ChainLink(chain, die_on_submit=True)
    monkeypatch.setattr(credit_purchase, "CommitteeLink", lambda *a, **k: dying)
    wallet = CreditWallet(tmp_path / "credits.json")
    with pytest.raises(Died):
        asyncio.run(
            credit_purchase.buy_credits(["http://v"], PAYER, 2, wallet, expiry=1_800_003_600)
        )
    [pending] = wallet.pending()
    assert pending.request.body.count == 2 and not pending.landed
    assert ask(chain, f"/mints?payer={pending.request.body.payer}")["mints"] == []

    # next run: the mint is sent now (its epoch is still open), funded, finalized
    link = ChainLink(chain)
    with pytest.raises(MintUnfunded):
        asyncio.run(
            complete(
                link, _gather(chain, stores), wallet, pending, timeout_s=1, fund_timeout_s=0.01
            )
        )
    [still] = wallet.pending()
    assert still.landed and link.submitted == 1
    assert _fund(chain, pending.mint_id) == [Code.OK] * len(chain.validators)
    assert len(_finish(chain, stores, wallet)) == 2 and wallet.count() == 2


def test_a_mint_sent_twice_by_two_runs_is_charged_once(tmp_path: Path) -> None:
    """The first run's tx landed but its answer was lost: the second run's send is refused as
    MINT_REPLAYED, which `complete` reads as landed."""
    chain, stores, request, _, wallet = _setup(tmp_path)
    link = ChainLink(chain)
    asyncio.run(link.submit(request.body))
    asyncio.run(link.submit(request.body))  # as a resumed run would send it again
    assert [code for code, _ in link.results.values()] == [Code.OK, Code.MINT_REPLAYED]
    _fund(chain, request.mint_id)
    assert len(_finish(chain, stores, wallet)) == 3
    assert len(_pending_debits(chain)) == 1


def test_a_mint_that_never_landed_in_its_epoch_is_dropped_uncharged(tmp_path: Path) -> None:
    chain, stores, request, _, wallet = _setup(tmp_path)
    next_epoch_end(chain)
    assert _finish(chain, stores, wallet) == [] and wallet.pending() == []
    assert _pending_debits(chain) == []
    # and it can never land now: its epoch is over
    [late] = chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    assert late.code == Code.CREDIT_EPOCH


def test_an_unfunded_mint_stays_pending_while_it_can_be_funded(tmp_path: Path) -> None:
    """Giving up the wait is not giving up the purchase: the watchers may still fund it (the
    payer's deposit was slow), and then the next run finishes it."""
    chain, stores, request, _, wallet = _setup(tmp_path)
    chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    with pytest.raises(MintUnfunded) as waited:
        _finish(chain, stores, wallet)
    assert "stays in your credit file" in waited.value.message and waited.value.hint
    assert [p.mint_id for p in wallet.pending()] == [request.mint_id]
    _fund(chain, request.mint_id)
    assert len(_finish(chain, stores, wallet)) == 3 and wallet.pending() == []


def test_a_mint_past_its_funding_window_is_dropped_and_can_no_longer_be_charged(
    tmp_path: Path,
) -> None:
    chain, stores, request, _, wallet = _setup(tmp_path)
    chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    for _ in range(FUND_EPOCHS + 1):
        next_epoch_end(chain)
    assert _finish(chain, stores, wallet) == [] and wallet.pending() == []
    assert Code.MINT_FUND_LATE in _fund(chain, request.mint_id)
    assert _pending_debits(chain) == []


def test_a_landed_mint_gone_from_the_chain_is_named(tmp_path: Path) -> None:
    chain, stores, request, pending, wallet = _setup(tmp_path)
    wallet.hold(pending.seen_landed())  # landed once; this chain never saw it (pruned)
    with pytest.raises(MintLost) as lost:
        _finish(chain, stores, wallet)
    assert request.mint_id in lost.value.message and wallet.pending() == []


def test_a_pending_purchase_survives_the_file_and_refuses_an_altered_one(tmp_path: Path) -> None:
    chain, stores, request, _, wallet = _setup(tmp_path)
    chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    _fund(chain, request.mint_id)
    got = answers(chain, stores, request.mint_id)
    [read] = CreditWallet(tmp_path / "credits.json").pending()
    assert read.request.finalize(read.keys, got) == request.finalize(read.keys, got)
    assert (tmp_path / "credits.json").stat().st_mode & 0o777 == 0o600
    doc = json.loads((tmp_path / "credits.json").read_text())
    blinded = doc["pending"][0]["body"]["blinded"][0][1]
    blinded[0] = blinded[1]  # no longer the messages the mint id names
    for text in (json.dumps(doc), "{", '{"credits": [], "pending": [{}]}'):
        (tmp_path / "credits.json").write_text(text)
        with pytest.raises(UsageError) as refused:
            wallet.pending()
        assert "credits.json" in refused.value.message and refused.value.hint


def _add_many(path: str, start: int) -> None:
    wallet = CreditWallet(Path(path))
    for index in range(start, start + 40):
        wallet.add([Credit(1, index.to_bytes(81, "big"), (("A" * 40, b"\x01" * 256),))])


def test_two_runs_changing_one_credit_file_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "credits.json")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_many, args=(path, s)) for s in (0, 1000, 2000)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    held = CreditWallet(Path(path)).take(120)
    assert len({credit.prepared for credit in held}) == 120


@dataclass
class _EpochsPassLink(ChainLink):
    """Each poll of the mint sees the chain one epoch further (the wait outlives the window)."""

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/mints":
            next_epoch_end(self.chain)
        return await ChainLink.query(self, path, **params)


def test_a_wait_that_outlives_the_funding_window_says_nothing_was_charged(tmp_path: Path) -> None:
    chain, stores, request, _, wallet = _setup(tmp_path)
    chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    [pending] = wallet.pending()

    gather = _gather(chain, stores)
    with pytest.raises(MintUnfunded) as unfunded:
        asyncio.run(
            complete(
                _EpochsPassLink(chain), gather, wallet, pending, timeout_s=1, fund_timeout_s=60
            )
        )
    assert unfunded.value.final and "nothing was charged" in unfunded.value.message
    assert wallet.pending() == [] and _pending_debits(chain) == []
    assert Code.MINT_FUND_LATE in _fund(chain, request.mint_id)


@dataclass
class _EpochTurnsLink(ChainLink):
    """The first mint lands one block after its epoch ended; the validators vouch for every
    mint they are asked about."""

    turned: bool = False

    async def submit(self, body: Any) -> Submitted:
        if not self.turned:
            self.turned = True
            next_epoch_end(self.chain)
        return await ChainLink.submit(self, body)

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/mints" and "id" in params:
            record = await ChainLink.query(self, path, **params)
            if record["funded_height"] is None:
                _fund(self.chain, params["id"])
        return await ChainLink.query(self, path, **params)


def _keys_for_two_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link_type: type[ChainLink]
) -> tuple[Chain, int]:
    """A credit chain with this epoch's and the next one's keys published, and buy_credits
    wired to one `link_type` link on it (`credit_purchase.CommitteeLink()` returns that link)
    and to the in-process validators' signatures. Returns the chain and this epoch."""
    chain = credit_chain()
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 6:
        next_epoch_end(chain)
    epoch = epoch_now(chain)
    stores = publish_keys(chain, epoch, tmp_path) + publish_keys(chain, epoch + 1, tmp_path)
    link = link_type(chain)
    monkeypatch.setattr(credit_purchase, "CommitteeLink", lambda *a, **k: link)
    monkeypatch.setattr(credit_purchase, "signatures_from", lambda *_: _gather(chain, stores))
    return chain, epoch


def test_a_mint_that_lands_after_its_epoch_is_drawn_again_and_charged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain, epoch = _keys_for_two_epochs(tmp_path, monkeypatch, _EpochTurnsLink)
    link = credit_purchase.CommitteeLink()
    wallet = CreditWallet(tmp_path / "credits.json")
    lines: list[str] = []
    credits = asyncio.run(
        credit_purchase.buy_credits(
            ["http://v"], PAYER, 2, wallet, expiry=1_800_003_600, progress=lines.append
        )
    )
    assert next(iter(link.results.values()))[0] == Code.CREDIT_EPOCH  # the first, refused
    assert len(credits) == 2 and credits[0].epoch == epoch + 1 and wallet.pending() == []
    assert any("epoch turned" in line for line in lines)
    assert len(_pending_debits(chain)) == 1  # the refused mint charged nothing


def test_no_purchase_is_drawn_before_two_thirds_of_the_power_published_keys(
    tmp_path: Path,
) -> None:
    """At an epoch's start the keys may not be published yet: no request is drawn (it would be
    refused, and an empty one is not a purchase the wallet could keep)."""
    chain = credit_chain()
    keys = keys_of(chain, epoch_now(chain))  # nobody published
    with pytest.raises(NoCreditKeys) as missing:
        mint(chain, keys, 2)
    assert f"0 of {keys.total_power} power" in missing.value.message and missing.value.hint
    publish_keys(chain, epoch_now(chain), tmp_path)
    full = keys_of(chain, epoch_now(chain))
    one = EpochKeys(full.epoch, dict(list(full.keys.items())[:1]), full.total_power)
    with pytest.raises(NoCreditKeys):
        mint(chain, one, 2)


@dataclass
class _EpochTurnsBeforeSendLink(_EpochTurnsLink):
    """The epoch ends between drawing the first mint and sending it (`complete` then finds it
    never landed in its epoch and drops it uncharged); validators vouch for every mint."""

    key_queries: int = 0

    async def submit(self, body: Any) -> Submitted:
        return await ChainLink.submit(self, body)

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_keys":
            self.key_queries += 1
            if self.key_queries == 2:  # `complete`'s look at the current epoch, first try
                next_epoch_end(self.chain)
        return await _EpochTurnsLink.query(self, path, **params)


def test_a_mint_whose_epoch_ends_before_it_is_sent_is_drawn_again_not_bought_as_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `buy` returned 0 credits and exit 0 here (seen once in the devnet e2e: the
    verifier operator's `credits buy 24` left an empty file)."""
    chain, epoch = _keys_for_two_epochs(tmp_path, monkeypatch, _EpochTurnsBeforeSendLink)
    link = credit_purchase.CommitteeLink()
    monkeypatch.setattr(credit_purchase.asyncio, "sleep", _no_sleep)
    wallet = CreditWallet(tmp_path / "credits.json")
    lines: list[str] = []
    credits = asyncio.run(
        credit_purchase.buy_credits(
            ["http://v"], PAYER, 2, wallet, expiry=1_800_003_600, progress=lines.append
        )
    )
    assert len(credits) == 2 and credits[0].epoch == epoch + 1 and wallet.count() == 2
    assert wallet.pending() == [] and link.submitted == 1  # the first draw was never sent
    assert any("drawing it again" in line for line in lines)
    assert len(_pending_debits(chain)) == 1  # charged once


async def _no_sleep(_seconds: float) -> None:
    return None


@dataclass
class _EpochAlwaysTurnsLink(_EpochTurnsBeforeSendLink):
    """Every mint's epoch ends between drawing it and sending it."""

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_keys":
            self.key_queries += 1
            if self.key_queries % 2 == 0:  # each try's `complete` looks at the current epoch
                next_epoch_end(self.chain)
        return await _EpochTurnsLink.query(self, path, **params)


def test_a_buy_whose_every_mint_misses_its_epoch_fails_by_name_and_charges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two tries: keys exist for this epoch and the next only (published ≤ 2 epochs ahead)
    chain, _ = _keys_for_two_epochs(tmp_path, monkeypatch, _EpochAlwaysTurnsLink)
    link = credit_purchase.CommitteeLink()
    monkeypatch.setattr(credit_purchase, "MINT_TRIES", 2)
    monkeypatch.setattr(credit_purchase.asyncio, "sleep", _no_sleep)
    wallet = CreditWallet(tmp_path / "credits.json")
    buy = credit_purchase.buy_credits(["http://v"], PAYER, 2, wallet, expiry=1_800_003_600)
    with pytest.raises(UnavailableError, match="nothing was charged") as failed:
        asyncio.run(buy)
    assert failed.value.hint
    assert link.submitted == 0 and wallet.count() == 0 and wallet.pending() == []
    assert _pending_debits(chain) == []
