"""`partials_from` once a mint is funded: a validator whose state is still behind the funding
block answers MINT_UNFUNDED (`query_83`) and is asked again until it has caught up; any other
refusal leaves that validator out at once. The validators are in-process fakes of
`CommitteeLink` (one per URL, as `partials_from` makes them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import node.client.credit_purchase as purchase
from protocol.errors import RemoteError

PARTIALS = {"partials": ["p"]}


class Validator:
    """Answers `/credit_partials` with MINT_UNFUNDED `behind` times, then `answer`."""

    def __init__(self, behind: int, answer: Any = PARTIALS, code: str = "query_83") -> None:
        self.behind, self.answer, self.code, self.asked = behind, answer, code, 0

    async def query(self, path: str, **params: Any) -> Any:
        assert path == "/credit_partials" and params == {"mint": "0xm"}
        self.asked += 1
        if self.asked <= self.behind:
            raise RemoteError("validator", self.code, "mint 0xm is not funded yet")
        return self.answer


def _gather(
    monkeypatch: pytest.MonkeyPatch,
    validators: dict[str, Validator],
    timeout_s: float,
    enough: int | None = None,
):
    class Link:
        def __init__(self, urls: list[str], timeout_s: float) -> None:
            [self.url] = urls

        async def query(self, path: str, **params: Any) -> Any:
            return await validators[self.url].query(path, **params)

        async def close(self) -> None:
            return None

    monkeypatch.setattr(purchase, "CommitteeLink", Link)
    monkeypatch.setattr(purchase, "LAGGING_RETRY_S", 0.01)
    return asyncio.run(purchase.partials_from(list(validators), timeout_s)("0xm", enough=enough))


def test_a_validator_behind_the_funding_block_is_asked_again_until_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    validators = {"a": Validator(0), "b": Validator(3), "c": Validator(2), "d": Validator(0)}
    answers = _gather(monkeypatch, validators, timeout_s=5.0)
    assert answers == [PARTIALS] * 4
    assert [v.asked for v in validators.values()] == [1, 4, 3, 1]


def test_a_validator_still_behind_at_the_deadline_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    validators = {"a": Validator(0), "b": Validator(10**9)}
    answers = _gather(monkeypatch, validators, timeout_s=0.1)
    assert answers == [PARTIALS]
    assert validators["b"].asked > 1


def test_any_other_refusal_leaves_the_validator_out_without_asking_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    validators = {"a": Validator(1, code="query_42"), "b": Validator(0)}
    answers = _gather(monkeypatch, validators, timeout_s=5.0)
    assert answers == [PARTIALS]
    assert validators["a"].asked == 1


def test_enough_answers_end_the_gathering_without_waiting_for_a_validator_that_never_posts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once t sets are on the chain it stops offering the mint for signing: a validator that
    had not posted by then answers PARTIALS_NOT_POSTED until the deadline. With `enough` (t)
    the gathering ends at the t-th answer; before, the validators were asked in turn and the
    late one was asked again for the whole `timeout_s` (here 30 s) first."""
    validators = {
        "a": Validator(0),
        "late": Validator(10**9, code="query_114"),  # PARTIALS_NOT_POSTED
        "c": Validator(1),
        "d": Validator(0),
    }
    answers = _gather(monkeypatch, validators, timeout_s=30.0, enough=3)
    assert answers == [PARTIALS] * 3
    assert validators["late"].asked < 50  # ~3,000 asks at one every 10 ms over 30 s before


def test_without_enough_every_validator_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    validators = {"a": Validator(0), "b": Validator(5), "c": Validator(2)}
    answers = _gather(monkeypatch, validators, timeout_s=5.0)
    assert answers == [PARTIALS] * 3 and validators["b"].asked == 6
