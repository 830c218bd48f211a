"""The dApp's own JavaScript (dapp/src) run in Node, checked against the Python protocol.

The API key the page builds must parse with `protocol.payment.parse_api_key` and recover to the
depositor for the gateway's domain; the voucher it signs must have `protocol.payment.Voucher`'s
type string and be byte-identical to the key Python signs over the same values (golden); the
receipt check must accept a receipt the gateway signs (`protocol.payment`) and refuse a forged
one; errors must come out in plain words.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from protocol.eip712 import sign_digest
from protocol.payment import (
    Receipt,
    Voucher,
    circuit_hash,
    parse_api_key,
    parse_voucher_key,
    payment_domain,
    receipt_json,
    sign_voucher,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
USER_KEY = "0x" + "42" * 32
GATEWAY_KEY = "0x" + "07" * 32
ESCROW = "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"
# Fixed voucher values, signed by the page's code in Node and by protocol.payment in Python.
VOUCHER = {"query_id": "0x" + "3c" * 32, "fee_cap": str(123 * 10**12), "expiry": "1700000600"}
SECOND_MODEL_ID = "0x" + "22" * 32
# Two pools as GET /v1/pools lists them (node/gateway/app.py `pools`), the first the default.
POOLS = [
    {
        "model": "smollm2-135m",
        "aliases": [],
        "model_hash": "sha256:" + "11" * 32,
        "model_id": "0x" + "11" * 32,
        "shards": 3,
        "routable_per_shard": [1, 2, 1],
        "status": "healthy",
        "price_wei_per_token": str(10**12),
    },
    {
        "model": "smollm2-135m-1p-int8",
        "aliases": ["smollm2-135m-1p-int8"],
        "model_hash": "sha256:" + "22" * 32,
        "model_id": SECOND_MODEL_ID,
        "shards": 1,
        "routable_per_shard": [0],
        "status": "incomplete",
        "price_wei_per_token": str(10**12),
    },
]


def _account(key: str) -> Any:
    from eth_account import Account

    return Account.from_key(key)


def _config() -> dict[str, Any]:
    domain = payment_domain(31337, ESCROW)
    return {
        "chain_id": 31337,
        "escrow": ESCROW,
        "gateway": _account(GATEWAY_KEY).address,
        "model_id": "0x" + "11" * 32,
        "price_wei_per_token": str(10**12),
        "payment_domain": domain.to_json(),
    }


def _receipt(fee: int = 5 * 10**12) -> dict[str, Any]:
    nodes = ["aa" * 32, "bb" * 32]
    receipt = Receipt(
        query_id=b"\x01" * 32,
        gateway=_account(GATEWAY_KEY).address,
        model_id=b"\x11" * 32,
        prompt_tokens=3,
        completion_tokens=2,
        fee=fee,
        circuit_hash=circuit_hash(nodes),
    )
    signature = sign_digest(GATEWAY_KEY, receipt.digest(payment_domain(31337, ESCROW)))
    return receipt_json(receipt, signature, nodes)


def _run(receipt: dict[str, Any] | None) -> dict[str, Any]:
    return json.loads(_run_cached(json.dumps(receipt)))


@functools.cache
def _run_cached(receipt_json_text: str) -> str:
    receipt = json.loads(receipt_json_text)
    if shutil.which("node") is None or not (REPO / "node_modules" / "ethers").is_dir():
        pytest.skip("needs node and node_modules (npm install)")
    done = subprocess.run(
        ["node", str(REPO / "tests" / "dapp" / "js_checks.mjs")],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "DAPP_JS_INPUT": json.dumps(
                {
                    "private_key": USER_KEY,
                    "config": _config(),
                    "receipt": receipt,
                    "voucher": VOUCHER,
                    "second_model_id": SECOND_MODEL_ID,
                    "pools": POOLS,
                }
            ),
        },
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dapp_api_key_parses_and_recovers_the_depositor_in_python() -> None:
    out = _run(_receipt())
    proof = parse_api_key(out["key"])
    assert "0x" + proof.query_id.hex() == out["query_id"]
    # "Grüße, world?" is 15 UTF-8 bytes: price x (15 + 64 + 16)
    assert proof.fee_cap == int(out["fee_cap"]) == 10**12 * (15 + 64 + 16)
    config = _config()
    signer = proof.signer(
        bytes.fromhex("11" * 32), config["gateway"], payment_domain(31337, ESCROW)
    )
    assert signer == out["address"] == _account(USER_KEY).address
    # bound to this gateway: another gateway address recovers someone else
    other = proof.signer(bytes.fromhex("11" * 32), "0x" + "99" * 20, payment_domain(31337, ESCROW))
    assert other != out["address"]


def test_dapp_receipt_check_accepts_the_gateways_signature_and_refuses_a_forgery() -> None:
    good = _run(_receipt())["receipt"]
    assert good["signatureOk"] and good["circuitOk"]
    forged = _receipt()
    forged["fee_wei"] = str(10**15)  # the page must not trust a fee the gateway did not sign
    bad = _run(forged)["receipt"]
    assert not bad["signatureOk"]
    swapped = _receipt()
    swapped["nodes"] = list(reversed(swapped["nodes"]))
    assert not _run(swapped)["receipt"]["circuitOk"]


def test_dapp_errors_are_plain_words() -> None:
    words = _run(None)["words"]
    assert words["rejected"] == "Context: you declined the request in your wallet."
    assert words["wrapped"] == words["rejected"]
    assert words["poor"].startswith("Context: insufficient funds")
    assert "refund timeout has not passed" in words["revert"]
    assert "the gateway does not answer" in words["unreachable"]
    assert words["underfunded"].startswith("Context: unpaid or underfunded question.")
    assert "too small" in words["underfunded"] and "needs 5 wei" in words["underfunded"]
    assert "sees no deposit" in words["unfunded"]
    assert "the pool is incomplete" in words["incomplete"] and "not charged" in words["incomplete"]
    assert "a compute node failed" in words["node_failed"]


def test_dapp_refuses_a_deposit_larger_than_the_escrow_holds() -> None:
    assert _run(None)["too_long"] == "the question is too long for one deposit"


def test_dapp_voucher_type_string_and_key_match_python_byte_for_byte() -> None:
    out = _run(None)["voucher"]
    assert (
        out["type_string"]
        == Voucher.type_string()
        == (
            "Voucher(address gateway,bytes32 queryId,bytes32 modelId,uint256 feeCap,uint64 expiry,"
            "address consumer)"
        )
    )
    config = _config()
    domain = payment_domain(31337, ESCROW)
    voucher = Voucher(
        gateway=config["gateway"],
        query_id=bytes.fromhex(VOUCHER["query_id"][2:]),
        model_id=bytes.fromhex("11" * 32),
        fee_cap=int(VOUCHER["fee_cap"]),
        expiry=int(VOUCHER["expiry"]),
        consumer=ESCROW,
    )
    golden = sign_voucher(USER_KEY, voucher, domain)
    assert out["key"] == golden
    proof = parse_voucher_key(out["key"])
    assert (proof.fee_cap, proof.expiry) == (123 * 10**12, 1_700_000_600)
    model = bytes.fromhex("11" * 32)
    assert proof.payer(model, config["gateway"], domain) == _account(USER_KEY).address
    # bound to this gateway and this escrow: anything else recovers some unfunded address
    assert proof.payer(model, "0x" + "99" * 20, domain) != _account(USER_KEY).address
    other_escrow = payment_domain(31337, "0x" + "77" * 20)
    assert proof.payer(model, config["gateway"], other_escrow) != _account(USER_KEY).address


def test_dapp_voucher_expiry_is_ten_minutes_within_the_gateways_lifetime() -> None:
    out = _run(None)["voucher"]
    assert out["expiry_default"] == str(1_700_000_000 + 600)
    assert out["expiry_short_lifetime"] == str(1_700_000_000 + 60)


def test_dapp_prepaid_amounts_and_withdrawal_in_plain_words() -> None:
    out = _run(None)
    amounts = out["amounts"]
    assert amounts["0.01"] == {"wei": str(10**16)}
    assert amounts[" 1 "] == {"wei": str(10**18)}
    assert amounts["0"] == {"error": "Enter an amount above zero."}
    for bad in ("-1", "1e18", "0.0000000000000000001", "abc", ""):
        assert amounts[bad] == {"error": "Enter an amount in ETH, for example 0.01."}, bad
    withdrawal = out["withdrawal"]
    assert withdrawal["none"] == "none pending"
    assert withdrawal["waiting"].startswith("requested: opens at 2023-11-14T22:23:20Z")
    assert "in about 10 min" in withdrawal["waiting"]
    assert withdrawal["open"] == "open now: withdraw 0.01 ETH to your account"


def test_dapp_prepaid_402s_are_plain_words() -> None:
    words = _run(None)["words"]
    for code in (
        "voucher_malformed",
        "voucher_expired",
        "voucher_expiry_too_far",
        "voucher_over_cap",
        "voucher_replayed",
        "voucher_invalid",
        "balance_withdrawing",
        "balance_insufficient",
    ):
        text = words[code]
        assert text.startswith("Context: the prepaid balance did not pay. "), code
        assert text.endswith(f"(gateway says {code})"), code
    assert "Cancel the withdrawal or pay per question" in words["balance_withdrawing"]
    assert "Add funds or pay per question" in words["balance_insufficient"]
    assert "already used" in words["voucher_replayed"]
    assert "not open yet" in words["withdraw_early"]
    assert "prepaid balance is not charged" in words["node_failed_prepaid"]
    assert "refunded after the timeout" in words["node_failed"]


def test_dapp_pays_for_the_second_model_with_that_model_s_id() -> None:
    """The page signs a question to another model for that model's escrow id: the gateway's
    parsers recover the payer under it, and under the first model's id someone else."""
    out = _run(None)
    config = _config()
    domain = payment_domain(31337, ESCROW)
    second, first = bytes.fromhex(SECOND_MODEL_ID[2:]), bytes.fromhex("11" * 32)
    proof = parse_api_key(out["second"]["key"])
    assert proof.signer(second, config["gateway"], domain) == _account(USER_KEY).address
    assert proof.signer(first, config["gateway"], domain) != _account(USER_KEY).address
    voucher = Voucher(
        gateway=config["gateway"],
        query_id=bytes.fromhex(VOUCHER["query_id"][2:]),
        model_id=second,
        fee_cap=int(VOUCHER["fee_cap"]),
        expiry=int(VOUCHER["expiry"]),
        consumer=ESCROW,
    )
    assert out["second"]["voucher_key"] == sign_voucher(USER_KEY, voucher, domain)
    assert out["second"]["voucher_key"] != out["voucher"]["key"]  # the first model's


