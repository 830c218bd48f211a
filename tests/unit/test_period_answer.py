"""A `/credit_period` answer is parsed where it enters (`PeriodKey.from_answer`): a malformed one
— a field missing or of the wrong type, bad hex, a point not on the curve or not in the
subgroup — raises one named error, `PeriodAnswerError`, whose message names the field, never a
bare KeyError/ValueError/TypeError; and each caller turns it into its refusal path: the compute
node does not take the credit (`credit_not_taken`, the client keeps it), the agent's till and
the buying client stop by name."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from node.agent.credit_till import CreditTill
from node.client.credit_purchase import wait_for_key
from node.server.payments import Account, CreditCheck, CreditSpool, Payments
from node.server.stream import _pay
from protocol import bls, shamir
from protocol.blind_bls import ThresholdCredit
from protocol.stream import Control, CreditNotTakenError
from protocol.threshold_mint import NoPeriodKey, PeriodAnswerError, PeriodKey

pytestmark = pytest.mark.unit

ADDRESSES = [f"{i:02X}" * 20 for i in (0xA1, 0xB2, 0xC3, 0xD4)]


def _answer() -> dict[str, Any]:
    """A formed key period 0 of 4 receivers, t = 3, as abci_app/period_queries.py answers it."""
    commitments = shamir.commit(shamir.random_polynomial(3))
    shares = {
        address: bls.g2_bytes(shamir.public_share(commitments, i)).hex()
        for i, address in enumerate(ADDRESSES, start=1)
    }
    return {
        "period": 0,
        "current_period": 0,
        "committed_height": 10,
        "key_period_blocks": 30,
        "dkg_phase_blocks": 2,
        "run": {
            "receivers": [[address, "00" * 32] for address in ADDRESSES],
            "threshold": 3,
            "result": {
                "key": bls.g2_bytes(commitments[0]).hex(),
                "public_shares": shares,
                "threshold": 3,
            },
        },
        "buyers": 0,
    }


VALID = _answer()


def _off_curve(valid_hex: str, want: type[bls.BlsError]) -> str:
    """A compressed G2 encoding, the valid one with its last byte changed, that fails with
    `want` (not on the curve, or on it but outside the subgroup)."""
    raw = bytearray.fromhex(valid_hex)
    for last in range(256):
        raw[-1] = last
        try:
            bls.parse_g2(bytes(raw))
        except want:
            return raw.hex()
        except bls.BlsError:
            continue
    raise AssertionError(f"no {want.__name__} encoding found")


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(answer: dict[str, Any]) -> None:
        target = answer
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(answer: dict[str, Any]) -> None:
        target = answer
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


KEY = VALID["run"]["result"]["key"]
FIRST = ADDRESSES[0]
MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "period missing": (_drop(["period"]), "period"),
    "period a string": (_set(["period"], "0"), "period"),
    "period negative": (_set(["period"], -1), "period"),
    "period a bool": (_set(["period"], False), "period"),
    "period a float": (_set(["period"], 0.0), "period"),
    "period past 2^63": (_set(["period"], 1 << 63), "period"),
    "period huge": (_set(["period"], 10**400), "period"),
    "run a list": (_set(["run"], []), "run"),
    "result a string": (_set(["run", "result"], "formed"), "run.result"),
    "receivers missing": (_drop(["run", "receivers"]), "run.receivers"),
    "receivers empty": (_set(["run", "receivers"], []), "run.receivers"),
    "receiver not a pair": (_set(["run", "receivers", 0], FIRST), "run.receivers"),
    "receiver address an int": (_set(["run", "receivers", 0, 0], 7), "run.receivers[0]"),
    "receiver listed twice": (_set(["run", "receivers", 1, 0], FIRST), "run.receivers"),
    "threshold missing": (_drop(["run", "result", "threshold"]), "run.result.threshold"),
    "threshold a string": (_set(["run", "result", "threshold"], "3"), "run.result.threshold"),
    "threshold zero": (_set(["run", "result", "threshold"], 0), "run.result.threshold"),
    "threshold over n": (_set(["run", "result", "threshold"], 5), "run.result.threshold"),
    "threshold a bool": (_set(["run", "result", "threshold"], True), "run.result.threshold"),
    "threshold a float": (_set(["run", "result", "threshold"], 2.0), "run.result.threshold"),
    "threshold huge": (_set(["run", "result", "threshold"], 10**400), "run.result.threshold"),
    "run.result a list": (_set(["run", "result"], []), "run.result"),
    "receivers an object": (_set(["run", "receivers"], {}), "run.receivers"),
    "receiver address a bool": (_set(["run", "receivers", 0, 0], True), "run.receivers[0]"),
    "receiver address lowercase": (
        _set(["run", "receivers", 0, 0], FIRST.lower()),
        "run.receivers[0]",
    ),
    "key not hex": (_set(["run", "result", "key"], "zz" * 96), "run.result.key"),
    "key uppercase hex": (_set(["run", "result", "key"], KEY.upper()), "run.result.key"),
    "key an int": (_set(["run", "result", "key"], 12), "run.result.key"),
    "key a bool": (_set(["run", "result", "key"], True), "run.result.key"),
    "key null": (_set(["run", "result", "key"], None), "run.result.key"),
    "key short": (_set(["run", "result", "key"], KEY[:-2]), "run.result.key"),
    "key identity": (_set(["run", "result", "key"], "c0" + "00" * 95), "run.result.key"),
    "key not on the curve": (
        _set(["run", "result", "key"], _off_curve(KEY, bls.NotOnCurveError)),
        "run.result.key",
    ),
    "key not in the subgroup": (
        _set(["run", "result", "key"], _off_curve(KEY, bls.NotInSubgroupError)),
        "run.result.key",
    ),
    "public shares missing": (_drop(["run", "result", "public_shares"]), "public_shares"),
    "public shares a list": (_set(["run", "result", "public_shares"], []), "public_shares"),
    "public share of a stranger": (
        _set(["run", "result", "public_shares", "EE" * 20], KEY),
        "public_shares",
    ),
    "public share bad hex": (
        _set(["run", "result", "public_shares", FIRST], "0x" + KEY),
        f"public_shares['{FIRST}']",
    ),
    "public share off the curve": (
        _set(["run", "result", "public_shares", FIRST], _off_curve(KEY, bls.NotOnCurveError)),
        f"public_shares['{FIRST}']",
    ),
}


def malformed(name: str) -> dict[str, Any]:
    answer = copy.deepcopy(VALID)
    MALFORMED[name][0](answer)
    return answer


def test_a_valid_answer_parses_into_typed_values() -> None:
    key = PeriodKey.from_answer(VALID, period=0)
    assert key.period == 0 and key.threshold == 3
    assert bls.g2_bytes(key.key).hex() == KEY
    assert key.index_of == {address: i for i, address in enumerate(ADDRESSES, start=1)}
    assert {i: share.hex() for i, share in key.public_shares.items()} == {
        i: VALID["run"]["result"]["public_shares"][a] for a, i in key.index_of.items()
    }


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_answer_is_refused_by_name_naming_its_field(name: str) -> None:
    field = MALFORMED[name][1]
    with pytest.raises(PeriodAnswerError) as raised:
        PeriodKey.from_answer(malformed(name))
    assert field in raised.value.message and raised.value.code == "credit_period_invalid"


@pytest.mark.parametrize("answer", [[], "period 0", None, 3])
def test_an_answer_that_is_not_an_object_is_refused_by_name(answer: Any) -> None:
    with pytest.raises(PeriodAnswerError, match="expected an object"):
        PeriodKey.from_answer(answer)


def test_another_periods_answer_is_refused_by_name() -> None:
    with pytest.raises(PeriodAnswerError, match="asked for key period 1, answered 0"):
        PeriodKey.from_answer(VALID, period=1)


@pytest.mark.parametrize(
    "run", [None, {"receivers": []}, {"result": None}, {"result": {"failed": "too few"}}]
)
def test_a_key_not_formed_is_still_no_period_key(run: Any) -> None:
    with pytest.raises(NoPeriodKey):
        PeriodKey.from_answer({**VALID, "run": run})


class Answers:
    """A validator whose `/credit_period` answer is malformed; its clock is sound."""

    def __init__(self, period_answer: Any) -> None:
        self.period_answer = period_answer

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/credit_keys":
            return {
                "epoch": 2,
                "epoch_length": 5,
                "committed_height": 10,
                "lifetime_epochs": 100,
                "key_period_blocks": 30,
            }
        if path == "/credit_spent":
            return {"height": None, "locked_by": None, "committed_height": 10}
        assert path == "/credit_period", path
        return self.period_answer


CREDIT = ThresholdCredit(0, bytes(32), bytes(48))


@pytest.mark.parametrize("name", ["receivers missing", "key not on the curve", "period a string"])
def test_the_compute_node_does_not_take_the_credit_and_keeps_serving(
    name: str, tmp_path: Any
) -> None:
    """`pay` with the node's validator answering a malformed key period: `credit_not_taken`,
    naming the credit (the client puts it back in its wallet), nothing spooled, and the next
    pay is checked again (nothing cached)."""
    link = Answers(malformed(name))
    payments = Payments(16, CreditCheck(link), CreditSpool(tmp_path))
    account = Account()
    route = SimpleNamespace(account=account)
    state = SimpleNamespace(payments=payments)
    client = SimpleNamespace(opened={1: route})
    control = Control(op="pay", sid=1, credit=CREDIT)
    for _ in range(2):
        with pytest.raises(CreditNotTakenError, match="credit_period_invalid"):
            asyncio.run(_pay(state, client, control))  # type: ignore[arg-type]
    assert account.paid == 0 and list(tmp_path.iterdir()) == []
    assert payments.refused == 2 and payments.accepted == 0


def test_the_agents_till_refuses_by_name() -> None:
    till = CreditTill(Answers(malformed("threshold missing")), "m", 0)
    with pytest.raises(PeriodAnswerError, match=r"run\.result\.threshold"):
        asyncio.run(till.accept(CREDIT))
    assert till.held == []


def test_the_buying_client_stops_by_name() -> None:
    with pytest.raises(PeriodAnswerError, match=r"run\.result\.key"):
        asyncio.run(wait_for_key(Answers(malformed("key short")), timeout_s=0))  # type: ignore[arg-type]
