"""The web dApp in a real Chromium against the session's shared devnet (tests/e2e/conftest.py).

The module runs one `node tests/dapp/run.mjs` (Debian's /usr/bin/chromium driven by
playwright-core, started once: a browser start is seconds of CPU); each test sends it its
scenario and the scenario runs in a fresh browser context of its own (its own storage and its
own injected EIP-1193 provider, which signs with the test's devnet key and forwards everything
else to the real anvil), the page served by the devnet gateway at `/`. The page's words
are checked here, and what it claims (deposit, depositor, balance, receipt) against the chain
with web3 and `protocol.payment`. Screenshots (desktop 1280x800, phone 390x844) go to
test-artifacts/dapp/. No console error is allowed in any scenario. Each scenario signs with a
wallet of its own, funded by `planet devnet fund`, so balances and prepaid amounts are its own.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.devnet_session import User

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "dapp"
SCENARIO_TIMEOUT_S = 420
FUNDED, SETTLED = 1, 2  # QueryEscrow.QueryStatus


@pytest.fixture(scope="module")
def env(devnet_env: dict[str, str]) -> dict[str, str]:
    if not CHROMIUM.is_file() or shutil.which("node") is None:
        pytest.skip("needs Debian's chromium and node (deploy/setup.sh installs both)")
    if not (REPO / "node_modules" / "playwright-core").is_dir():
        pytest.skip("needs npm packages (npm install; deploy/setup.sh does it)")
    return devnet_env


@pytest.fixture(scope="module")
def devnet(env: dict[str, str], request: pytest.FixtureRequest) -> dict[str, Any]:
    """The shared devnet, the dApp built (while the devnet comes up, when it is not up yet)."""
    build = subprocess.Popen(
        ["node", "dapp/build.mjs"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        shared_devnet: dict[str, Any] = request.getfixturevalue("shared_devnet")
    finally:
        _, errors = build.communicate(timeout=120)
    assert build.returncode == 0, errors
    assert shared_devnet.get("gateway_url"), "the devnet started no gateway"
    return shared_devnet


@pytest.fixture(scope="module")
def chain(devnet: dict[str, Any]) -> Any:
    from web3 import Web3

    from deploy.evm import load_artifact

    w3 = Web3(Web3.HTTPProvider(devnet["evm_rpc"], request_kwargs={"timeout": 10}))
    abi = load_artifact("QueryEscrow")["abi"]  # the compiled contract the devnet deployed
    escrow = w3.eth.contract(address=devnet["contracts"]["QueryEscrow"], abi=abi)
    return w3, escrow


class _Browser:
    """The module's `node tests/dapp/run.mjs`: one Chromium, a fresh context per scenario; a
    scenario is one JSON line in, its report one JSON line out."""

    def __init__(self, log: Path) -> None:
        self.log = log
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                ["node", str(REPO / "tests" / "dapp" / "run.mjs")],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True,
            )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the process ended

    def run(self, options: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(options) + "\n")
        self.process.stdin.flush()
        try:
            line = self.lines.get(timeout=SCENARIO_TIMEOUT_S)
        except queue.Empty:
            self.process.kill()
            raise AssertionError(
                f"no report within {SCENARIO_TIMEOUT_S} s\n" + self.log.read_text()[-4000:]
            ) from None
        assert line is not None, "run.mjs ended:\n" + self.log.read_text()[-4000:]
        return dict(json.loads(line))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def browser(devnet: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Browser]:
    started = _Browser(tmp_path_factory.mktemp("dapp") / "run.log")
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def user(devnet: dict[str, Any], fresh_user: User) -> Any:
    """This test's own funded wallet (eth_account's LocalAccount)."""
    return fresh_user.key


def _run(scenario: str, browser: _Browser, devnet: dict[str, Any], user: Any, **extra: Any) -> dict:
    result = browser.run(
        {
            "scenario": scenario,
            "gateway": devnet["gateway_url"],
            "rpc": devnet["evm_rpc"],
            "chain_id": int(devnet.get("chain_id") or 31337),
            "private_key": "0x" + bytes(user.key).hex(),
            "artifacts": str(ARTIFACTS),
            "chromium": str(CHROMIUM),
            **extra,
        }
    )
    assert "failure" not in result, (
        result["failure"]
        + "\n"
        + json.dumps(result.get("at_failure"))
        + "\n"
        + json.dumps(result)[:3000]
    )
    assert result["console_errors"] == [], result["console_errors"]
    for shot in result["screenshots"]:
        assert Path(shot).stat().st_size > 10_000, shot
    return result


def _pools(devnet: dict[str, Any]) -> list[dict[str, Any]]:
    """Every model the gateway serves, as GET /v1/pools lists them (the first: the default)."""
    import urllib.request

    with urllib.request.urlopen(devnet["gateway_url"] + "/v1/pools", timeout=10) as answer:
        return list(json.load(answer)["data"])


def _pool(devnet: dict[str, Any]) -> dict[str, Any]:
    return _pools(devnet)[0]


def test_dapp_without_wallet_is_read_only_with_pools_and_network(devnet, browser, user) -> None:
    """Read-only, every served model listed (a pool in the form, a row in the network view),
    and an address naming a model the gateway does not serve says so and shows the first."""
    result = _run("readonly", browser, devnet, user, path="/?model=no-such-model")
    pools = _pools(devnet)
    names = [p["model"] for p in pools]
    assert len(names) == 2, names  # the devnet serves two models (issue 44)
    assert result["pool_models"] == names and result["model_rows"] == names
    for each in pools:
        assert each["model_hash"][:8] in result["models_table"]
    assert result["checked_model"] == names[0]
    assert result["nodes_caption"].endswith(names[0])
    assert result["notice"] and "“no-such-model”" in result["notice"]
    assert "this gateway does not serve it" in result["notice"]
    assert result["readonly_visible"] and "read-only" in result["readonly_text"]
    assert result["badge"].startswith("Read-only")
    assert result["pay_disabled"] and not result["connect_visible"]
    pool = _pool(devnet)
    assert pool["model"] in result["pools"]
    assert f"price {pool['price_wei_per_token']} wei (" in result["pools"]
    assert f"{pool['shards']} shards" in result["pools"]
    assert result["node_rows"] >= pool["shards"]
    assert result["epoch_rows"] >= 1
    assert f"{pool['model']}: pool {pool['status']}" in result["network_summary"]


def test_dapp_wrong_chain_offers_switch_and_switching_enables_pay(devnet, browser, user) -> None:
    result = _run("wrong_chain", browser, devnet, user)
    assert result["badge_before"] == "Wrong network: chain 1"
    assert "Switch networks to ask" in result["notice"]
    assert result["pay_disabled_before"]
    assert result["switch_label"].startswith("Switch to")
    assert "wallet_switchEthereumChain" in result["wallet_calls"]
    assert result["badge_after"].endswith("chain 31337")
    assert not result["notice_after_visible"]
    assert not result["pay_disabled_after"]


def test_dapp_empty_account_gets_insufficient_funds_and_sends_nothing(
    devnet, browser, user
) -> None:
    result = _run("insufficient", browser, devnet, user)
    assert result["balance"] == "0 ETH"
    assert result["notice"].startswith("Insufficient funds")
    assert result["sent_transactions"] == 0


def test_dapp_pays_streams_the_answer_and_the_receipt_matches_the_chain(
    env, devnet, browser, user, chain
) -> None:
    from protocol.payment import payment_domain, verify_receipt_json

    w3, escrow = chain
    before = w3.eth.get_balance(user.address)
    result = _run("pay", browser, devnet, user)
    assert not result["notice_visible"], result.get("notice")
    assert result["account"] == user.address
    assert result["answer"].strip(), "no answer text"
    growth = result["answer_growth"]
    assert len(growth) >= 3 and growth == sorted(growth), growth  # streamed in pieces
    assert any("Deposit sent" in t for t in result["toasts"])
    receipt = result["receipt"]
    assert receipt["signature_class"] == "good", receipt["signature"]
    assert receipt["chain_class"] == "good", receipt["chain"]
    query_id = receipt["query"]
    on_chain = escrow.functions.depositOf(bytes.fromhex(query_id[2:])).call()
    user_on_chain, amount, status, _, model_id, gateway = on_chain
    assert user_on_chain == user.address == receipt["chain_user"]
    # Funded, or already Settled: the epoch's payout root may land between the answer and this
    # read (it did under the lanes' load); never refunded or reclaimed. The page read the
    # deposit while it was Funded; once Settled the chain keeps only what is left of it after
    # the fee (checked below, against the gateway's signed fee).
    assert status in (FUNDED, SETTLED), status
    deposited = int(receipt["chain_amount"])
    if status == FUNDED:
        assert amount == deposited
    assert receipt["deposit"].startswith(f"{deposited} wei")
    # The deposit is bound to the gateway serving the page, for its model.
    pool = _pool(devnet)
    assert gateway == pool["gateway"] and "0x" + model_id.hex() == pool["model_id"]
    # The gateway's copy of the receipt: signed by the gateway, fee within the deposit, and the
    # page's fee and remainder are the receipt's.
    domain = payment_domain(pool["chain_id"], pool["escrow"])
    served = _served_receipt(env, query_id)
    signed, signer = verify_receipt_json(served, domain)
    assert signer == pool["gateway"]
    assert 0 < signed.fee <= deposited
    if status == SETTLED:
        assert amount == deposited - signed.fee
    assert receipt["fee"].startswith(f"{signed.fee} wei")
    assert receipt["remainder"].startswith(f"{deposited - signed.fee} wei")
    if result["answer_note"]:  # "stopped at the length you chose": all 24 tokens were used
        assert signed.completion_tokens == 24, result["answer_note"]
    assert receipt["tokens"] == (
        f"{signed.prompt_tokens} prompt + {signed.completion_tokens} completion"
    )
    # The wallet paid the deposit plus gas; the page's balance is the chain's.
    after = w3.eth.get_balance(user.address)
    assert before - after >= deposited
    assert int(result["balance_before_wei"]) - int(result["balance_after_wei"]) >= deposited
    assert int(result["balance_after_wei"]) == after


def _served_receipt(env: dict[str, str], query_id: str) -> dict[str, Any]:
    """The receipt as the gateway logged it (its receipts file, one JSON object a line)."""
    for log in (Path(env["PLANET_HOME"]) / "devnet").rglob("*receipts.jsonl"):
        for line in log.read_text().splitlines():
            doc = json.loads(line)
            doc = doc.get("receipt", doc)
            if doc.get("query_id") == query_id:
                return doc
    raise AssertionError(f"the gateway logged no receipt for {query_id}")


def test_dapp_rejected_signature_leaves_a_deposit_that_refunds_after_the_timeout(
    devnet, browser, user, chain
) -> None:
    w3, escrow = chain
    timeout_s = escrow.functions.refundTimeout().call()
    result = _run("rejected", browser, devnet, user, refund_timeout_s=timeout_s)
    assert "you declined the request in your wallet" in result["notice"]
    assert "refund it" in result["notice"]
    assert "eth_signTypedData_v4" in result["wallet_calls"]
    assert result["refund_disabled_before"]
    query_id = bytes.fromhex(result["query_id"][2:])
    user_on_chain, amount, status, *_ = escrow.functions.depositOf(query_id).call()
    assert (user_on_chain, amount, status) == (user.address, 0, 4)  # Refunded
    assert "Refunded" in result["history_after"]
    # The refund transaction (hash from the page's toast) paid back the whole deposit.
    deposited = escrow.events.Deposited().get_logs(
        from_block=0, argument_filters={"queryId": query_id}
    )
    assert len(deposited) == 1 and deposited[0]["args"]["amount"] > 0
    refund_tx = w3.eth.get_transaction_receipt(result["refund_tx"])
    refunded = escrow.events.Refunded().process_receipt(refund_tx)
    assert [e["args"]["amount"] for e in refunded] == [deposited[0]["args"]["amount"]]
    gas = refund_tx["gasUsed"] * refund_tx["effectiveGasPrice"]
    # Read from the chain at the refund's own block (anvil mines one tx per block): the page's
    # balance poll can run before that block is visible, so its numbers are not exact here.
    block = refund_tx["blockNumber"]
    delta = w3.eth.get_balance(user.address, block) - w3.eth.get_balance(user.address, block - 1)
    assert delta + gas == deposited[0]["args"]["amount"]
    assert int(result["balance_after_refund_wei"]) >= int(result["balance_before_refund_wei"]) - gas


def test_dapp_prepaid_balance_pays_two_questions_by_voucher_then_withdraws(
    env, devnet, browser, user, chain
) -> None:
    """Add funds, two questions paid by vouchers with no transaction between them (the first to
    the first model, the second to the second model: issue 44), the held amount, then the
    withdrawal: request, cancel, request, the delay, withdraw."""
    from protocol.payment import payment_domain, verify_prepaid_receipt_json

    w3, escrow = chain
    timeout_s = escrow.functions.refundTimeout().call()
    pools = _pools(devnet)
    second = pools[1]["model"]
    result = _run("prepaid", browser, devnet, user, refund_timeout_s=timeout_s, second_model=second)
    assert "Voucher limit for this question" in result["estimate"]
    pool = pools[0]
    fund = w3.eth.get_transaction_receipt(result["fund_tx"])
    [deposited] = escrow.events.BalanceDeposited().process_receipt(fund)
    assert deposited["args"]["payer"] == user.address
    assert deposited["args"]["gateway"] == pool["gateway"] == result["gateway_shown"]
    assert deposited["args"]["amount"] == 10**16
    funded = int(result["prepaid_funded_wei"])
    assert funded == int(result["prepaid_before_wei"]) + 10**16 == deposited["args"]["balance"]
    # Two questions, each a voucher signature and no transaction at all.
    calls = result["calls_while_asking"]
    assert calls.count("eth_signTypedData_v4") == 2
    assert "eth_sendTransaction" not in calls and "eth_sendRawTransaction" not in calls
    domain = payment_domain(pool["chain_id"], pool["escrow"])
    fees = 0
    each: list[int] = []  # each question's fee
    for shown, asked in zip(result["questions"], pools, strict=True):
        assert shown["notice"] is None, shown["notice"]
        # the model picked answered, and the page says which
        assert shown["answer_model"] == f"Answered by {asked['model']}", shown["answer_model"]
        assert shown["answer_model_class"] == "good"
        assert shown["answer"].strip(), "no answer text"
        assert shown["signature_class"] == "good", shown["signature"]
        assert shown["chain_class"] == "good", shown["chain"]
        assert shown["payer"] == user.address and shown["deposit_label"] == "Voucher limit"
        # The gateway's copy: signed by the gateway, the voucher signed by this wallet, fee <= cap.
        charge = verify_prepaid_receipt_json(_served_receipt(env, shown["query"]), domain)
        assert charge.gateway_signer == pool["gateway"] and charge.payer == user.address
        assert 0 < charge.receipt.fee <= charge.voucher.fee_cap
        # the voucher and the receipt name the model asked (its escrow model id)
        assert "0x" + charge.receipt.model_id.hex() == asked["model_id"]
        assert shown["deposit"].startswith(f"{charge.voucher.fee_cap} wei")
        assert shown["fee"].startswith(f"{charge.receipt.fee} wei")
        fees += charge.receipt.fee
        each.append(charge.receipt.fee)
    assert result["questions"][0]["query"] != result["questions"][1]["query"]
    # Until the epoch's root debits them, the gateway holds the fees against the balance; once
    # it is posted the escrow balance falls by them (whichever the page saw).
    # (the two may settle in different epochs: roots so far have debited none, one or both)
    debited = {0, each[0], each[1], fees}
    shown = (int(result["prepaid_after_wei"]), int(result["held_after_wei"]))
    assert shown in {(funded - d, h) for d in debited for h in (fees - d, fees)}, (shown, each)
    # Withdrawal: pending with its opening time, questions refused in words, cancel, withdraw.
    assert result["withdrawal_text"].startswith("requested: opens at ")
    assert int(result["withdrawable_at"]) > 0 and result["withdraw_disabled_before"]
    assert "being withdrawn" in result["withdrawing_notice"]
    assert result["signed_while_withdrawing"] == 0
    assert result["withdrawal_after_cancel"] == "none pending"
    assert result["withdrawal_open_text"].startswith("open now: withdraw")
    withdraw = w3.eth.get_transaction_receipt(result["withdraw_tx"])
    [withdrawn] = escrow.events.BalanceWithdrawn().process_receipt(withdraw)
    assert withdrawn["args"]["gateway"] == pool["gateway"]
    before = escrow.functions.prepaidOf(user.address, pool["gateway"]).call(
        block_identifier=withdraw["blockNumber"] - 1
    )
    # at the withdrawal too, the roots posted so far have debited none, one or both of them
    assert withdrawn["args"]["amount"] == before[0] in {funded - d for d in debited}
    assert tuple(escrow.functions.prepaidOf(user.address, pool["gateway"]).call()) == (0, 0)
    assert result["prepaid_end_wei"] == "0" and result["withdrawal_end"] == "none pending"
