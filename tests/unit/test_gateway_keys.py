"""Payment keys at the gateway: one key spends question by question until its cap (holds +
charges per (payer, key id), so concurrent questions cannot pass it), every refusal by name,
the running total and revocations survive a restart, receipts carry the cumulative total,
and the HTTP routes: `GET /v1/key`, `POST /v1/keys/revoke`, receipts for key questions."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import aiohttp
import pytest

from node.gateway.app import create_app
from node.gateway.errors import PaymentRequired
from node.gateway.escrow_reads import OnChainBalance
from node.gateway.payments import PaymentDesk
from protocol.eip712 import Domain, address_of
from protocol.payment import (
    KeyFormatError,
    KeyRevocation,
    PaymentKey,
    parse_payment_key,
    payment_domain,
    sign_key_revocation,
    sign_payment_key,
    verify_key_receipt_json,
)
from tests.unit.gateway_fakes import (
    CHAT,
    DOMAIN,
    ESCROW,
    GATEWAY,
    GATEWAY_KEY,
    MODEL_ID,
    PRICE,
    PROMPT_TOKENS,
    USER,
    FakeEscrow,
    build_gateway,
)

pytestmark = pytest.mark.unit

PAYER = address_of(USER)
NODES = ["ab" * 32]
NOW = 1_800_000_000
STRANGER = bytes.fromhex("77" * 32)


def key_text(
    cap: int,
    *,
    expiry: int = NOW + 7 * 86_400,
    signer: bytes = USER,
    key_id: bytes | None = None,
    gateway: str = GATEWAY,
    domain: Domain = DOMAIN,
) -> str:
    consumer = domain.verifying_contract
    key = PaymentKey(gateway, key_id or secrets.token_bytes(32), MODEL_ID, cap, expiry, consumer)
    return sign_payment_key(signer, key, domain)


def desk(escrow: FakeEscrow, path: Path | None = None) -> PaymentDesk:
    return PaymentDesk(
        escrow,
        domain=DOMAIN,
        gateway_address=GATEWAY,
        gateway_key=GATEWAY_KEY,
        model_id=MODEL_ID,
        price_wei_per_token=10,
        receipts_path=path,
        clock=lambda: NOW,
    )


def funded(balance: int = 10**9) -> FakeEscrow:
    escrow = FakeEscrow()
    escrow.balances[PAYER] = OnChainBalance(balance, 0)
    return escrow


async def refused(payments: PaymentDesk, text: str, required: int = 100) -> str:
    with pytest.raises(PaymentRequired) as caught:
        await payments.reserve(parse_payment_key(text), required)
    assert caught.value.http_status == 402
    return str(caught.value.code)


async def test_one_key_pays_twenty_questions_then_key_exhausted() -> None:
    payments = desk(funded())
    text = key_text(20 * 100)
    for number in range(1, 21):
        reservation = await payments.reserve(parse_payment_key(text), 100)
        doc = payments.settle(reservation, 5, 5, NODES)  # 100 wei each
        assert doc["key"]["total_wei"] == str(100 * number)  # the running total
    assert await refused(payments, text) == "key_exhausted"
    status = payments.key_status(parse_payment_key(text))
    assert (status["charged_wei"], status["left_wei"]) == ("2000", "0")


async def test_concurrent_questions_cannot_pass_the_cap() -> None:
    payments = desk(funded())
    text = key_text(300)
    results = await asyncio.gather(
        *(payments.reserve(parse_payment_key(text), 100) for _ in range(5)),
        return_exceptions=True,
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    codes = [r.code for r in results if isinstance(r, PaymentRequired)]
    assert len(granted) == 3 and codes == ["key_exhausted"] * 2
    assert len({r.query_id for r in granted}) == 3  # each question its own query id
    payments.release(granted[0])  # a failed question gives its share of the cap back
    assert (await payments.reserve(parse_payment_key(text), 100)).allowed_wei == 100


async def test_the_key_spends_the_balance_with_the_payers_vouchers_and_other_keys() -> None:
    payments = desk(funded(balance=250))
    first, second = key_text(10**6), key_text(10**6)
    await payments.reserve(parse_payment_key(first), 100)
    await payments.reserve(parse_payment_key(second), 100)
    assert await refused(payments, first) == "balance_insufficient"


@pytest.mark.parametrize(
    "text,code",
    [
        (lambda: key_text(10**6, expiry=NOW), "key_expired"),
        (lambda: key_text(10**6, expiry=NOW + 184), "key_expiring"),
        (lambda: key_text(10**6, expiry=NOW + 91 * 86_400), "key_expiry_too_far"),
        (lambda: key_text(99), "key_exhausted"),
    ],
)
async def test_key_refusals_before_any_chain_read(text: object, code: str) -> None:
    escrow = funded()
    assert await refused(desk(escrow), text()) == code  # type: ignore[operator]
    assert escrow.reads == 0


async def test_malformed_and_unrecoverable_keys_are_named() -> None:
    payments = desk(funded())
    with pytest.raises(PaymentRequired) as caught:
        await payments.reserve(KeyFormatError("bad"), 100)
    assert caught.value.code == "key_malformed"
    good = parse_payment_key(key_text(10**6))
    bad = type(good)(good.key_id, good.cap, good.expiry, b"\x00" * 64 + b"\x1b")
    with pytest.raises(PaymentRequired) as caught:
        await payments.reserve(bad, 100)
    assert caught.value.code == "key_invalid"


@pytest.mark.parametrize(
    "options",
    [
        {"gateway": address_of(STRANGER)},  # made for another gateway
        {"domain": payment_domain(1, ESCROW)},  # for another chain
        {"domain": payment_domain(31337, GATEWAY)},  # for another escrow
        {"signer": STRANGER},  # a stranger's own key, never funded
    ],
)
async def test_a_key_for_elsewhere_recovers_to_an_unfunded_address_named_clearly(
    options: dict,
) -> None:
    payments = desk(funded())
    with pytest.raises(PaymentRequired) as caught:
        await payments.reserve(parse_payment_key(key_text(10**6, **options)), 100)
    assert caught.value.code == "key_unfunded"
    assert "another gateway, model, escrow or chain" in caught.value.message


async def test_a_stranger_reusing_a_key_id_spends_only_its_own_total() -> None:
    """Totals are per (payer, key id): a key id seen on the committee chain cannot be used to
    exhaust or revoke someone else's key."""
    escrow = funded()
    escrow.balances[address_of(STRANGER)] = OnChainBalance(10**9, 0)
    payments = desk(escrow)
    key_id = secrets.token_bytes(32)
    mine = key_text(200, key_id=key_id)
    theirs = key_text(10**6, key_id=key_id, signer=STRANGER)
    for _ in range(3):
        payments.settle(await payments.reserve(parse_payment_key(theirs), 100), 5, 5, NODES)
    assert (await payments.reserve(parse_payment_key(mine), 200)).allowed_wei == 200


