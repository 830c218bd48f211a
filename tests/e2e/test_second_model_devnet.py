"""The devnet's second model (issue 44) on the shared devnet: a multi-model node answers both
models through the hosted gateway and through the personal client.

Every devnet registers a second model (the 1-part int8 SmolLM2 set, deploy/devnet/second_model.py)
served by operator seat0's seat inside node0's process (`planet join --into`). The gateway lists
both in `/v1/models`; the official `openai` client asks each by name with a payment key signed
for that model (`planet key new --model`), and each answer is paid (a receipt for its own model,
served by that model's node); a model nobody serves is refused by name. The user's own client
(`planet gateway serve --personal`, both models by default on the devnet) answers both, paying
the nodes with the user's credits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.personal_client import personal_client
from tests.e2e.devnet_session import User, new_user, planet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "What is the capital of France?"
FIRST, SECOND = "smollm2-135m", "smollm2-135m-1p-int8"  # the names /v1/models gives them
PERSONAL_TEST = "test_personal_client_answers_both_models_of_the_devnet"


def _joined(home: str) -> dict[str, Any]:
    return json.loads((Path(home) / "run" / "joined.json").read_text())


@dataclass(frozen=True)
class _Credits:
    """A user of the personal client's test's own and the credits it bought (`_buy_credits`)."""

    user: User
    credits_file: Path


def _buy_credits(env: dict[str, str], devnet: dict[str, Any], folder: Path) -> _Credits:
    """A funded user deposits a credits balance at the escrow and buys 16 credits."""
    user = new_user(env, devnet, folder / "user")
    credits = folder / "credits.json"
    pay = user.pay_args()
    escrow = devnet["contracts"]["QueryEscrow"]
    deposited = planet(env, "balance", "deposit", "0.00003", "--gateway", escrow, *pay)
    assert deposited.returncode == 0, deposited.stderr[-2000:]
    bought = planet(env, "credits", "buy", "16", "--credits-file", str(credits), *pay,
                    timeout=240)  # fmt: skip
    assert bought.returncode == 0, bought.stderr[-2000:]
    return _Credits(user, credits)


@pytest.fixture(scope="module")
def bought_credits(
    devnet_env: dict[str, str], shared_devnet: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Future[_Credits]]:  # fmt: skip
    """`_buy_credits`, begun in the background with the module's first test (it waits for the
    credits' blind-signed mints while the hosted gateway's test runs: issue 41)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(
            _buy_credits, devnet_env, shared_devnet, tmp_path_factory.mktemp("personal-credits")
        )


@pytest.fixture(scope="module", autouse=True)
def _buying_early(request: pytest.FixtureRequest) -> None:
    """Begins `bought_credits` with the module's first test when the personal client's runs."""
    tests = {getattr(item, "originalname", item.name) for item in request.session.items}
    if PERSONAL_TEST in tests:
        request.getfixturevalue("bought_credits")


def _key(env: dict[str, str], user: User, *model: str) -> str:
    made = planet(env, "key", "new", "--cap", "0.004", *model, "--json", *user.pay_args())
    assert made.returncode == 0, made.stderr[-2000:]
    return str(json.loads(made.stdout)["key"])


def test_gateway_answers_the_second_model_of_a_multi_model_node_and_still_the_first(
    devnet_env: dict[str, str], shared_devnet: dict[str, Any], fresh_user: User
) -> None:
    import openai

    devnet = shared_devnet
    second_hash = devnet["more_model_hashes"][0]
    # the second model is a seat in node0's process, registered under its own node key
    node0, seat0 = (_joined(home) for home in (devnet["operators"][0], devnet["seats"][0]))
    assert seat0["node_pid"] == node0["node_pid"] and seat0["model"] == second_hash
    assert node0["model"] == devnet["model_hash"] != second_hash

    deposited = planet(devnet_env, "balance", "deposit", "0.01", *fresh_user.pay_args())
    assert deposited.returncode == 0, deposited.stderr[-2000:]
    keys = {
        FIRST: _key(devnet_env, fresh_user),
        SECOND: _key(devnet_env, fresh_user, "--model", SECOND),
    }
    base_url = f"{devnet['gateway_url']}/v1"
    api = {name: openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=240)
           for name, key in keys.items()}  # fmt: skip

    listed = {m.id: m.model_extra for m in api[SECOND].models.list().data}
    assert list(listed) == [FIRST, SECOND]
    assert listed[FIRST]["planet_model_hash"] == devnet["model_hash"]
    assert listed[SECOND]["planet_model_hash"] == second_hash

    for name, model_hash, node in (
        (SECOND, second_hash, seat0),
        (FIRST, devnet["model_hash"], None),
    ):
        answer = api[name].chat.completions.create(
            model=name, messages=[{"role": "user", "content": QUESTION}], max_tokens=8,
            temperature=0,
        )  # fmt: skip
        assert answer.model == name
        assert "Paris" in (answer.choices[0].message.content or ""), answer
        receipt = (answer.model_extra or {})["planet_receipt"]
        assert receipt["model_id"] == "0x" + model_hash.removeprefix("sha256:")
        assert int(receipt["fee_wei"]) > 0 and receipt["payer"] == fresh_user.address
        if node is not None:  # the second model's one node: the seat
            assert receipt["nodes"] == [node["node_key"]]

    # a key signed for the first model pays for nothing else, and an unknown model is named
    with pytest.raises(openai.APIStatusError) as wrong_model:
        api[FIRST].chat.completions.create(
            model=SECOND, messages=[{"role": "user", "content": QUESTION}], max_tokens=2
        )
    assert wrong_model.value.status_code == 402
    with pytest.raises(openai.NotFoundError) as unknown:
        api[FIRST].chat.completions.create(
            model="smollm2-135m-7p-int8", messages=[{"role": "user", "content": "hi"}]
        )
    assert unknown.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert SECOND in unknown.value.body["message"]  # type: ignore[index]


def test_personal_client_answers_both_models_of_the_devnet(
    devnet_env: dict[str, str],
    shared_devnet: dict[str, Any],
    bought_credits: Future[_Credits],
    tmp_path: Path,
) -> None:
    import openai

    devnet = shared_devnet
    credits = bought_credits.result().credits_file  # a user's own, bought (`_buy_credits`)
    with personal_client(
        devnet["manifest"],
        devnet["committee_rpc"][0],
        min_positions=64,
        env=devnet_env,
        credits_file=credits,
        log_path=tmp_path / "personal.log",
        extra_args=("--manifest", devnet["more_manifests"][0]),
    ) as client:
        api = openai.OpenAI(base_url=client.base_url, api_key=client.token, max_retries=0)
        assert [m.id for m in api.models.list().data] == [FIRST, SECOND]
        for name in (SECOND, FIRST):
            answer = api.chat.completions.create(
                model=name, messages=[{"role": "user", "content": QUESTION}], max_tokens=8,
                temperature=0,
            )  # fmt: skip
            assert answer.model == name and "Paris" in (answer.choices[0].message.content or "")
            receipt = (answer.model_extra or {})["planet_receipt"]
            assert receipt["paid_with"] == "credits" and receipt["credits_spent"] > 0
