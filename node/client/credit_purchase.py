"""Buying credits against a live committee: request → mint tx → funded (validators with ≥ 2/3
of the power vouched that the payer's prepaid balance covers it, node/watcher/funding.py) →
each validator's partial signatures → finalized credits in the wallet.

    credits = await buy_credits(validator_rpcs, payer_key, count, wallet, expiry=now + 3600)

`validator_rpcs` lists one CometBFT RPC URL per validator: each validator's app answers
`/credit_partials` with the set of partial signatures it posted on the chain (its watcher's
`mint_partials`, verified by the chain), so the client asks every one of them (and
needs t partials that check against the validators' public shares, node/client/mint_request.py).
The mint tx is signed with a fresh ed25519 key drawn for this purchase (it only carries the
tx; the payer is authenticated by its EIP-712 `CreditPurchase` signature), so mints of one
payer share no committee account. Price, escrow and chain id come from the committee's
`/params`. Errors are `PlanetError`s: `MintIncomplete` when too few validators answered,
`MintRefused` when the chain refused the mint (by code),
`MintUnfunded` when the validators did not vouch for it within the wait, `NoCreditKey` when
the key period's committee key did not form within the wait (a new chain's first blocks run
its DKG: the purchase waits for it, one progress line per block, "waiting for the committee's
credit key (DKG) — block H of ~N").

The CPU work (blinding, unblinding) runs off the event loop, so a long-running process (the
hosted gateway's top-up, node/gateway/topup.py) can buy while it serves.

Nothing paid is lost when the client dies or gives up: the purchase (its blinding factors
included) is written to the wallet file before the mint tx is sent (`CreditWallet.hold`), and
`finish_pending` — run first by every `buy_credits` — takes each one on from where the chain
has it:

    not on the chain, its period still open  → the mint tx is sent (again; the id is unique)
    not on the chain, its period over        → dropped: it can never be charged
    on the chain, funded                     → partials gathered, credits into the wallet
    on the chain, refunded                   → dropped: fewer than t validators posted their
                                               partials by the deadline; the price is paid
                                               back to the payer (a payout row)
    on the chain, still fundable             → waited for (until funded, the wait's end or
                                               the window's end); kept pending while fundable
    on the chain, past its funding window    → dropped: never charged (the chain refuses to
                                               fund it, `MINT_FUND_LATE`)
    landed once, gone now                    → pruned after the retention window: reported
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from nacl.signing import SigningKey

from node.chain.committee_link import NOT_FOUND_QUERY, CommitteeLink
from node.chain.committee_rpc import TxRejectedError
from node.client.credit_wallet import CreditWallet, retired_note
from node.client.mint_request import MintIncomplete, MintRequest, PendingMint, check_anonymity
from protocol.credit_periods import KeySchedule
from protocol.credits import FUND_EPOCHS, MAX_HEIGHT
from protocol.errors import PlanetError, ProtocolError, RemoteError, UnavailableError
from protocol.fields import is_int
from protocol.paid_credits import PaidCredit
from protocol.threshold_mint import NoPeriodKey, PeriodKey

log = logging.getLogger(__name__)

MINT_REPLAYED = 75  # abci_app/codes.py: the mint is already on the chain (an earlier send)
# abci_app/codes.py NO_CREDIT_KEYS, CREDIT_EPOCH: a mint drawn against the key of a period that
# ended before it landed (or whose next key was not formed yet)
RETRY_CODES = frozenset({76, 79})
MINT_PENDING_LIMIT = 85  # the payer holds genesis credits.max_pending_mints unfunded mints
MINT_TRIES = 3
UNKNOWN_QUERY = "query_40"  # abci_app/codes.py: a validator from before `/credit_period`
# abci_app/codes.py MINT_UNFUNDED: a validator whose state is behind the block that funded the
# mint still says it is not funded; asked again until it has caught up
MINT_UNFUNDED_QUERY = "query_83"
# abci_app/codes.py PARTIALS_NOT_POSTED: the validator's watcher has not posted its partials on
# the chain yet (it does within a pass of the funding); asked again like a lagging validator
PARTIALS_NOT_POSTED_QUERY = "query_114"
NOT_YET_QUERIES = frozenset({MINT_UNFUNDED_QUERY, PARTIALS_NOT_POSTED_QUERY})
LAGGING_RETRY_S = 0.5
# `planet credits buy --min-anonymity`: the fewest buyers of a key period (this one included)
# under which the client refuses to mint (docs/privacy.md "Key periods"); 1 refuses nothing
DEFAULT_MIN_ANONYMITY = 1
# how long a purchase waits for the key period's committee key (a new chain's DKG runs in its
# first ~3 · dkg_phase_blocks blocks: about a minute at one block a second)
KEY_WAIT_S = 180.0


class NoCreditKey(ProtocolError):
    """The key period's committee key did not form within the purchase's wait."""

    code = "no_credit_key"


async def _period_answer(link: CommitteeLink) -> dict[str, Any]:
    """The current key period's `/credit_period` answer (ProtocolError, by name, from a
    committee from before key periods: it sells no credits this client can buy)."""
    try:
        answer = await link.query("/credit_period")
    except RemoteError as error:
        if error.code in (NOT_FOUND_QUERY, UNKNOWN_QUERY):
            raise ProtocolError(
                "this committee has no credit key periods: it sells no credits this client can buy",
                hint="upgrade the committee's validators",
            ) from None
        raise
    if not isinstance(answer, dict):
        raise ProtocolError(f"/credit_period: expected an object, got {type(answer).__name__}")
    return answer


def key_progress(answer: Mapping[str, Any]) -> tuple[int, int]:
    """(H, N) of a `/credit_period` answer whose key is not formed: the committed height and
    the block whose end forms the key (the run's `finish`, else the schedule's); ProtocolError,
    by name, for an answer without them."""

    def count(value: Any, name: str, low: int = 0) -> int:
        if not is_int(value, low, MAX_HEIGHT):
            raise ProtocolError(f"/credit_period: {name} {value!a} is not a block count")
        return int(value)

    height = count(answer.get("committed_height"), "committed_height")
    run = answer.get("run")
    if isinstance(run, dict) and is_int(run.get("finish"), 0, MAX_HEIGHT):
        return height, int(run["finish"])
    schedule = KeySchedule(
        count(answer.get("key_period_blocks"), "key_period_blocks", 1),
        count(answer.get("dkg_phase_blocks"), "dkg_phase_blocks", 1),
    )
    return height, schedule.dkg_finish_height(count(answer.get("period"), "period"))


async def wait_for_key(
    link: CommitteeLink,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    progress: Callable[[str], None] = log.info,
) -> tuple[dict[str, Any], PeriodKey]:
    """The current key period's answer and formed key, waited for up to `timeout_s` (one
    progress line per new block: "waiting for the committee's credit key (DKG) — block H of
    ~N"); `NoCreditKey`, named, with a hint, when it does not form in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    shown = -1
    while True:
        answer = await _period_answer(link)
        try:
            return answer, PeriodKey.from_answer(answer)
        except NoPeriodKey:
            pass
        height, finish = key_progress(answer)
        if loop.time() >= deadline:
            run = answer.get("run") or {}
            failed = (run.get("result") or {}).get("failed") if isinstance(run, dict) else None
            why = f" (its last run failed: {failed})" if failed else ""
            raise NoCreditKey(
                f"the committee's credit key of key period {answer.get('period')} did not form "
                f"within {timeout_s:.0f} s{why}: block {height} of ~{finish}",
                hint="the validators make it by an on-chain DKG in a new chain's first blocks "
                "(and again before each key period): run `planet credits buy` again in a "
                "minute; nothing was charged",
            )
        if height != shown:
            shown = height
            progress(f"waiting for the committee's credit key (DKG) — block {height} of ~{finish}")
        await asyncio.sleep(poll_s)


