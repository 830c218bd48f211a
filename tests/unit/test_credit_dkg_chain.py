"""The key periods' DKG on the chain (abci_app/credit_dkg.py) played by every validator's
watcher logic (node/watcher/credit_dkg.py `plan`): phases by height, the key formed at the end of
the justify blocks, shares in each validator's store (0600), and every refusal by name."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest

from abci_app.codes import Code
from node.watcher.credit_dkg import CreditDkgDriver, plan
from protocol import blind_bls, bls, dkg_wire
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.credit_periods import KeySchedule
from protocol.credit_shares import CreditShareStore
from protocol.dkg import Deal
from tests.committee_chain import Chain
from tests.unit.test_abci_settlement import ask, settled_chain

pytestmark = pytest.mark.unit

PERIOD_BLOCKS = 30
PHASE = 2
SCHEDULE = KeySchedule(PERIOD_BLOCKS, PHASE)


def dkg_chain() -> Chain:
    return settled_chain(
        bindings={},  # no gateway tx in block 1: the DKG phases' heights as planned
        credits={
            "price_wei": "1000",
            "layer_tokens": 16,
            "key_period_blocks": PERIOD_BLOCKS,
            "dkg_phase_blocks": PHASE,
        },
    )


def stores(tmp_path: Path, chain: Chain) -> list[CreditShareStore]:
    return [CreditShareStore(tmp_path / f"v{i}") for i in range(len(chain.validators))]


def play(chain: Chain, shares: list[CreditShareStore], period: int, until: int, skip=()) -> None:
    """Every validator (but `skip`) sends what its watcher would, block after block."""
    while chain.state.height < until:
        answer = ask(chain, f"/credit_period?period={period}")
        txs = []
        for i, validator in enumerate(chain.validators):
            if i in skip:
                continue
            for body in plan(answer, validator.key, shares[i]):
                txs.append(chain.tx(body, validator.key))
        results = chain.block(txs)
        assert all(r.code == Code.OK for r in results), [r.log for r in results]


def test_schedule_puts_each_run_before_its_period() -> None:
    assert SCHEDULE.dkg_start(0) == 2 and SCHEDULE.dkg_finish_height(0) == 7
    assert SCHEDULE.dkg_start(1) == 25 and SCHEDULE.dkg_finish_height(1) == 30
    assert SCHEDULE.period_of(30) == 0 and SCHEDULE.period_of(31) == 1
    assert SCHEDULE.configured_at(24) == [1] and SCHEDULE.finished_at(30) == [1]


def test_validators_form_one_key_and_sign_credits_under_it(tmp_path: Path) -> None:
    chain = dkg_chain()
    shares = stores(tmp_path, chain)
    play(chain, shares, 0, SCHEDULE.dkg_finish_height(0) + 1)
    result = ask(chain, "/credit_period?period=0")["run"]["result"]
    assert result["qualified"] == [1, 2, 3, 4] and result["threshold"] == 3
    key = bls.parse_g2(bytes.fromhex(result["key"]))
    formed = [s.share(0) for s in shares]
    addresses = sorted(v["address"] for v in chain.state.validators)
    assert all(f is not None for f in formed)
    for store in shares:
        mode = stat.S_IMODE(next(store.directory.iterdir()).stat().st_mode)
        assert mode == 0o600
    # any 3 of the 4 shares sign a blinded credit that verifies under X_0
    blinding = blind_bls.blind(0, b"\x07" * 32)
    partials = {}
    for index, share in formed[1:]:  # type: ignore[misc]
        partial = blind_bls.partial_sign(share, blinding.blinded)
        public = bls.parse_g2(bytes.fromhex(result["public_shares"][addresses[index - 1]]))
        blind_bls.verify_partial(public, blinding.blinded, partial)
        partials[index] = partial
    credit = blind_bls.unblind(blinding, blind_bls.combine(partials, 3), key)
    blind_bls.verify_credit(key, credit)
    # the next period's run is recorded in its own time, with its own session
    chain.advance_to(SCHEDULE.dkg_config_height(1))
    later = ask(chain, "/credit_period?period=1")["run"]
    assert later["session"] != ask(chain, "/credit_period?period=0")["run"]["session"]


def test_a_silent_validator_is_left_out_and_the_key_still_forms(tmp_path: Path) -> None:
    chain = dkg_chain()
    shares = stores(tmp_path, chain)
    play(chain, shares, 0, SCHEDULE.dkg_finish_height(0) + 1, skip={3})
    result = ask(chain, "/credit_period?period=0")["run"]["result"]
    silent = sorted(v.address for v in chain.validators).index(chain.validators[3].address) + 1
    assert result["qualified"] == [i for i in (1, 2, 3, 4) if i != silent]
    assert shares[3].share(0) is None  # it never took part: no share until it opens its deals
    play(chain, shares, 0, chain.state.height + 1)  # back online: opens the deals on chain
    assert shares[3].share(0) is not None


def test_a_bad_dealer_is_complained_about_and_excluded(tmp_path: Path) -> None:
    chain = dkg_chain()
    shares = stores(tmp_path, chain)
    play(chain, shares, 0, SCHEDULE.dkg_start(0) - 1)
    # validator 0 deals garbage to everyone (valid shape, shares that do not open)
    answer = ask(chain, "/credit_period?period=0")
    [honest] = plan(answer, chain.validators[0].key, shares[0])
    deal = dkg_wire.decode_deal(honest.deal)
    bad = Deal(
        deal.dealer, deal.commitments, tuple(c[:-1] + bytes([c[-1] ^ 1]) for c in deal.ciphertexts)
    )
    [result] = chain.block(
        [chain.tx(DkgDeal(0, dkg_wire.encode_deal(bad)), chain.validators[0].key)]
    )
    assert result.code == Code.OK
    shares[0].save(0, {"index": 1, "polynomial": None, "opened": {}, "share": None})
    play(chain, shares, 0, SCHEDULE.dkg_finish_height(0) + 1, skip={0})
    run = ask(chain, "/credit_period?period=0")["run"]
    bad_index = deal.dealer
    assert sorted(d for d, _ in run["complaints"]) == [bad_index] * 3
    assert run["result"]["qualified"] == [i for i in (1, 2, 3, 4) if i != bad_index]


def test_refusals_by_name(tmp_path: Path) -> None:
    chain = dkg_chain()
    shares = stores(tmp_path, chain)
    v = chain.validators
    # no run yet for a far period; out of phase; not a participant; another's index
    [r] = chain.block([chain.tx(DkgComplaint(5, 1), v[0].key)])
    assert r.code == Code.DKG_PHASE
    answer = ask(chain, "/credit_period?period=0")
    [mine] = plan(answer, v[1].key, shares[1])
    [r] = chain.block([chain.tx(mine, v[0].key)])  # validator 1's deal signed by validator 0
    assert r.code == Code.DKG_MESSAGE_INVALID
    [r] = chain.block([chain.tx(DkgComplaint(0, 2), v[0].key)])  # still the deal blocks
    assert r.code == Code.DKG_PHASE
    from tests.committee_chain import seeded_key

    [r] = chain.block([chain.tx(mine, seeded_key("outsider"))])
    assert r.code in (Code.DKG_PHASE, Code.NOT_DKG_PARTICIPANT)
    chain.advance_to(SCHEDULE.dkg_start(0) + 2 * PHASE - 1)
    [r] = chain.block([chain.tx(DkgJustify(0, 2, b"\x01" * 32), v[0].key)])
    assert r.code == Code.DKG_MESSAGE_INVALID  # nothing to answer
    chain.advance_to(SCHEDULE.dkg_finish_height(0))
    run = ask(chain, "/credit_period?period=0")["run"]
    # nobody dealt: the run failed, and it runs again from the next block, a new session
    assert run["attempt"] == 1 and run["result"] is None
    assert run["start"] == SCHEDULE.dkg_finish_height(0) + 1 and run["deals"] == {}


def test_validators_up_late_form_the_key_in_a_later_attempt(tmp_path: Path) -> None:
    chain = dkg_chain()
    shares = stores(tmp_path, chain)
    chain.advance_to(SCHEDULE.dkg_finish_height(0))  # nobody was up for the first run
    run = ask(chain, "/credit_period?period=0")["run"]
    assert run["attempt"] == 1
    play(chain, shares, 0, run["finish"] + 1)
    result = ask(chain, "/credit_period?period=0")["run"]["result"]
    assert result["qualified"] == [1, 2, 3, 4]
    assert all(s.share(0) is not None for s in shares)


class _Committee:
    """The watcher's committee link on the in-process chain: sends go into the next block."""

    def __init__(self, chain: Chain, key: Any, mempool: list[bytes]) -> None:
        self.chain, self.key, self.mempool = chain, key, mempool

    async def query(self, path: str, **params: Any) -> Any:
        suffix = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
        return ask(self.chain, path + suffix)

    async def send(self, body: Any, *, timeout_s: float = 15.0) -> tuple[int, str]:
        self.mempool.append(self.chain.tx(body, self.key))
        return 0, ""