@pytest.mark.parametrize(
    "other", [{"expiry": NOW + 8 * 86_400}, {"cap": 10**9}], ids=["other-expiry", "other-cap"]
)
async def test_a_second_key_with_the_same_key_id_is_refused_before_the_chain_and_after_restart(
    tmp_path: Path, other: dict[str, int]
) -> None:
    """Issue 42 attack 7: a key id binds its cap and expiry. A second key the payer signed with
    the same id (another expiry: the committee refuses its charges, AUTHORIZATION_INVALID; or
    another cap) is refused by name, before any chain read, and still after a restart; the first
    key keeps paying."""
    path = tmp_path / "receipts.jsonl"
    escrow = funded()
    payments = desk(escrow, path)
    key_id = secrets.token_bytes(32)
    first = key_text(10**6, key_id=key_id)
    cap, expiry = other.get("cap", 10**6), other.get("expiry", NOW + 7 * 86_400)
    second = key_text(cap, key_id=key_id, expiry=expiry)
    payments.settle(await payments.reserve(parse_payment_key(first), 100), 5, 5, NODES)
    reads = escrow.reads
    assert await refused(payments, second) == "key_id_conflict"
    assert escrow.reads == reads  # refused before the chain was read
    with pytest.raises(PaymentRequired) as caught:  # GET /v1/key: the same refusal
        payments.key_status(parse_payment_key(second))
    assert caught.value.code == "key_id_conflict"
    assert await refused(desk(funded(), path), second) == "key_id_conflict"  # after a restart
    assert (await payments.reserve(parse_payment_key(first), 100)).allowed_wei == 100


