"""Nodes paid per chunk with bearer credits, all real processes: one CometBFT validator with the
committee app (credits on, its key period's committee key formed by the DKG), two `planet node
serve` processes of a tiny model that charge (`--credit-positions 8 --credits-dir`), and their
two real node agents (`python -m node.agent --credits-dir`), which register the nodes and
redeem what they were paid.

A payer buys credits with `planet credits buy`, then `planet ask --credits` (its own process)
answers through the two nodes and pays each exactly ceil(positions / 8) credits; the agents
redeem every one on the chain, where each node's work shows in `/credits` and its spool empties.
An `ask` that does not pay is stopped by the first node by name (`payment_required`); one whose
credits do not cover the next chunk stops with the wallet's own error and a hint, the credits
kept; neither prints a traceback, and the nodes serve on."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from eth_utils import keccak
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from harness.connect_log import connect_logging, connected_ports
from harness.gateway_net import Committee, ephemeral_port, start_committee, wait_for
from harness.personal_client import PersonalClient, personal_client
from harness.relays import relays, write_relays_file
from node.client.circuit import CircuitClient
from node.client.credit_wallet import CreditWallet
from node.client.nodesfile import NodeRef, NodesFile
from node.client.paying import CreditPayer
from node.client.types import Hop
from node.keys import create_dev_wallet, create_node_key
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.procs import Child, run_captured, spawn_logged
from node.server.launcher import NodeProcess, start_node, stop_pid, wait_healthy
from planet.main import main
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import FundMint
from protocol.committee.envelope import decode, sign
from protocol.committee.registry import AttestStake
from protocol.committee.relay_credits import RelayRedeem
from protocol.eip712 import address_of
from protocol.errors import RemoteError
from protocol.paid_credits import parse_paid_credit, spent_id
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.integration

PRICE_POSITIONS = 8
RELAY_BYTES = 2048  # clove bytes that arrived one credit pays a relay for (genesis credits)
LAYER_TOKENS = 4096
PASSWORD = "paid-nodes-test"
PROMPT = "w1 w7 w3 w40 w5"
MAX_TOKENS = 6
EVM = {
    "chain_id": 31337,
    "committee_address": "0x" + "c0" * 20,
    "fraud_proofs_address": "0x" + "f0" * 20,
    "escrow_address": "0x" + "ee" * 20,
}


@contextmanager
def _vouching(committee: Committee) -> Iterator[None]:
    """While open, the validator vouches (`fund_mint`) for every mint waiting for funding, as
    its stake watcher does for a covered one (tests/integration/test_agent_watcher.py), and
    posts its partial signatures for the funded ones (`Committee.post_partials`)."""
    stop, done = threading.Event(), set()

    def vouch() -> None:
        while not stop.wait(0.3):
            for mint in committee.query("/mints?pending=true")["mints"]:
                if mint["id"] not in done:
                    committee.submit(committee.validator_sign(FundMint(mint["id"])))
                    done.add(mint["id"])
            committee.post_partials()  # then its partials for the funded ones, on the chain

    thread = threading.Thread(target=vouch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("paid-nodes")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = Path(prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None))
    model_hash = json.loads(manifest.read_text())["model_hash"]
    nodes: list[NodeProcess] = []
    agents: list[Child] = []
    committee = None
    try:
        committee = start_committee(
            root,
            address_of(keccak(text="paid-nodes operator")),
            epoch_length=100_000,
            evm=EVM,
            app_state={
                "credits": {
                    "price_wei": "1000",
                    "layer_tokens": LAYER_TOKENS,
                    "key_period_blocks": 100_000,
                    "dkg_phase_blocks": 4,  # 2 let a deal land in the complaint blocks under load
                    "relay_bytes": RELAY_BYTES,
                }
            },
        )
        committee.form_credit_key()  # the validator's DKG part (no watcher here)
        password = root / "password"
        password.write_text(PASSWORD)
        homes, accounts, keys = [], [], []
        ports = [ephemeral_port(), ephemeral_port()]
        for shard in range(2):
            home = root / f"operator-{shard}"
            home.mkdir()
            evm = keccak(text=f"paid-nodes evm {shard}")
            accounts.append(create_dev_wallet(home / "wallet.json", PASSWORD, evm).address.lower())
            keys.append(create_node_key(home / "node_key.json", PASSWORD).verify_key.encode().hex())
            homes.append(home)
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=ports[shard],
                    run_dir=root / "run",
                    extra_args=[
                        *("--threads", "1", "--committee-rpc", committee.rpc),
                        *("--next-hops", f"http://127.0.0.1:{ports[1]}" if shard == 0 else "none"),
                        *("--credit-positions", str(PRICE_POSITIONS)),
                        *("--credits-dir", str(home / "credits")),
                        *("--commit-dir", str(home / "served")),  # paid work is committed
                        # its key (plaintext links still): /info announces it, and the client
                        # assigns each credit to it (docs/credits.md, holder keys)
                        *("--node-key", str(home / "node_key.json")),
                    ],
                    extra_env={"PLANET_PASSWORD": PASSWORD},
                )
            )
        wait_healthy(nodes, timeout_s=120)
        for shard, (home, node) in enumerate(zip(homes, nodes, strict=True)):
            command = [sys.executable, "-m", "node.agent", "--home", str(home)]
            command += ["--manifest", str(manifest), "--shard", str(shard)]
            command += ["--endpoint", node.url, "--committee-rpc", committee.rpc]
            command += ["--credits-dir", str(home / "credits"), "--password-file", str(password)]
            command += ["--commit-dir", str(home / "served")]
            # the price on the chain (set_price): clients pay it, never the node's /info alone
            command += ["--credit-positions", str(PRICE_POSITIONS)]
            agents.append(spawn_logged(command, root / "run" / f"agent-{shard}.log"))

        def registered() -> bool:
            return len(committee.nodes(model=model_hash, role="compute")) == 2

        wait_for(registered, 60, "the agents did not register both nodes")

        def priced() -> bool:
            entries = committee.nodes(model=model_hash, role="compute")
            return len(entries) == 2 and all(
                (entry.get("prices") or {}).get(str(shard)) == PRICE_POSITIONS
                for entry in entries
                for shard in entry["shards"]
            )

        wait_for(priced, 60, "the agents did not register both nodes' prices")
        for key in keys:  # staked (as the watchers attest a stake): routable for clients
            committee.submit(committee.validator_sign(AttestStake(key, 10**18)))
        payer = root / "payer.json"
        create_dev_wallet(payer, PASSWORD, keccak(text="paid-nodes payer"))
        nodes_file = root / "nodes.json"
        NodesFile(
            manifest,
            tuple(NodeRef(n.url, n.shard, tuple(s["layers"])) for n, s in _shards(manifest, nodes)),
        ).save(nodes_file)
        yield {
            "root": root,
            "manifest": manifest,
            "committee": committee,
            "nodes": nodes,
            "homes": homes,
            "accounts": accounts,
            "payer": payer,
            "password": password,
            "nodes_file": nodes_file,
            "keys": keys,  # the nodes' ed25519 keys, shard order
        }
    finally:
        for agent in agents:
            agent.terminate()
            agent.wait(timeout=30)
        for node in nodes:
            stop_pid(node.pid, grace_s=5)
        if committee is not None:
            committee.stop()


def _shards(manifest: Path, nodes: list[NodeProcess]) -> list[tuple[NodeProcess, Any]]:
    shards = json.loads(manifest.read_text())["shards"]
    return [(node, shards[node.shard]) for node in nodes]


def _buy(net: dict[str, Any], count: int, credits_file: Path) -> None:
    argv = ["credits", "buy", str(count), "--committee-rpc", net["committee"].rpc]
    argv += ["--wallet", str(net["payer"]), "--password-file", str(net["password"])]
    argv += ["--credits-file", str(credits_file)]
    with _vouching(net["committee"]):
        assert main(argv) == 0
    assert CreditWallet(credits_file).count() == count


def _ask(
    net: dict[str, Any], *extra: str, connects: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`planet ask --json` in its own process; `connects`: where its every socket connect is
    recorded (harness/connect_log.py)."""
    command = [sys.executable, "-m", "planet", "ask", PROMPT, "--nodes"]
    command += [str(net["nodes_file"]), "--max-tokens", str(MAX_TOKENS), "--json", *extra]
    # each node is paid its price on the chain (its agent's set_price), never its /info alone;
    # the user accepts one credit per PRICE_POSITIONS (the client's default cap is dearer)
    command += ["--committee-rpc", net["committee"].rpc]
    command += ["--min-credit-positions", str(PRICE_POSITIONS)]
    env = {**os.environ, "PLANET_HOME": str(net["root"] / "client-home")}
    if connects is not None:
        env = connect_logging(env, net["root"] / "connect-hook", connects)
    return run_captured(command, text=True, timeout=300, env=env)