def test_the_watchers_driver_forms_the_key_pass_after_pass(tmp_path: Path) -> None:
    chain = dkg_chain()
    mempool: list[bytes] = []
    drivers = [
        CreditDkgDriver(
            _Committee(chain, v.key, mempool), v.key, CreditShareStore(tmp_path / f"w{i}")
        )
        for i, v in enumerate(chain.validators)
    ]
    while chain.state.height <= SCHEDULE.dkg_finish_height(0) + 1:
        for driver in drivers:
            asyncio.run(driver.step())
        results = chain.block(mempool)
        assert all(r.code == Code.OK for r in results), [r.log for r in results]
        mempool.clear()
    for driver in drivers:
        asyncio.run(driver.step())  # the key is formed: each writes its share
    assert all(d.store.share(0) is not None for d in drivers)
    assert ask(chain, "/credit_period?period=0")["run"]["result"]["qualified"] == [1, 2, 3, 4]


class _Corrupted(_Committee):
    """The committee link, its `/credit_period` answers passed through `corrupt` (a bug or a
    corrupted store on the validator's side)."""

    corrupt: Any = None

    async def query(self, path: str, **params: Any) -> Any:
        answer = await super().query(path, **params)
        return answer if self.corrupt is None else self.corrupt(answer)


def _run(change: dict[str, Any]) -> Any:
    return lambda a: {**a, "run": {**a["run"], **change}}