async def test_a_second_key_id_use_in_flight_is_refused_too() -> None:
    """The binding holds from the first reservation, not the first charge: two keys with one id
    asked at once cannot both be served."""
    payments = desk(funded())
    key_id = secrets.token_bytes(32)
    held = await payments.reserve(parse_payment_key(key_text(1_000, key_id=key_id)), 100)
    assert await refused(payments, key_text(1_000, key_id=key_id, expiry=NOW + 86_400)) == (
        "key_id_conflict"
    )
    payments.release(held)
    assert await refused(payments, key_text(1_000, key_id=key_id, expiry=NOW + 86_400)) == (
        "key_id_conflict"
    )


async def test_revocation_refuses_the_key_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    text = key_text(10**6)
    proof = parse_payment_key(text)
    payments.settle(await payments.reserve(proof, 100), 5, 3, NODES)  # 80
    signature = sign_key_revocation(USER, KeyRevocation(GATEWAY, proof.key_id), DOMAIN)
    assert await payments.revoke(proof.key_id, bytes.fromhex(signature[2:])) == PAYER
    assert await refused(payments, text) == "key_revoked"
    restarted = desk(funded(), path)
    assert await refused(restarted, text) == "key_revoked"
    assert restarted.key_status(proof)["charged_wei"] == "80"
    assert restarted.outstanding(PAYER) == 80


async def test_a_stranger_cannot_revoke_a_payers_key() -> None:
    payments = desk(funded())
    text = key_text(10**6)
    proof = parse_payment_key(text)
    signature = sign_key_revocation(STRANGER, KeyRevocation(GATEWAY, proof.key_id), DOMAIN)
    with pytest.raises(PaymentRequired) as caught:  # the stranger has nothing here
        await payments.revoke(proof.key_id, bytes.fromhex(signature[2:]))
    assert caught.value.code == "key_unfunded"
    assert (await payments.reserve(proof, 100)).allowed_wei == 100