def test_dapp_starts_with_the_first_model_or_the_one_the_address_names() -> None:
    initial = _run(None)["models"]["initial"]
    first, second = POOLS[0]["model"], POOLS[1]["model"]
    assert initial["none"] == {"model": first, "notice": None}
    for name in ("second", "by_hash", "padded"):
        assert initial[name] == {"model": second, "notice": None}, name
    for name in ("unknown", "empty", "long"):
        notice = initial[name]["notice"]
        assert initial[name]["model"] == first, name
        assert "this gateway does not serve it" in notice, name
        assert f"it serves “{first}”, “{second}”" in notice, name
        assert f"Showing “{first}”" in notice, name
    assert "the model “llama-70b”" in initial["unknown"]["notice"]
    assert "an empty model name" in initial["empty"]["notice"]
    assert "x" * 81 not in initial["long"]["notice"] and "x" * 80 + "…" in initial["long"]["notice"]
    out = _run(None)["models"]
    assert out["initial_no_pools"] == {"model": None, "notice": None}
    assert out["selected_second"] == second and out["selected_gone"] == first
    assert out["selected_none"] is None


def test_dapp_network_rows_list_every_model_with_hash_shards_price_and_health() -> None:
    out = _run(None)["models"]
    rows = out["rows"]
    assert [(r["model"], r["hash"], r["shards"]) for r in rows] == [
        (POOLS[0]["model"], POOLS[0]["model_hash"], "3"),
        (POOLS[1]["model"], POOLS[1]["model_hash"], "1"),
    ]
    assert {r["price"] for r in rows} == {"1000000000000 wei (0.000001 ETH)"}
    assert rows[0]["health"] == "healthy — routable nodes per shard 1 / 2 / 1"
    assert rows[1]["health"] == "incomplete — routable nodes per shard 0"
    assert [r["current"] for r in rows] == [False, True]  # the view describes the second
    assert [r["hash_short"] for r in rows] == ["sha256:11111111…", "sha256:22222222…"]
    assert out["rows_none"] == []
    assert out["short_hashes"] == ["sha256:abababab…", "sha256:abcd", "?", "plain-na…"]


def test_dapp_shows_which_model_answered_and_flags_another() -> None:
    answered = _run(None)["models"]["answered"]
    second = POOLS[1]["model"]
    assert answered["ok"] == {"text": f"Answered by {second}", "ok": True}
    assert answered["no_receipt"] == {"text": f"Answered by {second}", "ok": True}
    assert not answered["other_name"]["ok"]
    assert answered["other_name"]["text"] == f"Answered by smollm2-135m, but you asked {second}"
    assert not answered["other_id"]["ok"] and "0x" + "11" * 32 in answered["other_id"]["text"]
    assert answered["unnamed"]["text"].startswith("Answered by an unnamed model")


def test_dapp_model_not_served_is_plain_words() -> None:
    text = _run(None)["words"]["model_not_found"]
    assert text.startswith("No answer: this gateway does not serve that model (")
    assert "Pick one of the models under “Model pool”" in text and "not charged" in text
