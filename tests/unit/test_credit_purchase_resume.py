"""A paid purchase is never lost (node/client/credit_purchase.py): the request with its blinding
factors is in the wallet file before the mint is sent, and `complete` takes it on from wherever
the chain has it — after the client died at each point, or gave up waiting for the funding.

The chain is the in-process committee app (`tests.committee_chain.Chain`) with its key periods'
DKG played (`tests.credit_chain`); `ChainLink` answers `CommitteeLink`'s calls from it, each
submit one block. Before the first key is formed a purchase waits for it, by name."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections.abc import Callable
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
from node.client.credit_purchase import MintLost, MintUnfunded, NoCreditKey, complete
from node.client.credit_wallet import CreditWallet
from node.client.mint_request import MintRequest, PendingMint
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import FundMint
from protocol.credits import FUND_EPOCHS
from protocol.errors import RemoteError, UnavailableError, UsageError
from tests.committee_chain import Chain, seeded_key
from tests.credit_chain import (
    PAYER,
    PERIOD_BLOCKS,
    PHASE,
    PRICE,
    credit_chain,
    ensure_key,
    epoch_now,
    gather,
    period_key,
    request,
    shares,
)
from tests.unit.test_abci_settlement import ask, next_epoch_end, settled_chain
from tests.unit.test_credit_dkg_chain import play

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


def _pending_debits(chain: Chain) -> list[str]:
    return [k for k, _ in chain.state.committed_items("cpend")]


def _setup(tmp: Path) -> tuple[Chain, Path, MintRequest, PendingMint, CreditWallet]:
    """A chain with its first period's key, a purchase of 3 drawn and held (not sent)."""
    chain = credit_chain(tmp)
    next_epoch_end(chain)  # a whole epoch ahead: the steps below before its close
    req = request(chain, 3)
    pending = PendingMint(req, ask(chain, "/credit_period"), epoch_now(chain))
    wallet = CreditWallet(tmp / "credits.json")
    wallet.hold(pending)
    return chain, tmp, req, pending, wallet


def _gather(chain: Chain, stores: Path) -> Any:
    """Each validator's partial signatures, straight from the in-process app."""

    async def run(mint_id: str, enough: int | None = None) -> list[dict[str, Any]]:
        answers = gather(chain, stores, mint_id)
        return answers if enough is None else answers[:enough]

    return run