CORRUPTIONS: dict[str, Any] = {
    "/credit_period: expected an object": lambda a: [a],
    "/credit_period period": lambda a: {**a, "period": "0"},
    "/credit_period committed_height": lambda a: {**a, "committed_height": None},
    "/credit_period run:": lambda a: {**a, "run": ["x"]},
    "run.session": _run({"session": "ab"}),
    "run.receivers[0] address": lambda a: _run(
        {"receivers": [["x", *a["run"]["receivers"][0][1:]]]}
    )(a),
    "run.receivers[0] key": _run({"receivers": [["AB" * 20, "00" * 32]]}),
    "run.deals dealer": _run({"deals": {"0": "00"}}),
    "run.deals[1]": _run({"deals": {"1": "0000"}}),
    "run.complaints": _run({"complaints": [[1]]}),
    "run.justifications": _run({"justifications": [[1, 2, "zz"]]}),
    "run.result:": _run({"result": "formed"}),
    "run.result.threshold": _run({"result": {"key": "00" * 96}}),
}


def test_the_watchers_driver_refuses_a_malformed_answer_by_name_and_keeps_going(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 42: the driver checks its own `/credit_period` answers (`checked_answer`): each
    malformed one is a logged `credit_period_invalid` refusal naming the field, nothing is
    sent, the pass returns; a refused next period leaves the current one played, and once the
    answers are whole again the same driver deals."""
    chain = dkg_chain()
    chain.advance_to(SCHEDULE.dkg_start(0))
    validator = chain.validators[0]
    link = _Corrupted(chain, validator.key, [])
    driver = CreditDkgDriver(link, validator.key, CreditShareStore(tmp_path / "v0"))
    for field, corrupt in CORRUPTIONS.items():
        link.corrupt = corrupt
        caplog.clear()
        with caplog.at_level("ERROR", logger="node.watcher.credit_dkg"):
            assert asyncio.run(driver.step()) == []
        [record] = caplog.records
        assert "credit_period_invalid" in record.getMessage(), field
        assert field in record.getMessage(), (field, record.getMessage())
    assert driver.refused == len(CORRUPTIONS) and link.mempool == []
    link.corrupt = lambda a: a if a["period"] == 0 else {**a, "run": ["x"]}  # period 1 only
    [deal] = asyncio.run(driver.step())
    assert isinstance(deal, DkgDeal) and deal.period == 0
    # period 1's run is not configured at this height: its answer is not even read
    assert driver.refused == len(CORRUPTIONS)


class _Counted(_Committee):
    """The committee link, counting the `/credit_period` reads of each committed height."""

    def __init__(self, chain: Chain, key: Any, mempool: list[bytes]) -> None:
        super().__init__(chain, key, mempool)
        self.reads: list[tuple[int, int | None]] = []  # (committed height, period asked)

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_period":
            self.reads.append((self.chain.state.height, params.get("period")))
        return await super().query(path, **params)


def test_the_next_periods_answer_is_read_only_while_its_run_may_need_this_validator(
    tmp_path: Path,
) -> None:
    """Issue 41: a pass reads the next key period's `/credit_period` only from the block that
    configures its run until this validator's share of it is stored; the rest of the time one
    read a pass (the current period's). Both periods' keys still form, pass after pass."""
    chain = dkg_chain()
    mempool: list[bytes] = []
    links = [_Counted(chain, v.key, mempool) for v in chain.validators]
    drivers = [
        CreditDkgDriver(link, v.key, CreditShareStore(tmp_path / f"w{i}"))
        for i, (link, v) in enumerate(zip(links, chain.validators, strict=True))
    ]
    passes = 0
    while chain.state.height <= SCHEDULE.dkg_finish_height(1) + 3:
        for driver in drivers:
            asyncio.run(driver.step())
            assert driver.committed_height == chain.state.height  # the pass's height, shared
        passes += 1
        results = chain.block(mempool)
        assert all(r.code == Code.OK for r in results), [r.log for r in results]
        mempool.clear()
    for i in range(len(drivers)):
        store = CreditShareStore(tmp_path / f"w{i}")
        assert all((store.load(p) or {}).get("share") for p in (0, 1)), i
    for link in links:
        current = [h for h, period in link.reads if period is None]
        following = [(h, period) for h, period in link.reads if period is not None]
        assert len(current) == passes  # every pass reads its current period once
        # period 1 from its config block until it is the current one (its key forms at the end
        # of its last justify block, the block before the period); never period 2
        first, formed = SCHEDULE.dkg_config_height(1), SCHEDULE.dkg_finish_height(1)
        assert following == [(h, 1) for h in range(first, formed)], following
        assert len(link.reads) < 2 * passes - 10  # old: two reads every pass


def test_a_bug_in_a_relay_pass_is_logged_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever a pass raises (here an AttributeError, no answer error at all), the watcher's
    `_relay_step` logs it with its traceback and returns: the loop runs its next pass."""
    from node.watcher.__main__ import _relay_step

    class Broken:
        async def query(self, path: str, **params: Any) -> Any:
            raise AttributeError("a bug")

    from nacl.signing import SigningKey

    key = SigningKey(bytes(range(32)))
    driver = CreditDkgDriver(Broken(), key, CreditShareStore(tmp_path))  # type: ignore[arg-type]
    with caplog.at_level("ERROR", logger="node.watcher.__main__"):
        asyncio.run(_relay_step(driver))
    [record] = caplog.records
    assert "CreditDkgDriver pass failed" in record.getMessage() and record.exc_info