def test_ask_pays_each_node_per_chunk_and_the_agents_redeem_every_credit(net) -> None:
    credits_file = net["root"] / "credits.json"
    _buy(net, 12, credits_file)
    done = _ask(net, "--credits", "--credits-file", str(credits_file))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    head = ClientHead.load(net["manifest"], device="cpu")
    fed = len(head.chat_ids([{"role": "user", "content": PROMPT}])) + len(answer["tokens"]) - 1
    per_node = -(-fed // PRICE_POSITIONS)
    assert answer["tokens"] and answer["credits_spent"] == 2 * per_node
    assert CreditWallet(credits_file).count() == 12 - 2 * per_node
    # each credit is kept with its holder seed, and each node announces the key it registered,
    # which the client assigned its credits to (a node refuses a credit assigned elsewhere)
    entries = json.loads(credits_file.read_text())["credits"]
    assert entries and all(set(entry) == {"credit", "seed"} for entry in entries)
    for node, key in zip(net["nodes"], net["keys"], strict=True):
        info = json.loads(urllib.request.urlopen(f"{node.url}/info", timeout=10).read())
        assert info["node_key"] == key
    committee = net["committee"]

    def redeemed() -> list[tuple[int, int]] | None:
        if any(list((home / "credits").glob("*.json")) for home in net["homes"]):
            return None
        rows = []
        for account in net["accounts"]:
            rows += committee.query(f"/credits?account={account}")["credits"]
        return sorted((row["shard"], row["layer_tokens"]) for row in rows) or None

    # each agent redeems its node's spool on its next pass (about a second apart)
    assert wait_for(redeemed, 60, "the agents did not redeem the credits") == [
        (0, per_node * LAYER_TOKENS),
        (1, per_node * LAYER_TOKENS),
    ]
    # and locked them with their holders' assignments, which the chain checked
    for shard in range(2):
        log = (net["root"] / "run" / f"agent-{shard}.log").read_text()
        assert re.search(r"credits locked count=\d+ assigned=[1-9]", log), log[-2000:]


def test_an_unpaid_or_underfunded_ask_is_stopped_by_name_and_the_nodes_serve_on(net) -> None:
    unpaid = _ask(net)
    assert unpaid.returncode != 0
    assert "payment_required" in unpaid.stderr and "0 credits paid" in unpaid.stderr
    assert "Traceback" not in unpaid.stderr
    credits_file = net["root"] / "few-credits.json"
    _buy(net, 2, credits_file)  # one chunk per node: the prompt alone needs more
    short = _ask(net, "--credits", "--credits-file", str(credits_file))
    assert short.returncode != 0 and "Traceback" not in short.stderr
    assert "ask for 4 more credits and the credit wallet holds 2" in short.stderr
    assert "planet credits buy" in short.stderr
    assert CreditWallet(credits_file).count() == 2  # nothing taken for a payment refused
    for node in net["nodes"]:  # both nodes serve on
        info = json.loads(urllib.request.urlopen(f"{node.url}/info", timeout=10).read())
        assert info["credit_positions"] == PRICE_POSITIONS and info["credits"]["refused"] == 0


def test_the_personal_client_pays_the_nodes_with_credits_for_the_official_openai_client(
    net,
) -> None:
    """`planet gateway serve --personal`: OpenAI's API on loopback for the user's own tools,
    circuits from the committee's directory, every node paid with the user's credits."""
    import openai

    credits_file = net["root"] / "personal-credits.json"
    _buy(net, 16, credits_file)
    with _personal_client(net, credits_file) as client:
        # the client's own token is the API key; without it (or with another) nothing is served
        for wrong in ("unused", client.token[:-1] + ("A" if client.token[-1] != "A" else "B")):
            stranger = openai.OpenAI(base_url=client.base_url, api_key=wrong, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as caught:
                stranger.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=1
                )
            assert caught.value.code == "token_invalid"
        assert CreditWallet(credits_file).count() == 16  # nothing was paid for them
        api = openai.OpenAI(base_url=client.base_url, api_key=client.token, max_retries=0)
        model = json.loads(net["manifest"].read_text())["model_id"]
        messages = [{"role": "user", "content": PROMPT}]
        # temperature 0: at OpenAI's default of 1 a first sampled EOS (rare) is an empty answer
        whole = api.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        assert whole.choices[0].message.content is not None and whole.usage.completion_tokens
        receipt = whole.model_extra["planet_receipt"]
        assert receipt["paid_with"] == "credits" and receipt["credits_spent"] >= 2
        streamed = api.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, stream=True, temperature=0
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert receipt["credits_left"] == 16 - receipt["credits_spent"]
        # the streamed question was paid from the same credit file, on new sessions
        assert CreditWallet(credits_file).count() < receipt["credits_left"]
    # the private route (the default): the circuit's nodes are kept as the user's guards, in a
    # file only the user reads, for the next questions and the next run
    route = net["root"] / "personal-home" / "route.json"
    model_hash = json.loads(net["manifest"].read_text())["model_hash"]
    guards = json.loads(route.read_text())["models"][model_hash]
    assert [guards[str(shard)]["key"] for shard in range(2)] == receipt["nodes"]
    assert route.stat().st_mode & 0o077 == 0
    # the token: drawn at the first start, kept for its user alone, the same on the next start
    token_file = net["root"] / "personal-home" / "personal-token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip() == client.token
    with _personal_client(net, credits_file) as again:
        assert again.token == client.token


def test_the_personal_client_over_the_overlay_answers_the_same_through_relays(net, capsys) -> None:
    """`--relays FILE --overlay 4,3,1`: every node of the circuit reached over 4 relay paths as
    (4, 3) S-IDA cloves; the official `openai` client's greedy answer is the direct one, every
    node is paid with credits as before, and every relay is paid from the same wallet for the
    cloves its paths delivered (the node's acknowledgements), in PAY cells only it opens; each
    relay, registered on the committee, redeems them there (`planet relay redeem`), every
    credit once (docs/overlay.md)."""
    import openai

    credits_file = net["root"] / "overlay-credits.json"
    _buy(net, 30, credits_file)
    model = json.loads(net["manifest"].read_text())["model_id"]
    messages = [{"role": "user", "content": PROMPT}]

    def ask(client: PersonalClient) -> tuple[str, dict]:
        api = openai.OpenAI(base_url=client.base_url, api_key=client.token, max_retries=0)
        whole = api.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        return whole.choices[0].message.content or "", whole.model_extra["planet_receipt"]

    with _personal_client(net, credits_file) as client:
        direct, _ = ask(client)
    before = CreditWallet(credits_file).count()
    with relays(4, net["root"] / "relays") as started:
        listed = write_relays_file(net["root"] / "relays.txt", started)
        overlay = ("--relays", str(listed), "--overlay", "4,3,1")
        with _personal_client(net, credits_file, extra=overlay) as client:
            overlaid, receipt = ask(client)
        infos = [relay.info() for relay in started]
        homes = [relay.log_path.parent for relay in started]
    assert overlaid == direct and direct
    assert receipt["paid_with"] == "credits" and receipt["credits_spent"] >= 2
    assert all(info["cells_forwarded"] > 0 for info in infos), infos  # every path carried
    # every relay was paid, from the user's wallet, and nothing else left it
    paid = [info["credits_received"] for info in infos]
    assert all(n > 0 for n in paid), paid
    assert before - CreditWallet(credits_file).count() == receipt["credits_spent"] + sum(paid)
    # each relay registers (its own committee key, role relay) and redeems what it holds
    committee = net["committee"]
    first = [
        parse_paid_credit(json.loads(path.read_text())["credit"])
        for path in (homes[0] / "relay-credits").glob("*.json")
    ]
    assert len(first) == paid[0]
    keys = [  # in one block
        _register_relay(committee, home, relay, i, wait=i == len(started) - 1)
        for i, (home, relay) in enumerate(zip(homes, started, strict=True))
    ]
    # relay 0 redeems one of its credits; shown again by relay 1 it is spent for everyone
    # (CREDIT_SPENT by name), and relay 0's own `planet relay redeem` drops it by that name
    committee.submit(sign(RelayRedeem((first[0],)), keys[0], 2).encode())
    with pytest.raises(RuntimeError, match="'code': 78"):
        committee.submit(sign(RelayRedeem((first[0],)), keys[1], 2).encode())
    for i, home in enumerate(homes):
        argv = ["relay", "redeem", "--home", str(home), "--committee-rpc", committee.rpc]
        assert main([*argv, "--password-file", str(net["password"])]) == 0
        refused = "1 CREDIT_SPENT" if i == 0 else "none"
        line = f"redeemed {paid[i] - (i == 0)} of {paid[i]} credits on the committee"
        assert f"{line} (refused: {refused})" in capsys.readouterr().out
        earned = committee.query(f"/relay_credits?key={keys[i].verify_key.encode().hex()}")
        assert sum(row["credits"] for row in earned["epochs"]) == paid[i]
        assert not list((home / "relay-credits").glob("*.json"))  # nothing left held


def test_the_personal_client_over_the_overlay_connects_to_no_node(net) -> None:
    """Issue 43: with `--relays` every request the personal client makes to a node rides the
    relays — the question and answer, and its router's /info reads (verify, price, load) too.
    Every socket connect of the real client process is recorded (a Python audit hook): over
    the overlay it connects to relays and never to a node's port; the same client without
    relays connects to the nodes (the recording sees them)."""
    import openai

    credits_file = net["root"] / "unseen-credits.json"
    _buy(net, 30, credits_file)
    model = json.loads(net["manifest"].read_text())["model_id"]
    node_ports = {int(node.url.rsplit(":", 1)[1]) for node in net["nodes"]}

    def ask(client: PersonalClient) -> str:
        api = openai.OpenAI(base_url=client.base_url, api_key=client.token, max_retries=0)
        whole = api.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        return whole.choices[0].message.content or ""

    direct_log = net["root"] / "connects-direct.txt"
    with _personal_client(net, credits_file, connects=direct_log) as client:
        direct = ask(client)
    assert node_ports <= set(connected_ports(direct_log))  # the recording sees nodes
    overlay_log = net["root"] / "connects-overlay.txt"
    with relays(4, net["root"] / "relays-unseen") as started:
        listed = write_relays_file(net["root"] / "relays-unseen.txt", started)
        overlay = ("--relays", str(listed), "--overlay", "4,3,1")
        with _personal_client(net, credits_file, extra=overlay, connects=overlay_log) as client:
            overlaid = ask(client)
        relay_ports = {int(relay.url.rsplit(":", 1)[1]) for relay in started}
    assert overlaid == direct and direct
    ports = set(connected_ports(overlay_log))
    assert relay_ports <= ports  # every relay was a first hop of some path
    assert not ports & node_ports, sorted(ports & node_ports)  # no node reached directly


def test_ask_over_relays_pays_nodes_and_relays_and_connects_to_no_node(net) -> None:
    """`planet ask --credits --relays FILE` (issue 43): the answer of the direct ask, the nodes
    paid as before and the relays from the same credit file for the cloves that arrived, and
    no socket of the asker ever connects to a node's port (/info reads included), where the
    direct ask connects to both. Relays that cannot be reached stop the question with one
    error and a hint, no node reached and not a credit spent."""
    credits_file = net["root"] / "ask-overlay-credits.json"
    _buy(net, 30, credits_file)
    pay = ("--credits", "--credits-file", str(credits_file))
    node_ports = {int(node.url.rsplit(":", 1)[1]) for node in net["nodes"]}
    direct_log = net["root"] / "ask-connects-direct.txt"
    plain = _ask(net, *pay, connects=direct_log)
    assert plain.returncode == 0, plain.stderr
    assert node_ports <= set(connected_ports(direct_log))  # the recording sees the nodes
    direct = json.loads(plain.stdout)
    before = CreditWallet(credits_file).count()
    overlay_log = net["root"] / "ask-connects-overlay.txt"
    with relays(4, net["root"] / "ask-relays") as started:
        listed = write_relays_file(net["root"] / "ask-relays.txt", started)
        overlay = ("--relays", str(listed), "--overlay", "4,3,1")
        done = _ask(net, *pay, *overlay, connects=overlay_log)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        relayed = answer["relays"]["credits_spent"]

        def received() -> int | None:  # PAY cells sent as the asker closed its links
            total = sum(relay.info()["credits_received"] for relay in started)
            return total if total == relayed else None

        wait_for(received, 30, "the relays did not get what the asker paid them")
        relay_ports = {relay.port for relay in started}
    ports = set(connected_ports(overlay_log))
    assert not ports & node_ports, sorted(ports & node_ports)  # no node reached directly
    assert relay_ports <= ports  # every relay was a first hop (4 paths of 1)
    assert answer["tokens"] == direct["tokens"] and answer["text"]
    assert answer["credits_spent"] == direct["credits_spent"] > 0  # the nodes, as before
    assert relayed > 0
    assert before - CreditWallet(credits_file).count() == answer["credits_spent"] + relayed
    # relays nobody answers on: one error and a hint, no node reached, nothing spent
    dead = net["root"] / "ask-dead-relays.txt"
    keys = [bytes(PrivateKey.generate().public_key).hex() for _ in range(4)]
    dead.write_text("".join(f"http://127.0.0.1:{ephemeral_port()} {key}\n" for key in keys))
    before = CreditWallet(credits_file).count()
    dead_log = net["root"] / "ask-connects-dead.txt"
    failed = _ask(net, *pay, "--relays", str(dead), "--overlay", "4,3,1", connects=dead_log)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "over the relays" in errors[0], failed.stderr
    assert "\nhint: " in failed.stderr
    assert not set(connected_ports(dead_log)) & node_ports  # never a direct fallback
    assert CreditWallet(credits_file).count() == before


def test_the_ring_over_relays_answers_and_pays_the_nodes_as_the_client_loop_does(net) -> None:
    """The ring (docs/overlay.md, *The ring*) with charging nodes: `planet ask --credits
    --relays FILE --ring` and the personal client with `--relays --ring` give the direct
    answers, the first node ran each loop (its /info `ring_sessions`), and the nodes are paid
    exactly what the client-driven loop pays them (the same positions, a credit per chunk);
    no node's port is connected."""
    import openai

    credits_file = net["root"] / "ring-credits.json"
    _buy(net, 40, credits_file)
    pay = ("--credits", "--credits-file", str(credits_file))
    node_ports = {int(node.url.rsplit(":", 1)[1]) for node in net["nodes"]}
    first = net["nodes"][0]

    def ring_sessions() -> int:
        info = json.loads(urllib.request.urlopen(f"{first.url}/info", timeout=10).read())
        return int(info["ring_sessions"])

    plain = _ask(net, *pay)
    assert plain.returncode == 0, plain.stderr
    direct = json.loads(plain.stdout)
    model = json.loads(net["manifest"].read_text())["model_id"]
    messages = [{"role": "user", "content": PROMPT}]

    def chat(client: PersonalClient) -> tuple[str, dict]:
        api = openai.OpenAI(base_url=client.base_url, api_key=client.token, max_retries=0)
        whole = api.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        return whole.choices[0].message.content or "", whole.model_extra["planet_receipt"]

    with _personal_client(net, credits_file) as client:
        chatted, chat_receipt = chat(client)
    before = ring_sessions()
    log = net["root"] / "ask-connects-ring.txt"
    with relays(4, net["root"] / "ring-relays") as started:
        listed = write_relays_file(net["root"] / "ring-relays.txt", started)
        overlay = ("--relays", str(listed), "--overlay", "4,3,1")
        done = _ask(net, *pay, *overlay, "--ring", connects=log)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        with _personal_client(net, credits_file, extra=(*overlay, "--ring")) as client:
            ringed, receipt = chat(client)
    assert ring_sessions() == before + 2  # the ask's loop and the personal client's
    assert answer["tokens"] == direct["tokens"] and answer["text"]
    assert answer["credits_spent"] == direct["credits_spent"] > 0
    assert ringed == chatted and chatted
    assert receipt["credits_spent"] == chat_receipt["credits_spent"] > 0
    assert not set(connected_ports(log)) & node_ports


def _register_relay(
    committee: Committee, home: Path, relay: Any, i: int, *, wait: bool
) -> SigningKey:
    """`relay` tx for a relay that served unregistered (no EVM chain here): its committee key
    in `<home>/node_key.json`, bound to a fresh wallet; the key."""
    from protocol.committee.registry import sign_registration
    from protocol.committee.relays import RegisterRelay

    secret = keccak(text=f"paid-nodes relay {i}")
    wallet = create_dev_wallet(home / "wallet.json", PASSWORD, secret)
    key = create_node_key(home / "node_key.json", PASSWORD)
    hexkey = key.verify_key.encode().hex()
    binding = sign_registration(secret, hexkey)
    body = RegisterRelay(wallet.address.lower(), binding, relay.url, relay.hop.key.hex())
    committee.submit(sign(body, key, 1).encode(), wait=wait)
    return key


def test_a_verifier_challenges_charging_nodes_through_its_own_personal_client(net) -> None:
    """A hosted gateway routes to free nodes only, so charging nodes were never challenged.
    The verifier's `PersonalAsker` asks a teacher-forced challenge through the operator's own
    personal client, which pays these charging nodes with credits: the answer echoes every
    position with logprobs that match the reference model, and names the circuit's node keys
    (what attribution blames); a client serving another model is refused by name, and so is
    one that keeps its nodes (`--route private`, the default: every challenge to the same
    nodes); the verifier's client draws afresh (`--route uniform`)."""
    import asyncio

    import aiohttp

    from node.verifier.asker import PersonalAsker
    from node.verifier.echo import echo_gap, parse_echo
    from node.verifier.reference import Reference
    from node.verifier.scoring import Challenge
    from protocol.errors import ConfigError, ProtocolError

    reference = Reference.load(net["manifest"])
    ids = reference.head.encode(PROMPT)
    challenge = Challenge(tuple(ids[:3]), tuple(ids[3:]))
    credits_file = net["root"] / "verifier-credits.json"
    _buy(net, 8, credits_file)
    with _personal_client(net, credits_file, route="private") as client:
        # the default route keeps its nodes: every challenge would go to them, so refused
        async def refused() -> None:
            async with aiohttp.ClientSession() as http:
                with pytest.raises(ConfigError, match="must reach every routable node"):
                    await PersonalAsker(
                        client.url, http, reference.model_hash, client.token
                    ).model()

        asyncio.run(refused())
    with _personal_client(net, credits_file, route="uniform") as client:
        url, token = client.url, client.token

        async def ask() -> Any:
            async with aiohttp.ClientSession() as http:
                asked = await PersonalAsker(url, http, reference.model_hash, token).ask(challenge)
                with pytest.raises(ProtocolError, match="serves model"):
                    await PersonalAsker(url, http, "sha256:" + "0" * 64, token).ask(challenge)
                return asked

        asked = asyncio.run(ask())
    assert asked.nodes == tuple(net["keys"])  # charging nodes, shard order
    answer = parse_echo(asked.doc, challenge, reference.vocab)
    gap = echo_gap(challenge, answer, reference.logits(challenge.ids))
    assert gap.tokens == len(challenge.continuation_ids) and gap.top1 == 1.0
    assert gap.kl < 1e-3  # the honest nodes compute the reference model
    assert CreditWallet(credits_file).count() < 8  # the challenge paid the nodes


@contextmanager
def _personal_client(
    net: dict[str, Any],
    credits_file: Path,
    route: str | None = None,
    extra: tuple = (),
    connects: Path | None = None,
) -> Iterator[PersonalClient]:
    """`planet gateway serve --personal` paying from `credits_file`, serving; yields its port
    and token (one token file for every start: `$PLANET_HOME/personal-token`); `connects`:
    where its every socket connect is recorded (harness/connect_log.py)."""
    home = net["root"] / "personal-home"
    env = {**os.environ, "PLANET_HOME": str(home)}
    if connects is not None:
        env = connect_logging(env, net["root"] / "connect-hook", connects)
    with personal_client(
        net["manifest"],
        net["committee"].rpc,
        min_positions=PRICE_POSITIONS,
        env=env,
        log_path=net["root"] / "run" / f"personal-{credits_file.stem}.log",
        credits_file=credits_file,
        route=route,
        token_file=home / "personal-token",
        extra_args=extra,
    ) as client:
        yield client


def _redeemed_layer_tokens(net: dict[str, Any]) -> tuple[int] | None:
    """(what the chain credited both nodes so far,), once their spools are empty (None before)."""
    if any(list((home / "credits").glob("*.json")) for home in net["homes"]):
        return None
    total = 0
    for account in net["accounts"]:
        total += sum(r["layer_tokens"] for r in net["committee"].query(
            f"/credits?account={account}")["credits"])  # fmt: skip
    return (total,)


def test_a_hang_up_on_the_personal_client_stops_the_pays_and_no_credit_taken_is_lost(
    net,
) -> None:
    """The user's tool asks for a long streamed answer and hangs up after a few chunks: the
    personal client stops the circuit, so it stops paying (far fewer credits than the whole
    answer costs, and none after the hang-up); every credit that left the credit file reaches
    a node and is redeemed on the chain."""
    import http.client

    credits_file = net["root"] / "hang-up-credits.json"
    bought = 30
    _buy(net, bought, credits_file)
    [before] = wait_for(lambda: _redeemed_layer_tokens(net), 60, "earlier spools redeemed")
    max_tokens = 400
    head = ClientHead.load(net["manifest"], device="cpu")
    prompt = len(head.chat_ids([{"role": "user", "content": PROMPT}]))
    whole = 2 * -(-(prompt + max_tokens - 1) // PRICE_POSITIONS)  # both nodes, every chunk
    assert whole > bought  # the whole answer is not even affordable: only a hang-up ends it
    model = json.loads(net["manifest"].read_text())["model_id"]
    with _personal_client(net, credits_file) as client:
        body = json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": max_tokens,
                "temperature": 0,  # greedy: OpenAI's default samples, and may end at once
                "stream": True,
            }
        )
        link = http.client.HTTPConnection("127.0.0.1", client.port, timeout=60)
        link.request(
            "POST",
            "/v1/chat/completions",
            body,
            {"Content-Type": "application/json", **client.headers},
        )
        answer = link.getresponse()
        assert answer.status == 200
        chunks = 0
        while chunks < 3:
            line = answer.readline()  # chunk-aware: an answer that ends reads as its end
            assert line, "the stream ended before 3 chunks"
            chunks += line.startswith(b"data: {")
        link.sock.close()  # the tool hangs up mid-answer: no close, no more reads
        link.close()

        def settled() -> tuple[int] | None:
            first = CreditWallet(credits_file).count()
            time.sleep(2.0)
            return (first,) if CreditWallet(credits_file).count() == first else None

        [left] = wait_for(settled, 60, "the personal client kept paying after the hang-up")
    taken = bought - left
    # paid for what ran, then stopped: well before the credits (or the answer) ran out
    assert 2 <= taken < bought < whole, (taken, bought, whole)
    [after] = wait_for(lambda: _redeemed_layer_tokens(net), 60, "the nodes' spools redeemed")
    assert after - before == taken * LAYER_TOKENS  # every credit taken is a node's, redeemed


