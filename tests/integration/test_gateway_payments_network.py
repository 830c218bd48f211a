"""Money at a real gateway process with real nodes (harness/gateway_net.py: anvil + contracts,
one CometBFT validator with the committee app, one int8 SmolLM2 node per shard, `planet gateway
serve`): raw HTTP clients hang up at every point and the receipts show what went out; a prepaid
payer hanging up after every answer never gets more than its balance holds; the official
`openai` client spends ONE payment key (`planet key new`) over 20 questions, streamed and not,
and the 21st is refused by name; `planet key revoke` stops it; a voucher or key expiring before
the committee could charge it is refused; a gateway whose escrow refunds too early does not
start; a client hanging up while its answer moves to a replica (the serving node killed, the
replica frozen mid-replay) is charged what the nodes produced, and the question ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest

from harness.gateway_net import (
    ETHER,
    PASSWORD,
    PRICE,
    GatewayNet,
    ephemeral_port,
    http_json,
    prepared_manifest,
    wait_for,
)
from node.procs import run_captured
from protocol.payment import (
    PaymentKey,
    payment_domain,
    sign_payment_key,
    verify_key_receipt_json,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
DEPOSIT = ETHER // 100


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    run_dir = tmp_path_factory.mktemp("gateway-pay-net")
    network = GatewayNet.start(run_dir, manifest, staked=[0, 1], unstaked=[])
    try:
        yield network
    finally:
        network.close()


@pytest.fixture(scope="module")
def user(net: GatewayNet) -> Any:
    return net.account("user")


@pytest.fixture(scope="module")
def prompt_tokens(net: GatewayNet, user: Any) -> int:
    """How many tokens STORY is after the chat template (asked once, paid by a deposit)."""
    key, _ = net.pay(user, DEPOSIT)
    answer = client(net, key).chat.completions.create(
        model=net.manifest.model_id, messages=STORY, max_tokens=1, temperature=0
    )
    return int(answer.usage.prompt_tokens)


def client(net: GatewayNet, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{net.gateway_url}/v1", api_key=api_key, max_retries=0)


# --- a raw HTTP client that hangs up where the test says ----------------------------------------


class Raw:
    """One request on its own socket; `reset()` hangs up with a TCP reset (SO_LINGER 0)."""

    def __init__(self, net: GatewayNet, body: dict[str, Any], api_key: str) -> None:
        host, port = net.gateway_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        raw = json.dumps(body).encode()
        self.sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        self.data = b""

    def tokens(self) -> int:
        """Token chunks received so far (with logprobs every token has its own chunk)."""
        count = 0
        for part in self.data.split(b"data: ")[1:]:
            line = part.split(b"\n", 1)[0].strip()
            if not line.startswith(b"{"):
                continue
            try:
                chunk = json.loads(line)
            except ValueError:
                continue
            for choice in chunk.get("choices") or []:
                count += len((choice.get("logprobs") or {}).get("content") or [])
        return count

    def read_tokens(self, count: int) -> None:
        while self.tokens() < count:
            more = self.sock.recv(65536)
            assert more, f"the stream ended after {self.tokens()} of {count} tokens"
            self.data += more

    def drain(self) -> None:
        """Whatever already arrived (so `tokens()` counts everything the gateway sent)."""
        self.sock.setblocking(False)
        try:
            while more := self.sock.recv(65536):
                self.data += more
        except BlockingIOError:
            pass

    def reset(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def ask_body(net: GatewayNet, stream: bool, max_tokens: int = 8) -> dict[str, Any]:
    """Greedy, and with logprobs: every token then comes in its own chunk (countable)."""
    return {
        "model": net.manifest.model_id,
        "messages": STORY,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "stream": stream,
    }


def health(net: GatewayNet) -> dict[str, Any]:
    return http_json(f"{net.gateway_url}/health")


def wait_settled(net: GatewayNet, timeout: float = 60) -> None:
    """Until the gateway has no question in flight (charged or released)."""
    deadline = time.monotonic() + timeout
    while health(net)["in_flight"]:
        assert time.monotonic() < deadline, "a question never ended"
        time.sleep(0.05)
    assert health(net)["held_wei"] == "0"


def receipt(net: GatewayNet, query_id: bytes, api_key: str) -> dict[str, Any] | None:
    request = urllib.request.Request(
        f"{net.gateway_url}/v1/receipts/0x{query_id.hex()}",
        headers={"Authorization": f"Bearer {api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        assert error.code == 404
        return None


def node_forwards(net: GatewayNet) -> int:
    return int(http_json(f"{net.nodes[-1].process.url}/info")["load"]["forwards"])


# --- hang-ups with per-query deposits --------------------------------------------------------


def test_hangup_mid_answer_is_charged_what_went_out(
    net: GatewayNet, user: Any, prompt_tokens: int
) -> None:
    key, query = net.pay(user, DEPOSIT)
    raw = Raw(net, ask_body(net, stream=True, max_tokens=24), key)
    raw.read_tokens(3)
    raw.drain()
    received = raw.tokens()
    raw.reset()
    wait_settled(net)
    doc = receipt(net, query, key)
    assert doc is not None, "tokens went out: the question is charged"
    # a token written after the client's last read, before its reset arrived, is charged too
    assert received <= doc["completion_tokens"] <= received + 1
    assert doc["prompt_tokens"] == prompt_tokens
    assert int(doc["fee_wei"]) == PRICE * (prompt_tokens + doc["completion_tokens"])
    assert doc["completion_tokens"] < 24  # the nodes were stopped
    assert _refused(net, key)["code"] == "payment_used"  # consumed for good


def test_hangup_after_the_last_token_is_charged_the_whole_answer_once(
    net: GatewayNet, user: Any, prompt_tokens: int
) -> None:
    key, query = net.pay(user, DEPOSIT)
    raw = Raw(net, ask_body(net, stream=True, max_tokens=8), key)
    raw.read_tokens(8)  # every token, not the receipt and [DONE]
    raw.reset()
    wait_settled(net)
    doc = receipt(net, query, key)
    assert doc is not None and doc["completion_tokens"] == 8
    assert int(doc["fee_wei"]) == PRICE * (prompt_tokens + 8)


def test_hangup_before_the_first_token_is_charged_the_prompt_or_released(
    net: GatewayNet, user: Any, prompt_tokens: int
) -> None:
    key, query = net.pay(user, DEPOSIT)
    raw = Raw(net, ask_body(net, stream=True), key)
    deadline = time.monotonic() + 30
    while not health(net)["in_flight"]:  # the payment is reserved
        assert time.monotonic() < deadline
        time.sleep(0.01)
    raw.reset()
    wait_settled(net)
    doc = receipt(net, query, key)
    if doc is None:  # it left before its prompt reached a circuit: nothing was done for it
        answer = client(net, key).chat.completions.create(
            model=net.manifest.model_id, messages=STORY, max_tokens=1, temperature=0
        )
        assert answer.usage.completion_tokens == 1  # the same proof still pays
    else:  # the nodes had the prompt: it pays for the prompt, and for no token it never got
        assert (doc["prompt_tokens"], doc["completion_tokens"]) == (prompt_tokens, 0)


def test_hangup_during_a_whole_answer_is_charged_what_the_nodes_produced(
    net: GatewayNet, user: Any, prompt_tokens: int
) -> None:
    key, query = net.pay(user, DEPOSIT)
    before = node_forwards(net)
    raw = Raw(net, ask_body(net, stream=False, max_tokens=64), key)
    deadline = time.monotonic() + 60
    while node_forwards(net) < before + 4:  # the prefill ran and decode steps are under way
        assert time.monotonic() < deadline
        time.sleep(0.02)
    raw.reset()
    wait_settled(net)
    doc = receipt(net, query, key)
    assert doc is not None, "the nodes worked for this client: it pays"
    assert doc["prompt_tokens"] == prompt_tokens
    assert 1 <= doc["completion_tokens"] < 64  # what was produced, and the nodes stopped


def _refused(net: GatewayNet, key: str, **params: Any) -> dict[str, Any]:
    with pytest.raises(openai.APIStatusError) as caught:
        client(net, key).chat.completions.create(
            model=net.manifest.model_id,
            messages=STORY,
            max_tokens=params.get("max_tokens", 4),
            temperature=0,
        )
    assert caught.value.status_code == 402, caught.value.body
    return caught.value.body


# --- prepaid: keys ------------------------------------------------------------------------------


def payment_key(net: GatewayNet, payer: Any, cap: int, *, expires_in_s: int = 3_600) -> str:
    pool = net.pools()
    domain = payment_domain(pool["chain_id"], pool["escrow"])
    key = PaymentKey(
        pool["gateway"],
        os.urandom(32),
        net.model_id,
        cap,
        int(time.time()) + expires_in_s,
        pool["escrow"],
    )
    return sign_payment_key(bytes(payer.account.key), key, domain)


def key_status(net: GatewayNet, key: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{net.gateway_url}/v1/key", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_a_prepaid_payer_hanging_up_after_every_answer_gets_at_most_its_balance(
    net: GatewayNet, prompt_tokens: int
) -> None:
    """Before: the failed last write gave the hold back a second time, so one balance bought
    unlimited answers. Now each answer is charged once, the hold never drops below what was
    charged, and the third question finds the balance spent."""
    required = PRICE * (prompt_tokens + 8)
    payer = net.account("hang-up payer")
    net.fund_balance(payer, 2 * required)
    key = payment_key(net, payer, 100 * required)
    answered = 0
    for _ in range(3):
        raw = Raw(net, ask_body(net, stream=True, max_tokens=8), key)
        raw.data = raw.sock.recv(65536)
        if raw.data.startswith(b"HTTP/1.1 402"):
            while b'"code"' not in raw.data and (more := raw.sock.recv(65536)):
                raw.data += more
            assert b"balance_insufficient" in raw.data
            raw.sock.close()
            break
        raw.read_tokens(8)
        raw.reset()
        wait_settled(net)
        answered += 1
        status = key_status(net, key)
        assert int(status["payer_outstanding_wei"]) == int(status["charged_wei"])  # no overdraft
    assert answered == 2
    status = key_status(net, key)
    assert (status["charged_wei"], status["held_wei"]) == (str(2 * required), "0")
    assert int(status["payer_outstanding_wei"]) == 2 * required


def test_vouchers_and_keys_expiring_before_the_committee_could_charge_them_are_refused(
    net: GatewayNet,
) -> None:
    payer = net.account("short-lived payer")
    net.fund_balance(payer, DEPOSIT)
    voucher, _ = net.voucher(payer, DEPOSIT // 10, expires_in_s=30)
    assert _refused(net, voucher)["code"] == "voucher_expiring"
    assert _refused(net, payment_key(net, payer, DEPOSIT, expires_in_s=30))["code"] == (
        "key_expiring"
    )
    stranger = net.account("never funded")  # or a key made for another gateway: same address
    assert _refused(net, payment_key(net, stranger, DEPOSIT))["code"] == "key_unfunded"


def _planet(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PLANET_HOME": str(home), "PLANET_PASSWORD": "pw"}
    return run_captured(
        [sys.executable, "-m", "planet", *args],
        text=True,
        env=env,
        timeout=120,
    )


def test_openai_client_asks_twenty_questions_with_one_key_then_402_by_name(
    net: GatewayNet, tmp_path: Path, prompt_tokens: int
) -> None:
    from node.keys import create_dev_wallet

    payer = net.account("openai tool")
    net.fund_balance(payer, ETHER // 10)
    create_dev_wallet(tmp_path / "wallet.json", "pw", bytes(payer.account.key))
    per_question = PRICE * (prompt_tokens + 4)  # every answer runs to max_tokens=4
    cap_eth = str(Decimal(20 * per_question) / Decimal(ETHER))
    common = [
        "--gateway",
        net.gateway_url,
        "--deployment",
        str(net.deployment_path),
        "--wallet",
        str(tmp_path / "wallet.json"),
    ]
    made = _planet(tmp_path, "key", "new", "--cap", cap_eth, "--expires", "7d", *common)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("planet-key-v1.") and "\n" not in key
    tool = client(net, key)
    pool = net.pools()
    domain = payment_domain(pool["chain_id"], pool["escrow"])
    totals = []
    for number in range(20):
        params = {"model": net.manifest.model_id, "messages": STORY, "max_tokens": 4}
        if number % 2:
            chunks = list(
                tool.chat.completions.create(
                    **params, temperature=0, stream=True, stream_options={"include_usage": True}
                )
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            doc = chunks[-1].model_extra["planet_receipt"]
        else:
            answer = tool.chat.completions.create(**params, temperature=0)
            assert answer.choices[0].message.content
            doc = answer.model_extra["planet_receipt"]
        charge = verify_key_receipt_json(doc, domain)
        assert charge.payer == payer.address and charge.receipt.fee == per_question
        totals.append(charge.total)
    assert totals == [per_question * n for n in range(1, 21)]  # the cumulative total
    with pytest.raises(openai.APIStatusError) as caught:
        tool.chat.completions.create(
            model=net.manifest.model_id, messages=STORY, max_tokens=4, temperature=0
        )
    assert caught.value.status_code == 402
    assert caught.value.body["code"] == "key_exhausted"  # the 21st, by name
    shown = _planet(tmp_path, "key", "show", key, "--json", *common)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["charged_wei"] == str(20 * per_question)
    # a second key of the same payer, revoked by the wallet: refused from then on
    second = _planet(tmp_path, "key", "new", "--cap", "0.001", "--json", *common)
    text = json.loads(second.stdout)["key"]
    assert (
        client(net, text)
        .chat.completions.create(
            model=net.manifest.model_id, messages=STORY, max_tokens=1, temperature=0
        )
        .choices
    )
    revoked = _planet(tmp_path, "key", "revoke", text, *common)
    assert revoked.returncode == 0, revoked.stderr
    assert _refused(net, text)["code"] == "key_revoked"
    other = tmp_path / "other.json"
    create_dev_wallet(other, "pw", os.urandom(32))
    foreign = _planet(
        tmp_path, "key", "revoke", key, *common[:4], "--wallet", str(other)
    )  # not the key's payer: refused locally, with a hint
    assert foreign.returncode == 2 and "hint:" in foreign.stderr
    assert "Traceback" not in foreign.stderr


def test_a_gateway_whose_escrow_refunds_too_early_refuses_to_start(
    net: GatewayNet, tmp_path: Path
) -> None:
    assert net.anvil is not None and net.committee is not None
    started = run_captured(
        [
            sys.executable, "-m", "planet", "gateway", "serve",
            "--evm-rpc", net.anvil.rpc_url,
            "--deployment", str(net.deployment_path),
            "--committee-rpc", net.committee.rpc,
            "--manifest", str(net.manifest_path),
            "--wallet", str(tmp_path / "wallet.json"),
            "--port", str(ephemeral_port()),
            "--report-max-wait", "600",  # a slow reporter: charges land long after the answer
            "--private-endpoints",
        ],
        text=True,
        env={**os.environ, "PLANET_PASSWORD": PASSWORD},
        timeout=120,
    )  # fmt: skip
    assert started.returncode == 2, started.stderr[-2000:]
    assert "refund timeout is 600 s, shorter than the refund margin of" in started.stderr
    assert "hint:" in started.stderr and "Traceback" not in started.stderr


# --- a hang-up while the answer moves to a replica (runs last: it adds a node and kills one) ----


def _forwards(node: Any) -> int:
    """The node's forward count (0 once it no longer answers)."""
    try:
        return int(http_json(f"{node.process.url}/info", timeout=2)["load"]["forwards"])
    except (OSError, ValueError):
        return 0