class MintRefused(ProtocolError):
    """The committee refused the mint tx; `tx_code` is its result code (docs/credits.md)."""

    code = "mint_refused"

    def __init__(self, tx_code: int, text: str) -> None:
        hint = None
        if tx_code == MINT_PENDING_LIMIT:
            hint = (
                "your earlier purchases still wait for their funding: deposit enough to cover "
                "them (`planet balance deposit … --credits`) and run `planet credits finish`, "
                "or buy again once they lapse (two epochs after they were sent)"
            )
        super().__init__(f"the committee refused the mint (code {tx_code}): {text}", hint=hint)
        self.tx_code = tx_code


class MintUnfunded(ProtocolError):
    """The validators did not vouch for the mint. `final`: its funding window is over, so it
    can never be charged (dropped from the wallet); otherwise it stays pending in the wallet
    while it can still be funded (then `finish_pending` completes it)."""

    code = "mint_unfunded"

    def __init__(self, message: str, *, final: bool, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.final = final


class MintLost(ProtocolError):
    """A mint that landed is no longer on the chain (pruned past the retention window)."""

    code = "mint_lost"


async def current_epoch(link: CommitteeLink) -> int:
    """The epoch of the committee's next block (a mint of an earlier epoch can no longer land;
    one of an epoch before this − FUND_EPOCHS can no longer be funded)."""
    return int((await link.query("/credit_keys"))["epoch"])


async def wait_funded(
    link: CommitteeLink,
    mint_id: str,
    epoch: int,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    progress: Callable[[str], None] = log.info,
) -> int:
    """The height that funded mint `mint_id` (of `epoch`), polled until `timeout_s` or until its
    funding window is over (then `MintUnfunded`, `final` in the second case)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    progress(f"mint {mint_id[:18]}… sent; waiting for the validators to check your balance")
    while True:
        record = await link.query("/mints", id=mint_id)
        funded = record.get("funded_height") if isinstance(record, dict) else None
        if type(funded) is int:
            return funded
        vouched = record.get("vouched") if isinstance(record, dict) else None
        voters = len(vouched) if isinstance(vouched, list) else 0
        hint = (
            "deposit to the balance credits are paid from (`planet balance deposit 0.001 "
            "--credits`: the escrow's own address), wait for it to be mined, and buy again"
        )
        if await current_epoch(link) > epoch + FUND_EPOCHS:
            raise MintUnfunded(
                f"mint {mint_id} was not funded by the end of epoch {epoch + FUND_EPOCHS} "
                f"({voters} validators vouched; your balance did not cover it): nothing was "
                "charged",
                final=True,
                hint=hint,
            )
        if loop.time() >= deadline:
            raise MintUnfunded(
                f"mint {mint_id} was not funded within {timeout_s:.0f} s ({voters} validators "
                "vouched): nothing is charged unless the validators vouch for it by the end of "
                f"epoch {epoch + FUND_EPOCHS}; it stays in your credit file until then",
                final=False,
                hint=hint.replace("and buy again", "then run `planet credits finish`"),
            )
        await asyncio.sleep(poll_s)


async def _record(link: CommitteeLink, mint_id: str) -> dict[str, object] | None:
    try:
        record = await link.query("/mints", id=mint_id)
    except RemoteError as error:
        if error.code == NOT_FOUND_QUERY:
            return None
        raise
    return record if isinstance(record, dict) else None


# (mint id, enough) → the validators' answers: all of them, or as soon as `enough` arrived
GatherPartials = Callable[..., Awaitable[list[dict[str, Any]]]]


def partials_from(validator_rpcs: Sequence[str], timeout_s: float) -> GatherPartials:
    """Each validator's partial signatures for a threshold mint as it posted them on the chain
    (`/credit_partials` answers only a set the chain verified and holds: a client never gets a
    partial of a mint the chain may refund): a validator that does not answer is logged and
    left out; `finalize` checks every partial against that validator's public share and needs
    t of them. Called once the mint is funded: a validator still behind the funding block
    answers MINT_UNFUNDED, one whose watcher has not posted its set yet PARTIALS_NOT_POSTED;
    both are asked again every LAGGING_RETRY_S for up to `timeout_s` (measured: under load two
    of four validators answered MINT_UNFUNDED in one run and the purchase failed with 2 of 3
    partials).

    The validators are asked side by side, and with `enough` the answers return as soon as
    that many arrived (the others' asks are cancelled): once t sets are on the chain it stops
    offering the mint for signing, so a validator that had not posted by then never will, and
    asking it in turn cost each purchase up to `timeout_s` (measured: 20 s per purchase on a
    four-validator chain whose fourth watcher was late)."""

    async def ask(url: str, mint_id: str) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        one = CommitteeLink([url], timeout_s=timeout_s)
        try:
            while True:
                try:
                    answer = await one.query("/credit_partials", mint=mint_id)
                except RemoteError as error:
                    if error.code in NOT_YET_QUERIES and loop.time() < deadline:
                        await asyncio.sleep(LAGGING_RETRY_S)
                        continue
                    raise
                return answer if isinstance(answer, dict) else None
        finally:
            await one.close()

    async def answer_of(url: str, mint_id: str) -> dict[str, Any] | None:
        try:
            return await ask(url, mint_id)
        except PlanetError as error:
            log.warning("validator %s gave no partial signatures: %s", url, error.message)
            return None

    async def gather(mint_id: str, enough: int | None = None) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = []
        asks = [asyncio.ensure_future(answer_of(url, mint_id)) for url in validator_rpcs]
        try:
            for done in asyncio.as_completed(asks):
                answer = await done
                if answer is not None:
                    answers.append(answer)
                if enough is not None and len(answers) >= enough:
                    break
        finally:
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        return answers

    return gather


async def current_period(link: CommitteeLink) -> int:
    """The key period of the committee's next block."""
    return int((await link.query("/credit_period"))["current_period"])


async def complete(
    link: CommitteeLink,
    gather_partials: GatherPartials,
    wallet: CreditWallet,
    pending: PendingMint,
    *,
    timeout_s: float,
    fund_timeout_s: float,
    progress: Callable[[str], None] = log.info,
) -> list[PaidCredit]:
    """Take one purchase in flight to credits in the wallet (module docstring's table)."""
    identifier = pending.mint_id
    epoch = pending.epoch
    current = await current_epoch(link)
    record = await _record(link, identifier)
    if record is not None and isinstance(record.get("epoch"), int):
        epoch = int(record["epoch"])  # the epoch it landed in: its funding window's start
    if record is None:
        if pending.landed:
            wallet.drop(identifier)
            raise MintLost(
                f"mint {identifier} of epoch {epoch} landed but is no longer on the chain: "
                "it was pruned before its credits were gathered",
                hint="ask the committee's operators; finish purchases within the retention "
                "window (`planet credits finish`)",
            )
        if await current_period(link) != pending.request.body.period:
            wallet.drop(identifier)
            progress(f"mint {identifier[:18]}… never landed in its time: nothing charged")
            return []
        try:
            sent = await link.submit(pending.request.body)
            code, text = await link.committed_code(sent.hash, timeout_s=timeout_s)
        except TxRejectedError as error:
            code, text = error.tx_code, error.message
        if code not in (0, MINT_REPLAYED):
            wallet.drop(identifier)
            raise MintRefused(code, text)
        pending = pending.seen_landed()
        wallet.hold(pending)
        record = {}
        epoch = await current_epoch(link)  # landed now or just before: fundable from here
    elif not pending.landed:
        pending = pending.seen_landed()
        wallet.hold(pending)
    if type(record.get("funded_height")) is not int:
        if current > epoch + FUND_EPOCHS:
            wallet.drop(identifier)
            progress(f"mint {identifier[:18]}… was never funded in time: nothing charged")
            return []
        try:
            await wait_funded(link, identifier, epoch, timeout_s=fund_timeout_s, progress=progress)
        except MintUnfunded as unfunded:
            if unfunded.final:
                wallet.drop(identifier)
            raise
    refunded = record.get("refunded_height") if record else None
    if type(refunded) is int:
        wallet.drop(identifier)
        progress(
            f"mint {identifier[:18]}… got fewer than t validators' partial signatures by its "
            f"deadline: refunded at block {refunded} (its price is a row of that epoch's "
            "payout to the payer, claimable on the escrow)"
        )
        return []
    progress("funded; gathering the validators' partial signatures")
    # the first t answers make the credits unless one of them does not check: then every
    # validator's (checking every partial is ~1 ms of pairings each: off the event loop, which
    # may be a gateway's streaming answers)
    answers = await gather_partials(identifier, enough=pending.period.threshold)
    try:
        finalized: list[PaidCredit] = list(
            await asyncio.to_thread(pending.request.finalize, pending.period, answers)
        )
    except MintIncomplete:
        progress("a validator's partial signatures did not check: asking every validator")
        answers = await gather_partials(identifier)
        finalized = list(await asyncio.to_thread(pending.request.finalize, pending.period, answers))
    wallet.settle(identifier, finalized)
    return finalized


def note_retired(wallet: CreditWallet, progress: Callable[[str], None]) -> None:
    """Name the RSA credits of before the wallet file holds (they are never spent)."""
    retired = wallet.retired()
    if retired:
        progress(retired_note(retired))


async def finish_pending(
    validator_rpcs: Sequence[str],
    wallet: CreditWallet,
    *,
    timeout_s: float = 20.0,
    fund_timeout_s: float = 60.0,
    progress: Callable[[str], None] = log.info,
) -> list[PaidCredit]:
    """Complete every purchase in flight that `wallet` holds; return the credits gained.
    A purchase that cannot complete now stays pending (its error is logged); one that never can
    be charged is dropped."""
    held = wallet.pending()
    if not held:
        return []
    progress(f"finishing {len(held)} purchase(s) in flight from an earlier run")
    gained: list[PaidCredit] = []
    link = CommitteeLink(list(validator_rpcs), SigningKey.generate())
    try:
        for pending in held:
            try:
                gained += await complete(
                    link,
                    partials_from(validator_rpcs, timeout_s),
                    wallet,
                    pending,
                    timeout_s=timeout_s,
                    fund_timeout_s=fund_timeout_s,
                    progress=progress,
                )
            except PlanetError as error:
                progress(f"mint {pending.mint_id[:18]}…: {error.message}")
    finally:
        await link.close()
    return gained


async def buy_credits(
    validator_rpcs: Sequence[str],
    payer_key: bytes,
    count: int,
    wallet: CreditWallet,
    *,
    expiry: int,
    timeout_s: float = 20.0,
    fund_timeout_s: float = 60.0,
    key_timeout_s: float = KEY_WAIT_S,
    progress: Callable[[str], None] = log.info,
    min_anonymity: int = DEFAULT_MIN_ANONYMITY,
) -> list[PaidCredit]:
    """Mint `count` credits paid from `payer_key`'s prepaid balance; store and return them
    (credits of purchases finished from earlier runs go to the wallet, not into this list).
    Before the key period's committee key has formed (a new chain's first blocks) it waits for
    it up to `key_timeout_s` (`wait_for_key`). A mint whose key period ended before it landed
    (refused, or dropped before it was sent) charged nothing and is drawn again with the new
    period's key, up to MINT_TRIES times; it never returns an empty purchase (UnavailableError
    after the last try)."""
    note_retired(wallet, progress)
    # purchases an earlier run left: finish those that are ready, without waiting for the rest
    # (`planet credits finish` waits for them)
    await finish_pending(
        validator_rpcs, wallet, timeout_s=timeout_s, fund_timeout_s=0.0, progress=progress
    )
    link = CommitteeLink(list(validator_rpcs), SigningKey.generate())
    try:
        params = await link.query("/params")
        genesis = params["genesis"]
        evm, credits = genesis.get("evm") or {}, genesis.get("credits")
        if not credits or not evm.get("escrow_address"):
            raise ProtocolError("this committee does not sell credits (no genesis credits)")
        for attempt in range(1, MINT_TRIES + 1):
            period_answer, period = await wait_for_key(
                link, timeout_s=key_timeout_s, progress=progress
            )
            check_anonymity(period_answer, min_anonymity)
            drawn = await asyncio.to_thread(
                MintRequest.create,
                period,
                count,
                payer_key,
                int(credits["price_wei"]),
                int(evm["chain_id"]),
                evm["escrow_address"],
                expiry,
            )
            pending = PendingMint(drawn, period_answer, await current_epoch(link))
            wallet.hold(pending)  # on disk before anything is sent: nothing paid is ever lost
            try:
                bought = await complete(
                    link,
                    partials_from(validator_rpcs, timeout_s),
                    wallet,
                    pending,
                    timeout_s=timeout_s,
                    fund_timeout_s=fund_timeout_s,
                    progress=progress,
                )
            except MintRefused as refused:
                # drawn under one period's key, landed in the next: nothing was charged
                if refused.tx_code not in RETRY_CODES or attempt == MINT_TRIES:
                    raise
                progress("the key period turned while the mint was on its way; again")
                await asyncio.sleep(attempt * 0.5)
                continue
            if bought:
                return bought
            # dropped uncharged before it was sent (its period ended while it was drawn): a
            # purchase of nothing is not a purchase; draw it again under the new period's key
            progress("the key period turned before the mint was sent; drawing it again")
            await asyncio.sleep(attempt * 0.5)
        raise UnavailableError(
            f"no mint of {count} credits landed in {MINT_TRIES} tries: the committee's key "
            "period turned each time before the mint was on the chain (nothing was charged)",
            hint="run it again; if it keeps failing, the committee's key periods may be too short",
        )
    finally:
        await link.close()