class _DoubleSpendingWallet(CreditWallet):
    """The attacker of issue 42, attack 4: every hop of the circuit is shown the same credits
    (a frame owing k credits to each of two hops takes k from the file and sends both hops
    those k)."""

    shown: list[ThresholdCredit]

    def take(self, n: int) -> list[ThresholdCredit]:
        real = super().take(-(-n // 2))
        self.shown = [*getattr(self, "shown", []), *real]
        return (real + real)[:n]


def test_one_credit_shown_to_both_nodes_at_once_pays_one_and_buys_no_more_than_its_positions(
    net,
) -> None:
    """Both nodes are shown the same credits at once: each serves on them only while their
    locks are in flight, the first node to lock a credit is paid for it, and the answer stops
    with `credit_double_spent` once the first credit's positions are used — the client gets no
    more than one credit buys, where before both nodes served the whole answer (half price)."""
    credits_file = net["root"] / "double-spender.json"
    _buy(net, 6, credits_file)
    wallet = _DoubleSpendingWallet(credits_file)
    head = ClientHead.load(net["manifest"], device="cpu")
    ids = head.encode(PROMPT)
    hops = [Hop(node.url, node.shard) for node in net["nodes"]]
    payer = CreditPayer(wallet, {hop.url: PRICE_POSITIONS for hop in hops}, min_positions=8)
    tokens: list[int] = []

    async def attack() -> None:
        async with CircuitClient(hops, hidden_size=64, payer=payer) as client:
            gen = client.generate(head, ids, max_new_tokens=MAX_TOKENS, stop_on_eos=False)
            async for token in gen:
                tokens.append(token)

    with pytest.raises(RemoteError) as stopped:
        asyncio.run(attack())
    assert stopped.value.code == "credit_double_spent", stopped.value.message
    # the positions fed were at most one credit's: the prompt and the tokens after it
    assert len(ids) + len(tokens) - 1 <= PRICE_POSITIONS < len(ids) + MAX_TOKENS - 1
    shown = [spent_id(credit) for credit in wallet.shown]
    assert shown and len(shown) == 6 - wallet.count()  # each was shown to both nodes
    committee = net["committee"]

    def settled() -> list[dict[str, Any]] | None:
        if any(list((home / "credits").glob("*.json")) for home in net["homes"]):
            return None  # an agent has not locked and redeemed (or dropped) all it was paid
        return [committee.query(f"/credit_lock?id={identifier}") for identifier in shown]

    locks = wait_for(settled, 60, "the agents did not settle the double-spent credits")
    # each credit shown to both nodes is locked by one of them and redeemed (by that one only:
    # the chain refuses another's redemption CREDIT_LOCKED), so it paid one node once
    assert all(lock["node"] in net["keys"] and lock["spent"] is not None for lock in locks)
    infos = [
        json.loads(urllib.request.urlopen(f"{node.url}/info", timeout=10).read())
        for node in net["nodes"]
    ]
    assert sum(info["credits"]["double_spent"] for info in infos) >= 1


def test_no_tx_on_the_chain_links_a_payer_to_a_node_a_credit_or_a_question(net) -> None:
    """Every tx of every block so far (the mints of the purchases above and the agents'
    redemptions of what the questions paid): a mint names its payer and carries only blinded
    points; a redemption names its node and carries the finalized credits. No redemption holds
    the payer, no mint holds a node key, a credit's nonce, signature or spent id, and no tx
    holds anything of a question; no tx is of the retired RSA kinds."""
    committee = net["committee"]
    payer = address_of(keccak(text="paid-nodes payer")).lower().removeprefix("0x")
    raws = []
    for height in range(1, committee.height() + 1):
        for raw in committee.call("block", height=str(height))["block"]["data"]["txs"] or ():
            raws.append(base64.b64decode(raw))
    # the proposers' injected extended-commit txs (binary, abci_app/extensions.py: the nodes'
    # commitments start spot-check rounds) are not committee txs; scanned as bytes below
    txs = [decode(raw) for raw in raws if raw[:1] == b"{"]
    injected = [raw for raw in raws if raw[:1] != b"{"]
    assert not [tx for tx in txs if tx.type in ("mint", "redeem", "credit_key")]
    mints = [tx for tx in txs if tx.type == "credit_mint"]
    redeems = [tx for tx in txs if tx.type == "credit_redeem"]
    assert mints and redeems and {tx.body.payer.lower() for tx in mints} == {"0x" + payer}
    nodes = {tx.signer for tx in redeems}
    secrets = set(nodes)  # what a mint must not hold: who was paid, and with which credits
    for tx in redeems:
        for credit in tx.body.credits:
            secrets |= {credit.nonce.hex(), credit.signature.hex(), spent_id(credit)}
    for tx in mints:
        text = tx.raw.decode().lower()
        assert tx.signer not in nodes  # minted under a key no node uses
        assert not [secret for secret in secrets if secret in text]
    for tx in redeems:
        assert payer not in tx.raw.decode().lower()
    credit_parts = secrets - nodes  # (the extensions may name nodes: they carry their scores)
    for raw in injected:
        assert bytes.fromhex(payer) not in raw and payer.encode() not in raw.lower()
        assert not [part for part in credit_parts if part.encode() in raw.lower()]
    prompt_ids = ClientHead.load(net["manifest"], device="cpu").encode(PROMPT)
    for tx in txs:
        text = tx.raw.decode()
        assert PROMPT not in text and ",".join(map(str, prompt_ids)) not in text