def _finish(
    chain: Chain,
    stores: Path,
    wallet: CreditWallet,
    *,
    fund_timeout_s: float = 0.01,
    progress: Callable[[str], None] = lambda line: None,
) -> list[ThresholdCredit]:
    [pending] = wallet.pending()
    return asyncio.run(
        complete(
            ChainLink(chain),
            _gather(chain, stores),
            wallet,
            pending,
            timeout_s=1.0,
            fund_timeout_s=fund_timeout_s,
            progress=progress,
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
        blind_bls.verify_credit(period_key(chain, request.body.period).key, credit)
    assert len(_pending_debits(chain)) == 1  # charged once


def test_an_altered_set_among_the_first_t_answers_makes_the_client_ask_every_validator(
    tmp_path: Path,
) -> None:
    """The client finalizes from the first t answers it gets; when one of them does not check
    (here the first validator's partials are another credit's), it asks every validator and
    makes the credits from the t that check."""
    chain, stores, request, _, wallet = _setup(tmp_path)
    [landed] = chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    assert landed.code == Code.OK
    assert _fund(chain, request.mint_id) == [Code.OK] * len(chain.validators)
    asked: list[int | None] = []

    async def altered_first(mint_id: str, enough: int | None = None) -> list[dict[str, Any]]:
        asked.append(enough)
        answers = gather(chain, stores, mint_id)
        first = dict(answers[0])
        first["partials"] = list(reversed(first["partials"]))  # each partial on another credit
        answers = [first, *answers[1:]]
        return answers if enough is None else answers[:enough]

    lines: list[str] = []
    [pending] = wallet.pending()
    credits = asyncio.run(
        complete(
            ChainLink(chain),
            altered_first,
            wallet,
            pending,
            timeout_s=1.0,
            fund_timeout_s=0.01,
            progress=lines.append,
        )
    )
    threshold = period_key(chain, request.body.period).threshold
    assert asked == [threshold, None]  # the first t, then every validator
    assert len(chain.validators) > threshold
    assert len(credits) == 3 and any("asking every validator" in line for line in lines)
    for credit in credits:
        blind_bls.verify_credit(period_key(chain, request.body.period).key, credit)


def test_a_client_that_died_after_the_funding_finds_its_mint_refunded_and_drops_it(
    tmp_path: Path,
) -> None:
    """Funded, then no validator posts its partials and the client is gone past the signing
    deadline: the next run drops the purchase naming the refund (the price is the payer's row),
    keeps nothing pending and gets no credit for it."""
    chain, stores, request, _, wallet = _setup(tmp_path)
    [landed] = chain.block([chain.tx(request.body, seeded_key("mint-sender"))])
    assert landed.code == Code.OK
    assert _fund(chain, request.mint_id) == [Code.OK] * len(chain.validators)
    deadline = chain.state.committed("mint", request.mint_id)["deadline"]
    while chain.state.height <= deadline:
        chain.block([])
    assert chain.state.committed("mint", request.mint_id)["refunded_height"] == deadline
    lines: list[str] = []
    credits = _finish(chain, stores, wallet, progress=lines.append)
    assert credits == [] and wallet.count() == 0 and wallet.pending() == []
    assert any("refunded at block" in line for line in lines), lines


def test_a_purchase_is_on_disk_before_its_mint_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """buy_credits dies at the send: the purchase is in the file; the next run sends it."""
    chain = credit_chain(tmp_path)
    stores = tmp_path
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

    # next run: the mint is sent now (its key period is still open), funded, finalized
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


def test_a_mint_that_never_landed_in_its_period_is_dropped_uncharged(tmp_path: Path) -> None:
    chain, stores, request, _, wallet = _setup(tmp_path)
    chain.advance_to(PERIOD_BLOCKS)  # the next block is key period 1's
    assert _finish(chain, stores, wallet) == [] and wallet.pending() == []
    assert _pending_debits(chain) == []
    # and it can never land now: its key period is over
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
    got = gather(chain, stores, request.mint_id)
    [read] = CreditWallet(tmp_path / "credits.json").pending()
    assert read.request.finalize(read.period, got) == request.finalize(read.period, got)
    assert (tmp_path / "credits.json").stat().st_mode & 0o777 == 0o600
    doc = json.loads((tmp_path / "credits.json").read_text())
    blinded = doc["pending"][0]["body"]["blinded"]
    blinded[0] = blinded[1]  # no longer the points the mint id names
    for text in (json.dumps(doc), "{", '{"credits": [], "pending": [{}]}'):
        (tmp_path / "credits.json").write_text(text)
        with pytest.raises(UsageError) as refused:
            wallet.pending()
        assert "credits.json" in refused.value.message and refused.value.hint


def _add_many(path: str, start: int) -> None:
    wallet = CreditWallet(Path(path))
    sigma = bls.g1_bytes(bls.g1_generator())  # a valid point: the file is parsed strictly
    for index in range(start, start + 40):
        wallet.add([ThresholdCredit(0, index.to_bytes(32, "big"), sigma)])


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
    assert len({credit.nonce for credit in held}) == 120


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


def _turn(chain: Chain, stores: Path) -> None:
    """The chain moves to the end of its key period, the validators making the next period's
    key on the way (their watchers' DKG messages)."""
    period = chain.state.height // PERIOD_BLOCKS  # of the next block
    play(chain, shares(stores, chain), period + 1, (period + 1) * PERIOD_BLOCKS)
    ensure_key(chain, stores)  # formed: each watcher's next pass saves its share


@dataclass
class _EpochTurnsLink(ChainLink):
    """The first mint lands one block after its key period ended; the validators vouch for
    every mint they are asked about."""

    turned: bool = False
    turn: Callable[[], None] = lambda: None

    async def submit(self, body: Any) -> Submitted:
        if not self.turned:
            self.turned = True
            self.turn()
        return await ChainLink.submit(self, body)

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/mints" and "id" in params:
            record = await ChainLink.query(self, path, **params)
            if record["funded_height"] is None:
                _fund(self.chain, params["id"])
        return await ChainLink.query(self, path, **params)


def _keys_for_two_periods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link_type: type[_EpochTurnsLink]
) -> tuple[Chain, int]:
    """A credit chain with this key period's key, whose validators make the next period's as
    the link turns the period (`_turn`), and buy_credits wired to one `link_type` link on it
    (`credit_purchase.CommitteeLink()` returns that link) and to the in-process validators'
    partials. Returns the chain and this key period."""
    chain = credit_chain(tmp_path)
    link = link_type(chain, turn=lambda: _turn(chain, tmp_path))
    monkeypatch.setattr(credit_purchase, "CommitteeLink", lambda *a, **k: link)
    monkeypatch.setattr(credit_purchase, "partials_from", lambda *_: _gather(chain, tmp_path))
    return chain, period_key(chain).period


def test_a_mint_that_lands_after_its_period_is_drawn_again_and_charged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain, period = _keys_for_two_periods(tmp_path, monkeypatch, _EpochTurnsLink)
    link = credit_purchase.CommitteeLink()
    wallet = CreditWallet(tmp_path / "credits.json")
    lines: list[str] = []
    credits = asyncio.run(
        credit_purchase.buy_credits(
            ["http://v"], PAYER, 2, wallet, expiry=1_800_003_600, progress=lines.append
        )
    )
    assert next(iter(link.results.values()))[0] == Code.CREDIT_EPOCH  # the first, refused
    assert len(credits) == 2 and credits[0].period == period + 1 and wallet.pending() == []
    assert any("key period turned" in line for line in lines)
    assert len(_pending_debits(chain)) == 1  # the refused mint charged nothing


@dataclass
class _DkgLink(ChainLink):
    """Each look at the key period is a block of the validators' DKG (their watchers)."""

    stores: Path = Path(".")

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_period":
            answer = await ChainLink.query(self, path, **params)
            play(self.chain, shares(self.stores, self.chain), 0, self.chain.state.height + 1)
            return answer
        return await ChainLink.query(self, path, **params)


def _new_chain() -> Chain:
    """A new chain whose first key period's DKG has not run (no validator dealt yet)."""
    chain = settled_chain(
        bindings={},
        credits={
            "price_wei": str(PRICE),
            "layer_tokens": 16,
            "key_period_blocks": PERIOD_BLOCKS,
            "dkg_phase_blocks": PHASE,
        },
    )
    chain.time_s = 1_800_000_000
    return chain


def test_before_the_first_key_a_purchase_waits_for_it_with_progress_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new chain's first blocks run its DKG: `planet credits buy` waits, one line per block
    ("waiting for the committee's credit key (DKG) — block H of ~N"), then buys."""
    chain = _new_chain()
    link = _DkgLink(chain, stores=tmp_path)
    monkeypatch.setattr(credit_purchase, "CommitteeLink", lambda *a, **k: link)
    monkeypatch.setattr(credit_purchase, "partials_from", lambda *_: _gather(chain, tmp_path))
    monkeypatch.setattr(credit_purchase.asyncio, "sleep", _no_sleep)

    async def vouching_query(path: str, **params: Any) -> Any:
        answer = await _DkgLink.query(link, path, **params)
        if path == "/mints" and "id" in params and answer["funded_height"] is None:
            _fund(chain, params["id"])
            answer = await _DkgLink.query(link, path, **params)
        return answer

    link.query = vouching_query  # type: ignore[method-assign]
    wallet = CreditWallet(tmp_path / "credits.json")
    lines: list[str] = []
    bought = asyncio.run(
        credit_purchase.buy_credits(
            ["http://v"], PAYER, 2, wallet, expiry=1_800_003_600, progress=lines.append
        )
    )
    assert len(bought) == 2 and wallet.count() == 2
    waiting = [line for line in lines if line.startswith("waiting for the committee's credit key")]
    assert waiting[0] == "waiting for the committee's credit key (DKG) — block 0 of ~7"
    assert len(waiting) == len(set(waiting)) >= 5  # one line per block, each block once
    assert all(line.endswith("of ~7") for line in waiting)


def test_a_key_that_does_not_form_in_time_fails_by_name_with_a_hint(tmp_path: Path) -> None:
    """Nobody deals (the validators' watchers are not up): the wait ends, bounded, with
    `NoCreditKey` and a hint — nothing drawn, nothing sent, nothing charged."""
    chain = _new_chain()
    chain.advance_to(3)
    link = ChainLink(chain)

    async def wait() -> Any:
        return await credit_purchase.wait_for_key(
            link, timeout_s=0.05, poll_s=0.01, progress=lines.append
        )

    lines: list[str] = []
    with pytest.raises(NoCreditKey) as missing:
        asyncio.run(wait())
    assert missing.value.code == "no_credit_key" and missing.value.hint
    assert "block 3 of ~7" in missing.value.message and "planet credits buy" in missing.value.hint
    assert lines == ["waiting for the committee's credit key (DKG) — block 3 of ~7"]
    assert link.submitted == 0 and _pending_debits(chain) == []


@dataclass
class _EpochTurnsBeforeSendLink(_EpochTurnsLink):
    """The key period ends between drawing the first mint and sending it (`complete` then finds
    it never landed in its period and drops it uncharged); validators vouch for every mint."""

    key_queries: int = 0

    async def submit(self, body: Any) -> Submitted:
        return await ChainLink.submit(self, body)

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_keys":
            self.key_queries += 1
            if self.key_queries == 2:  # `complete`'s look at the current epoch, first try
                self.turn()
        return await _EpochTurnsLink.query(self, path, **params)


def test_a_mint_whose_period_ends_before_it_is_sent_is_drawn_again_not_bought_as_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `buy` returned 0 credits and exit 0 here (seen once in the devnet e2e: the
    verifier operator's `credits buy 24` left an empty file)."""
    chain, period = _keys_for_two_periods(tmp_path, monkeypatch, _EpochTurnsBeforeSendLink)
    link = credit_purchase.CommitteeLink()
    monkeypatch.setattr(credit_purchase.asyncio, "sleep", _no_sleep)
    wallet = CreditWallet(tmp_path / "credits.json")
    lines: list[str] = []
    credits = asyncio.run(
        credit_purchase.buy_credits(
            ["http://v"], PAYER, 2, wallet, expiry=1_800_003_600, progress=lines.append
        )
    )
    assert len(credits) == 2 and credits[0].period == period + 1 and wallet.count() == 2
    assert wallet.pending() == [] and link.submitted == 1  # the first draw was never sent
    assert any("drawing it again" in line for line in lines)
    assert len(_pending_debits(chain)) == 1  # charged once


async def _no_sleep(_seconds: float) -> None:
    return None


@dataclass
class _EpochAlwaysTurnsLink(_EpochTurnsBeforeSendLink):
    """Every mint's key period ends between drawing it and sending it."""

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_keys":
            self.key_queries += 1
            if self.key_queries % 2 == 0:  # each try's `complete` looks at the current epoch
                self.turn()
        return await _EpochTurnsLink.query(self, path, **params)


def test_a_buy_whose_every_mint_misses_its_epoch_fails_by_name_and_charges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two tries, each of a period that ends before its mint is sent
    chain, _ = _keys_for_two_periods(tmp_path, monkeypatch, _EpochAlwaysTurnsLink)
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