async def test_restart_keeps_the_running_total_and_fresh_query_ids(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    text = key_text(1_000)
    used = set()
    for _ in range(3):
        reservation = await payments.reserve(parse_payment_key(text), 100)
        used.add(reservation.query_id)
        payments.settle(reservation, 5, 5, NODES)
    restarted = desk(funded(), path)
    assert restarted.outstanding(PAYER) == 300
    reservation = await restarted.reserve(parse_payment_key(text), 700)
    assert reservation.query_id not in used
    doc = restarted.settle(reservation, 5, 5, NODES)
    assert doc["key"]["total_wei"] == "400"
    assert await refused(restarted, text, 601) == "key_exhausted"


async def test_key_receipt_verifies_and_debits_lower_what_is_held(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    text = key_text(1_000)
    proof = parse_payment_key(text)
    doc = payments.settle(await payments.reserve(proof, 100), 5, 2, NODES)  # 70
    charge = verify_key_receipt_json(doc, DOMAIN)
    assert (charge.payer, charge.total, charge.key.cap) == (PAYER, 70, 1_000)
    assert payments.undebited_keys() == {(PAYER, proof.key_id): (70, 0)}
    assert payments.mark_key_debited(PAYER, proof.key_id, 70) == 70
    assert payments.mark_key_debited(PAYER, proof.key_id, 70) == 0  # idempotent
    assert payments.outstanding(PAYER) == 0
    assert desk(funded(), path).outstanding(PAYER) == 0  # the debit was logged


# --- the HTTP routes -----------------------------------------------------------------------------


@pytest.fixture
async def app_client(aiohttp_client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import node.gateway.app as gateway_app
    from tests.unit.gateway_fakes import Script, ScriptedGeneration

    script = Script()
    monkeypatch.setattr(ScriptedGeneration, "script", script, raising=False)
    monkeypatch.setattr(gateway_app, "Generation", ScriptedGeneration)
    escrow = funded()
    http = aiohttp.ClientSession()
    gateway = build_gateway(tmp_path, http, escrow)
    client = await aiohttp_client(create_app(gateway))
    yield client, script
    await http.close()


def real_key(cap: int) -> str:
    return key_text(cap, expiry=int(time.time()) + 3_600)


async def test_http_key_status_revoke_and_receipts(app_client) -> None:
    client, script = app_client
    required = PRICE * (PROMPT_TOKENS + 2)
    text = real_key(2 * required)
    headers = {"Authorization": f"Bearer {text}"}
    script.tokens(10, 11)
    answer = await client.post(
        "/v1/chat/completions", json={**CHAT, "max_tokens": 2}, headers=headers
    )
    body = await answer.json()
    receipt = body["planet_receipt"]
    assert receipt["key"]["total_wei"] == str(required)
    again = await client.get(f"/v1/receipts/{receipt['query_id']}", headers=headers)
    assert await again.json() == receipt
    status = await (await client.get("/v1/key", headers=headers)).json()
    assert (status["charged_wei"], status["left_wei"]) == (str(required), str(required))
    proof = parse_payment_key(text)
    revocation = {
        "key_id": "0x" + proof.key_id.hex(),
        "signature": sign_key_revocation(USER, KeyRevocation(GATEWAY, proof.key_id), DOMAIN),
    }
    done = await client.post("/v1/keys/revoke", json=revocation)
    assert (await done.json())["revoked"] is True
    refused_answer = await client.post(
        "/v1/chat/completions", json={**CHAT, "max_tokens": 2}, headers=headers
    )
    assert refused_answer.status == 402
    assert (await refused_answer.json())["error"]["code"] == "key_revoked"


async def test_http_a_second_key_with_the_same_id_is_refused_and_nothing_is_served(
    app_client,
) -> None:
    """Over HTTP: the first key is served; a second key with its id and another expiry gets
    402 `key_id_conflict` and no circuit is asked (nothing served, nothing charged)."""
    client, script = app_client
    required = PRICE * (PROMPT_TOKENS + 2)
    key_id = secrets.token_bytes(32)
    expiry = int(time.time()) + 3_600
    first = key_text(10 * required, key_id=key_id, expiry=expiry)
    second = key_text(10 * required, key_id=key_id, expiry=expiry + 600)
    script.tokens(10, 11)
    answer = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "max_tokens": 2},
        headers={"Authorization": f"Bearer {first}"},
    )
    assert answer.status == 200
    script.started.clear()
    script.tokens(12, 13)  # what the nodes would answer, were they asked
    refused_answer = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "max_tokens": 2},
        headers={"Authorization": f"Bearer {second}"},
    )
    assert refused_answer.status == 402
    error = (await refused_answer.json())["error"]
    assert error["code"] == "key_id_conflict" and "planet key new" in error["message"]
    assert not script.started.is_set() and script.queue.qsize() == 2  # no circuit was asked
    status = await client.get("/v1/key", headers={"Authorization": f"Bearer {first}"})
    assert (await status.json())["charged_wei"] == str(required)  # the first key's charge only


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"key_id": "0x" + "AB" * 32, "signature": "0x" + "00" * 65},
        {"key_id": "0x" + "ab" * 32, "signature": "0x" + "00" * 64},
        {"key_id": ["x"], "signature": 5},
    ],
)
async def test_http_revoke_refuses_malformed_bodies_by_name(app_client, body: dict) -> None:
    client, _ = app_client
    answer = await client.post("/v1/keys/revoke", json=body)
    assert answer.status == 400
    assert (await answer.json())["error"]["code"] == "invalid_value"


async def test_http_key_status_needs_a_payment_key(app_client) -> None:
    client, _ = app_client
    answer = await client.get("/v1/key", headers={"Authorization": "Bearer planet-key-v1.zz"})
    assert answer.status == 402
    assert (await answer.json())["error"]["code"] == "key_malformed"


def test_the_work_ledger_takes_a_key_paid_receipt_without_a_deposit_fee() -> None:
    """A key-paid receipt is neither a per-query deposit nor a voucher: its fee is not reported
    as a query fee (the key's running total goes to the committee as a
    charge item, docs/committee.md Settlement)."""
    from node.gateway.settlement import WorkLedger

    ledger = WorkLedger()
    receipt = {
        "query_id": "0x" + "11" * 32,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "fee_wei": "50",
        "payer": PAYER,
        "gateway": "0x" + "44" * 20,
        "model_id": "0x" + "55" * 32,
        "key": {
            "key_id": "0x" + "33" * 32,
            "total_wei": "50",
            "cap_wei": "1000",
            "expiry": "2000000000",
            "signature": "0x" + "66" * 65,
        },
    }
    ledger.record(receipt)
    assert ledger.queries == {}
    [(item, _seq)] = ledger.charges.values()
    assert (item.kind, item.id, item.total, item.cap) == ("key", "0x" + "33" * 32, 50, 1000)