def test_a_hang_up_while_the_answer_moves_to_a_replica_is_charged_and_the_question_ends(
    net: GatewayNet, user: Any, prompt_tokens: int
) -> None:
    """A second node joins shard 0. Mid-answer (not streamed) the serving shard-0 node is
    killed and its replica frozen (SIGSTOP), so the gateway's replay of the history hangs there;
    the client hangs up during that replay. The question still ends: charged the prompt and the
    tokens produced, the killed node among the receipt's nodes, nothing left held. (Before, the
    left circuit's record was lost on this hang-up and the gateway never closed the payment.)"""
    (extra,) = net.start_nodes([0])
    net.register(extra, stake=True)
    wait_for(lambda: net.pools()["routable_per_shard"][0] == 2, 60, "the new node routable")
    time.sleep(2.5)  # the gateway's routing view refreshes every 2 s
    shard0 = [next(n for n in net.nodes if n.process.shard == 0), extra]
    last = next(n for n in net.nodes if n.process.shard == 1)
    log = net.run_dir / "gateway.log"
    replays = log.read_text(errors="replace").count("replacement circuit leased")
    key, query = net.pay(user, DEPOSIT)
    before = [_forwards(n) for n in [*shard0, last]]
    raw = Raw(net, ask_body(net, stream=False, max_tokens=64), key)
    wait_for(lambda: _forwards(last) >= before[-1] + 4, 60, "decode steps under way", 0.02)
    (serving,) = [n for n, count in zip(shard0, before, strict=False) if _forwards(n) > count]
    (replica,) = [n for n in shard0 if n is not serving]
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        net.kill_node(serving)
        wait_for(
            lambda: log.read_text(errors="replace").count("replacement circuit leased") > replays,
            30,
            "the gateway replaying the answer on the replica",
        )
        time.sleep(0.5)  # its links opening or its replay under way, frozen at the replica
        raw.reset()
        time.sleep(0.5)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    wait_settled(net)
    doc = receipt(net, query, key)
    assert doc is not None, "the nodes worked for this client: it pays"
    assert doc["prompt_tokens"] == prompt_tokens
    assert 1 <= doc["completion_tokens"] < 64  # what the killed circuit produced
    assert serving.public in doc["nodes"], doc  # the circuit it left is credited
    assert "Traceback" not in log.read_text(errors="replace")
