"""`planet devnet up --hosts --link-ms 50` once for the module: every process in its own network
namespace with its own 10.77.0.x address, every link between two hosts 50 ms each way.

Real processes throughout, driven only through the CLI (`planet devnet exec HOST -- planet …`
runs a command inside a host). Checks: a paid question asked from the `user` host answers with
the same greedy tokens as the same shards on loopback (`planet local up --quant int8`); a packet
capture on the lab's bridge finds no prompt text, embeddings or control JSON on the links of the
gateway and the nodes (and does find the question in the user's plain-HTTP request); a node
whose next-hop policy is public-only refuses the devnet's nodes, registered at private
addresses, by name; a new operator in its own host is funded, stakes, joins at its host's
address and is listed routable; with its node beside node0's on shard 0, a question whose
shard-0 node is killed (SIGKILL) after its third decode pass ends with the text of the same
question asked without a kill. `planet devnet down` always runs and leaves no namespace.

The overlay and NAT (issue 43; the devnet has `--relay-hosts 6 --nat-hosts 1`): six relays,
each in its own host, staked (`planet stake --role relay`) and registered by `planet relay
serve`, fronting nodes behind NAT (`--rendezvous-ports`), listed by the committee; a node in
nat0, a host behind router0's NAT (only outbound connections, masqueraded), staked and joined
with the default `--rendezvous check`: a relay dials it back, fails, fronts it, and the node is
listed routable at its port on that relay and answers a question whose circuit names it with
the loopback text; the personal client in the user host over the overlay (`--relays chain
--overlay 3,2,2`), asked by the official `openai` client, answers the loopback text while a
capture on the bridge shows no question, answer or word of them in clear at any relay's host.
The capture also shows the user's host exchanging no packet with the first node's: the client's
router reads every node's /info over the relays too (INFO link messages, issue 43). And the
CLI's overlay route: `planet ask --relays chain --overlay 3,2,2 --credits` in the user host
answers the loopback tokens while the capture shows the user's host exchanging packets only
with its three guard relays and the committee's validator, no node's host with the user's, each
relay only with its neighbours (a guard: the user's host and exit relays; an exit: guards and
the nodes), so no relay saw both the user and a node, and no question, answer or embedding rows
in clear on any link.
Cost, measured on the shared 2-core box: the module 160 s wall before these, 263 s with them;
CPU (pytest's process tree + the devnet's detached processes) about 117 s before, 194 s after.
With the `planet ask --relays` question (one more question over the relays) the module ran
241 s wall, 11 passed, the box lightly loaded. With every process in the hosts and every
`planet devnet exec ... planet` command forked from the session's zygote (issue 41: `ip netns
exec` done by the fork, node/zygote/netns.py): 147 -> 80 CPU-s for the module (slot.sh's
cpuacct, one run each, the same box).
Six relays (2-relay paths, so that no relay sees both the user and a node; they stake side by
side): 208 s wall, 93.9 CPU-s, 11 passed (slot.sh, the box shared with three other engineers).

Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), `ip netns` and toxiproxy: skipped, with the
reason `python -m deploy.netlab check` gives, where these are missing.

Its own devnet, not the shared one (tests/e2e/conftest.py): every process in a network
namespace with shaped links, and a node killed mid-question.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deploy.netlab import can_make_hosts, can_run_proxies
from node.procs import run_captured, spawn_process
from node.server.launcher import pid_alive
from node.zygote import ENV_VAR as ZYGOTE

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UP_TIMEOUT_S = 900
LINK_MS = 50
QUESTION = "What is the capital of France?"
MAX_TOKENS = 8
MODEL = "smollm2-135m-3p-int8"  # what `planet devnet up` serves by default (--quant int8)
PUBLIC_ONLY_PORT = 18150  # a node in the `user` host (served to itself only)
RELAYS = 6  # relay0… : `planet relay serve`, staked and registered, each fronting nodes too
RELAY_PORT = 9100  # deploy/devnet/hosts.py RELAY_PORT, RENDEZVOUS_PORTS
RENDEZVOUS_PORTS = "9200-9203"
NAT_SHARD = 2  # the node behind NAT joins this shard
PERSONAL_PORT = 18160  # the personal client, on the user host's loopback
OVERLAY = "3,2,2"  # 3 paths of 2 relays, any 2 enough: every relay on one path, none sees both ends
# the user's bearer credits: the NAT question's nodes, the two overlay questions' nodes and relays
CREDITS = 45


@pytest.fixture(scope="module", autouse=True)
def _namespaces() -> None:
    for ok, reason in (can_make_hosts(), can_run_proxies()):
        if not ok:
            pytest.skip(f"devnet --hosts needs network namespaces and toxiproxy: {reason}")


def _planet(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    done = run_captured(
        [sys.executable, "-m", "planet", *args],
        text=True,
        timeout=timeout,
        env=env,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def _in_host(
    env: dict[str, str], host: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """`planet devnet exec HOST -- planet ARGS`: a command typed inside one of the hosts."""
    return _planet(env, "devnet", "exec", host, "--", "planet", *args, timeout=timeout)


def _home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    from node.model.source import models_dir

    home = tmp_path_factory.mktemp(name)
    real_models = models_dir()
    real_models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(real_models, target_is_directory=True)
    return home


def _clean_env(home: Path) -> dict[str, str]:
    # the session's zygote stays (tests/conftest.py): the devnet's processes in their hosts and
    # the commands run there are forked from it (`ip netns exec` in a fork: node/zygote/netns.py)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_") or k == ZYGOTE}
    return {**clean, "PLANET_HOME": str(home), "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same int8 shards on 127.0.0.1 (`planet local up`): the greedy answer to QUESTION."""
    env = _clean_env(_home(tmp_path_factory, "planet-loopback"))
    up = _planet(env, "local", "up", "--nodes", "3", "--quant", "int8", timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        asked = _planet(
            env, "ask", "--json", "--max-tokens", str(MAX_TOKENS), QUESTION, timeout=300
        )
        assert asked.returncode == 0, asked.stderr[-3000:]
        return json.loads(asked.stdout)
    finally:
        _planet(env, "local", "down", timeout=60)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _clean_env(_home(tmp_path_factory, "planet-hosts"))


@pytest.fixture(scope="module")
def devnet(env: dict[str, str], loopback: dict[str, Any]) -> Iterator[dict[str, Any]]:
    started = time.monotonic()
    state_path = Path(env["PLANET_HOME"]) / "devnet" / "devnet.json"
    try:
        up = _planet(
            env, "devnet", "up", "--hosts", "--link-ms", str(LINK_MS), "--validators", "1",
            "--replicas", "1",
            # its verifier only has to be reachable (its findings server, published on chain):
            # idle, it does not challenge through the 50 ms links every epoch (issue 41)
            "--verifier-challenges", "0",
            # one model: every question here is the default model's (the second model's seat,
            # a host process for node0 and a seat operator that stakes and joins, serves none
            # of them; tests/e2e/test_second_model_devnet.py runs it, issue 41)
            "--one-model",
            # relay0…: relays (staked, registered, fronting); nat0 behind router0's NAT
            "--relay-hosts", str(RELAYS), "--nat-hosts", "1" if shutil.which("iptables") else "0",
            "--detach", timeout=UP_TIMEOUT_S,
        )  # fmt: skip
        print(f"devnet up --hosts: {time.monotonic() - started:.1f} s", file=sys.stderr)
        assert up.returncode == 0, up.stderr[-4000:]
        yield json.loads(state_path.read_text())
    finally:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        _print_host_cpu(state)
        down = _planet(env, "devnet", "down", timeout=300)
        assert down.returncode == 0, down.stderr
        lab = state.get("hosts") or {}
        if lab.get("run_id"):
            left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert f"pnl{lab['run_id']}" not in left, left
        if lab.get("pid"):
            assert not pid_alive(int(lab["pid"])), "the hosts' keeper outlived `devnet down`"


def _print_host_cpu(state: dict[str, Any]) -> None:
    """The CPU seconds the processes still alive in each host used (for the module's cost:
    the devnet's processes are detached, so pytest's own rusage does not count them)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, host in ((state.get("hosts") or {}).get("hosts") or {}).items():
        pids = subprocess.run(
            ["ip", "netns", "pids", host["netns"]], capture_output=True, text=True
        ).stdout.split()
        total = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        used[name] = round(total / ticks, 1)
    print(f"CPU s by host: {used} (sum {sum(used.values()):.1f})", file=sys.stderr)


# run in another host: the verifiers' URLs on chain, then the first one's findings server
FINDINGS_PROBE = """
import base64, json, sys, time, urllib.request as u
query = sys.argv[1] + '/abci_query?path=%22/verifier_endpoints%22'
for _ in range(90):  # the verifier publishes once its model is loaded: up to a minute or so
    answer = json.load(u.urlopen(query, timeout=10))
    value = json.loads(base64.b64decode(answer['result']['response']['value']))
    urls = sorted(value['endpoints'].values())
    if urls:
        break
    time.sleep(1)
health = json.load(u.urlopen(urls[0] + '/health', timeout=10)) if urls else None
print(json.dumps([urls, health]))
"""


def test_hosts_devnet_every_service_at_its_own_address_behind_50_ms_links(env, devnet) -> None:
    lab = devnet["hosts"]
    hosts = lab["hosts"]
    addresses = {name: host["address"] for name, host in hosts.items()}
    assert len(set(addresses.values())) == len(addresses)
    # every host on the lab's network but nat0, on its private LAN behind router0
    assert all(a.startswith("10.77.0.") for n, a in addresses.items() if not n.startswith("nat"))
    assert all(a.startswith("10.78.") for n, a in addresses.items() if n.startswith("nat"))
    assert devnet["evm_rpc"] == f"http://{addresses['anvil']}:8545"
    assert devnet["committee_rpc"][0].startswith(f"http://{addresses['validator0']}:")
    assert devnet["gateway_url"].startswith(f"http://{addresses['gateway']}:")
    assert devnet["next_hop_range"] == lab["network"] == "10.77.0.0/24"
    status = _planet(env, "devnet", "status", "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["hosts_alive"] and report["running"]
    routable = [n for n in report["nodes"] if n["routable"]]
    assert sorted(s for n in routable for s in n["shards"]) == [0, 1, 2]
    node_hosts = {addresses[f"node{i}"] for i in range(3)}
    for node in routable:  # each registered the address of its own host, not 127.0.0.1
        assert node["endpoint"].split("//")[1].rsplit(":", 1)[0] in node_hosts, node
    # 50 ms each way: a request from the user host to anvil costs a round trip of >= 100 ms
    probe = [
        "devnet", "exec", "user", "--", sys.executable, "-c",
        "import time, urllib.request as u; t = time.monotonic(); "
        f"u.urlopen(u.Request('{devnet['evm_rpc']}', data=b'{{\"jsonrpc\":\"2.0\",\"id\":1,"
        "\"method\":\"eth_chainId\",\"params\":[]}', headers={'Content-Type': "
        "'application/json'}), timeout=10).read(); print(time.monotonic() - t)",
    ]  # fmt: skip
    timed = _planet(env, *probe, timeout=60)
    assert timed.returncode == 0, timed.stderr
    assert float(timed.stdout) >= 2 * LINK_MS / 1000 * 0.9
    # each verifier serves its findings at its validator's address, published on chain, and a
    # peer on another host reaches it (docs/verification.md §6b)
    reach = ["devnet", "exec", "user", "--", sys.executable, "-c", FINDINGS_PROBE,
             devnet["committee_rpc"][0]]  # fmt: skip
    reached = _planet(env, *reach, timeout=180)
    assert reached.returncode == 0, reached.stderr
    urls, health = json.loads(reached.stdout)
    assert urls == [f"http://{addresses['validator0']}:8700"]
    assert health == {"status": "ok", "findings": 0}


def test_hosts_paid_question_from_the_user_host_has_the_loopback_tokens(
    env, devnet, loopback
) -> None:
    started = time.monotonic()
    asked = _in_host(
        env, "user", "ask", "--pay", "--json", "--max-tokens", str(MAX_TOKENS), QUESTION,
        timeout=300,
    )  # fmt: skip
    print(f"paid question over the hosts: {time.monotonic() - started:.1f} s", file=sys.stderr)
    assert asked.returncode == 0, asked.stderr[-3000:]
    answer = json.loads(asked.stdout)
    assert answer["text"].strip() == loopback["text"].strip() != ""
    assert answer["receipt"]["completion_tokens"] == len(loopback["tokens"])
    assert "(verified)" in asked.stderr


def test_hosts_bridge_capture_finds_no_prompt_text_or_activations_on_the_node_links(
    env, devnet
) -> None:
    """A packet capture on the lab's bridge while the user host asks a paid question: the
    gateway's and nodes' links (TLS, keys pinned to the chain) carry the prompt's activations
    and show neither its text, its embeddings nor the stream's control JSON. The positive
    control is the user's own request to the devnet's gateway, plain HTTP: the capture reads
    the question there (a hosted gateway's operator puts TLS in front of its API)."""
    from node.model.head import ClientHead
    from node.model.source import models_dir
    from tests.bridge_capture import BridgeCapture

    lab = devnet["hosts"]
    addresses = {name: host["address"] for name, host in lab["hosts"].items()}
    nodes = {addresses[name] for name in addresses if name.startswith("node")}
    gateway_port = int(devnet["gateway_url"].rsplit(":", 1)[1])
    with BridgeCapture(lab["run_id"], len(addresses) + 4) as capture:
        asked = _in_host(
            env, "user", "ask", "--pay", "--json", "--max-tokens", str(MAX_TOKENS), QUESTION,
            timeout=300,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr[-3000:]
    flows = capture.flows()
    to_gateway = b"".join(
        data
        for (src, _, dst, dport), data in flows.items()
        if src == addresses["user"] and dst == addresses["gateway"] and dport == gateway_port
    )
    assert QUESTION.encode() in to_gateway  # the capture reads what crosses the bridge
    node_links = b"".join(
        data for (src, _, dst, _), data in flows.items() if src in nodes or dst in nodes
    )
    head = ClientHead.load(models_dir() / MODEL / "manifest.json", device="cpu")
    rows = head.embed_np(head.chat_ids([{"role": "user", "content": QUESTION}]))[0]
    # the rows as either wire dtype would carry them in clear (float16 by default, or float32)
    windows = [
        rows[i].astype(dtype).tobytes()[:64] for i in range(len(rows)) for dtype in ("<f4", "<f2")
    ]
    print(f"bridge capture: {capture.frames} frames, {len(node_links)} bytes on node links")
    assert len(node_links) > len(rows) * head.hidden_size // 2  # the activations went through
    assert QUESTION.encode() not in node_links
    assert not any(window in node_links for window in windows)
    assert b'"op"' not in node_links and b"/v1/stream" not in node_links


def test_hosts_official_openai_client_from_the_user_host_has_the_loopback_text(
    env, devnet, loopback
) -> None:
    """The user host deposits a prepaid balance, makes an API key (`planet key new`), and the
    official `openai` client asks the gateway's host across the 50 ms links."""
    deposited = _in_host(env, "user", "balance", "deposit", "0.01", timeout=180)
    assert deposited.returncode == 0, deposited.stderr[-2000:]
    made = _in_host(env, "user", "key", "new", "--cap", "0.005", "--json", timeout=180)
    assert made.returncode == 0, made.stderr[-2000:]
    key = json.loads(made.stdout)["key"]
    ask = (
        "import json, sys, openai; "
        f"c = openai.OpenAI(base_url='{devnet['gateway_url']}/v1', api_key=sys.argv[1], "
        "max_retries=0, timeout=240); "
        "r = c.chat.completions.create(model=c.models.list().data[0].id, "
        f"messages=[{{'role': 'user', 'content': {QUESTION!r}}}], max_tokens={MAX_TOKENS}, "
        "temperature=0); "
        "print(json.dumps({'text': r.choices[0].message.content, "
        "'completion_tokens': r.usage.completion_tokens}))"
    )
    asked = _planet(
        env, "devnet", "exec", "user", "--", sys.executable, "-c", ask, key, timeout=300
    )
    assert asked.returncode == 0, asked.stderr[-3000:]
    answer = json.loads(asked.stdout.strip().splitlines()[-1])
    assert answer["text"].strip() == loopback["text"].strip() != ""
    assert answer["completion_tokens"] == len(loopback["tokens"])


def test_hosts_public_only_node_refuses_the_devnets_private_next_hops(env, devnet) -> None:
    """The devnet's nodes registered 10.77.0.x: a node whose committee policy is public-only
    (no --private-next-hops) refuses to dial them, by name, before any dial."""
    user = devnet["hosts"]["hosts"]["user"]["address"]
    url = f"http://{user}:{PUBLIC_ONLY_PORT}"
    log = Path(env["PLANET_HOME"]) / "public-only-node.log"
    argv = [
        sys.executable, "-m", "planet", "devnet", "exec", "user", "--", "planet", "node",
        "serve", "--manifest", devnet["manifest"], "--shard", "0", "--host", user, "--port",
        str(PUBLIC_ONLY_PORT), "--next-hops", "committee", "--committee-rpc",
        devnet["committee_rpc"][0], "--plaintext-links",  # a throwaway node, no key of its own
    ]  # fmt: skip
    with open(log, "wb") as out:  # forked by the session's zygote, where it serves
        node = spawn_process(argv, out.fileno(), env=env, new_session=False)
    try:
        circuit = json.loads(Path(devnet["nodes_file"]).read_text())
        first = next(n for n in circuit["nodes"] if n["shard"] == 0)
        first["url"] = url
        nodes_file = Path(env["PLANET_HOME"]) / "public-only-nodes.json"
        nodes_file.write_text(json.dumps(circuit))
        wait = (
            "import time, urllib.request as u\n"
            "for _ in range(240):\n"
            "    try:\n"
            f"        u.urlopen('{url}/health', timeout=2).read(); break\n"
            "    except OSError: time.sleep(0.5)\n"
        )
        ready = _planet(
            env, "devnet", "exec", "user", "--", sys.executable, "-c", wait, timeout=150
        )
        assert ready.returncode == 0 and node.poll() is None, log.read_text()[-3000:]
        refused = _in_host(
            env, "user", "ask", "--nodes", str(nodes_file), "--max-tokens", "1",
            "--plaintext-links", QUESTION,
            timeout=120,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "globally routable" in refused.stderr, refused.stderr
        assert circuit["nodes"][1]["url"] in refused.stderr, refused.stderr
    finally:
        node.terminate()
        node.wait(30)


# run in the user host: the relays the committee lists once there are at least argv[2]
RELAYS_PROBE = """
import asyncio, sys, time
from node.cli.nat import read_relays
for _ in range(120):  # listed once the watchers agree on the Relay stake: a few blocks
    listed = asyncio.run(read_relays(sys.argv[1]))
    if len(listed) >= int(sys.argv[2]):
        break
    time.sleep(1)
print(' '.join(sorted(r.url for r in listed)))
"""


@pytest.fixture(scope="module")
def relays(env, devnet, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """relay0… each: its operator's wallet funded, a Relay stake (`planet stake --role relay`),
    `planet relay serve` in its own host registering itself on the committee and fronting
    nodes behind NAT (--rendezvous-ports); their URLs once the committee lists them all. Each
    relay is funded, stakes and starts in its own thread (`planet devnet fund` sends from
    anvil's dev account, which numbers the transfers itself; each relay's own wallet: no two
    share a nonce)."""
    from node.keys import create_dev_wallet

    addresses = {name: host["address"] for name, host in devnet["hosts"]["hosts"].items()}
    homes = [tmp_path_factory.mktemp(f"relay{i}") for i in range(RELAYS)]

    def start(i: int) -> str:
        home = homes[i]
        wallet = create_dev_wallet(home / "wallet.json", f"relay{i} pw").address
        funded = _planet(env, "devnet", "fund", wallet, timeout=60)
        assert funded.returncode == 0, funded.stderr
        own = {**env, "PLANET_PASSWORD": f"relay{i} pw"}
        staked = _in_host(
            own, f"relay{i}", "stake", "--role", "relay", "--amount", "0.1", "--home", str(home)
        )
        assert staked.returncode == 0, staked.stderr[-2000:]
        address = addresses[f"relay{i}"]
        argv = [
            sys.executable, "-m", "planet", "devnet", "exec", f"relay{i}", "--", "planet",
            "relay", "serve", "--home", str(home), "--host", address, "--port", str(RELAY_PORT),
            "--allow-private-next-hops", "--rendezvous-ports", RENDEZVOUS_PORTS,
        ]  # fmt: skip
        relay = subprocess.Popen(  # ended by `devnet down` with everything in its host
            argv, env=own, stdout=subprocess.PIPE, stderr=(home / "relay.log").open("w"),
            text=True,
        )  # fmt: skip
        assert relay.stdout is not None
        lines = [relay.stdout.readline() for _ in range(3)]
        assert any(line.startswith("registered relay") for line in lines), (
            lines, (home / "relay.log").read_text()[-2000:],
        )  # fmt: skip
        return f"http://{address}:{RELAY_PORT}"

    with ThreadPoolExecutor(max_workers=RELAYS) as pool:
        urls = list(pool.map(start, range(RELAYS)))
    probe = ["devnet", "exec", "user", "--", sys.executable, "-c", RELAYS_PROBE,
             devnet["committee_rpc"][0], str(RELAYS)]  # fmt: skip
    listed = _planet(env, *probe, timeout=180)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert listed.stdout.split() == sorted(urls), listed.stdout
    return urls


def _buy_user_credits(env: dict[str, str], credits: Path) -> Path:
    """The user's bearer credits (`planet credits buy`), bought in the user host: `credits`."""
    deposited = _in_host(env, "user", "balance", "deposit", "0.0001", "--credits", timeout=180)
    assert deposited.returncode == 0, deposited.stderr[-2000:]
    bought = _in_host(
        env, "user", "credits", "buy", str(CREDITS), "--credits-file", str(credits), timeout=240
    )
    assert bought.returncode == 0, bought.stderr[-2000:]
    return credits


@pytest.fixture(scope="module")
def user_credits_purchase(env, devnet) -> Iterator[Future[Path]]:
    """`_buy_user_credits` in the background, started before the relays fixture: the purchase
    waits for the validators while the relays stake and register (the user's wallet sends
    nothing else meanwhile; issue 41)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(_buy_user_credits, env, Path(env["PLANET_HOME"]) / "credits.json")


@pytest.fixture(scope="module")
def user_credits(user_credits_purchase: Future[Path]) -> Path:
    """The user's bearer credits file, once bought (`user_credits_purchase`)."""
    return user_credits_purchase.result(timeout=600)


def test_hosts_node_behind_nat_joins_fronted_by_a_relay_and_answers(
    env, devnet, user_credits_purchase, relays, user_credits, loopback, tmp_path_factory
) -> None:
    """nat0 sits behind router0's NAT: it dials out, nothing dials in. Its operator stakes and
    runs `planet join` with the default `--rendezvous check`: a listed relay dials it back,
    fails, and fronts it; the node is listed routable at its port on that relay. A question
    from the user host whose shard-2 node is the NAT'd one (a nodes file naming it) answers
    the loopback text, its circuit going through the relay's port. (`user_credits_purchase`
    before `relays`: the user's credits are bought while the relays start.)"""
    if "nat0" not in devnet["hosts"]["hosts"]:
        pytest.skip("no iptables here: the devnet has no host behind NAT")
    from node.keys import create_dev_wallet

    home = tmp_path_factory.mktemp("nat0")
    own = {**env, "PLANET_PASSWORD": "nat0 pw"}
    wallet = create_dev_wallet(home / "wallet.json", own["PLANET_PASSWORD"]).address
    funded = _planet(env, "devnet", "fund", wallet, timeout=60)
    assert funded.returncode == 0, funded.stderr
    staked = _in_host(own, "nat0", "stake", "--role", "compute", "--amount", "1", "--home",
                      str(home))  # fmt: skip
    assert staked.returncode == 0, staked.stderr[-2000:]
    joined = _in_host(
        own, "nat0", "join", "--model", MODEL, "--shard", str(NAT_SHARD), "--home", str(home),
        "--json", timeout=400,
    )  # fmt: skip
    assert joined.returncode == 0, joined.stderr[-3000:]
    router = devnet["hosts"]["hosts"]["router0"]["address"]
    assert "is not reachable from relay" in joined.stderr, joined.stderr[-3000:]
    assert f"(it sees this machine at {router})" in joined.stderr  # masqueraded
    node = json.loads(joined.stdout)
    fronting = node["endpoint"].replace("https://", "http://").rsplit(":", 1)[0]
    assert f"{fronting}:{RELAY_PORT}" in relays, (node, relays)  # a relay's address, its port
    assert int(node["endpoint"].rsplit(":", 1)[1]) in range(9200, 9204)
    report = json.loads(_planet(env, "devnet", "status", "--json", timeout=120).stdout)
    listed = [n for n in report["nodes"] if n["key"] == node["node_key"]]
    assert listed and listed[0]["routable"], report["nodes"]
    assert listed[0]["endpoint"] == node["endpoint"]
    circuit = json.loads(Path(devnet["nodes_file"]).read_text())
    [seat] = [n for n in circuit["nodes"] if n["shard"] == NAT_SHARD]
    seat.update(url=node["endpoint"], key=node["node_key"])
    nodes_file = Path(env["PLANET_HOME"]) / "nat-nodes.json"
    nodes_file.write_text(json.dumps(circuit))
    asked = _in_host(
        env, "user", "ask", "--nodes", str(nodes_file), "--credits", "--credits-file",
        str(user_credits), "--committee-rpc", devnet["committee_rpc"][0], "--json",
        "--max-tokens", str(MAX_TOKENS), QUESTION, timeout=300,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr[-3000:]
    answer = json.loads(asked.stdout)
    assert answer["text"].strip() == loopback["text"].strip() != ""
    assert node["endpoint"] in [hop["url"] for hop in answer["circuit"]], answer["circuit"]


PERSONAL_ASK = """
import json, sys, openai
token = open(sys.argv[2]).read().strip()
c = openai.OpenAI(base_url=sys.argv[1], api_key=token, max_retries=0, timeout=240)
r = c.chat.completions.create(model=c.models.list().data[0].id, max_tokens=int(sys.argv[4]),
    messages=[{'role': 'user', 'content': sys.argv[3]}], temperature=0)
print(json.dumps({'text': r.choices[0].message.content,
                  'receipt': r.model_extra['planet_receipt']}))
"""
PERSONAL_WAIT = """
import sys, time, urllib.request as u
for _ in range(240):
    try:
        token = open(sys.argv[2]).read().strip()
        u.urlopen(u.Request(sys.argv[1] + '/health',
                            headers={'Authorization': 'Bearer ' + token}), timeout=2).read()
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit(1)
"""


@pytest.fixture(scope="module")
def overlay_question(env, devnet, relays, user_credits) -> dict[str, Any]:
    """`planet gateway serve --personal --relays chain --overlay 3,2,2` in the user host,
    asked by the official `openai` client there while the lab's bridge is captured: the
    answer, the flows, and the hosts' addresses."""
    from tests.bridge_capture import BridgeCapture

    lab = devnet["hosts"]
    addresses = {name: host["address"] for name, host in lab["hosts"].items()}
    log = Path(env["PLANET_HOME"]) / "personal-overlay.log"
    token = Path(env["PLANET_HOME"]) / "personal-overlay.token"
    url = f"http://127.0.0.1:{PERSONAL_PORT}"
    argv = [
        sys.executable, "-m", "planet", "devnet", "exec", "user", "--", "planet", "-v",
        "gateway", "serve", "--personal", "--relays", "chain", "--overlay", OVERLAY,
        "--port", str(PERSONAL_PORT), "--token-file", str(token),
        "--credits-file", str(user_credits),
    ]  # fmt: skip
    with open(log, "wb") as out:
        client = spawn_process(argv, out.fileno(), env=env, new_session=False)
    try:
        wait = ["devnet", "exec", "user", "--", sys.executable, "-c", PERSONAL_WAIT, url,
                str(token)]  # fmt: skip
        ready = _planet(env, *wait, timeout=150)
        assert ready.returncode == 0 and client.poll() is None, log.read_text()[-3000:]
        ask = ["devnet", "exec", "user", "--", sys.executable, "-c", PERSONAL_ASK, f"{url}/v1",
               str(token), QUESTION, str(MAX_TOKENS)]  # fmt: skip
        with BridgeCapture(lab["run_id"], len(addresses) + 4) as capture:
            asked = _planet(env, *ask, timeout=300)
        assert asked.returncode == 0, asked.stderr[-3000:] + log.read_text()[-3000:]
    finally:
        client.terminate()
        client.wait(30)
    answer = json.loads(asked.stdout.strip().splitlines()[-1])
    status = json.loads(_planet(env, "devnet", "status", "--json", timeout=120).stdout)
    endpoints = {n["key"]: n["endpoint"] for n in status["nodes"]}
    first = endpoints[answer["receipt"]["nodes"][0]].split("//")[1].rsplit(":", 1)[0]
    return {"answer": answer, "flows": capture.flows(), "frames": capture.frames,
            "addresses": addresses, "first": first}  # fmt: skip


def test_hosts_personal_client_over_the_overlay_has_the_loopback_text_and_relays_read_none(
    overlay_question, loopback
) -> None:
    """The personal client over the overlay (3 paths of 2 relays, any 2 enough) answers
    the official `openai` client with the loopback text; the user host reached the relays, and
    no relay's host carried the question, the answer or any longer word of them in clear
    (cloves: AES-GCM under S-IDA, in per-hop layers; a fronted node's bytes: TLS)."""
    flows, addresses = overlay_question["flows"], overlay_question["addresses"]
    text = overlay_question["answer"]["text"].strip()
    assert text == loopback["text"].strip() != ""
    user = addresses["user"]
    relay_hosts = {addresses[f"relay{i}"] for i in range(RELAYS)}
    with_user = {(src, dst) for (src, _, dst, _), _ in flows.items() if user in (src, dst)}
    print(f"overlay capture: {overlay_question['frames']} frames; user's peers {with_user}")
    assert any(set(pair) & relay_hosts for pair in with_user)  # it went through the relays
    at_relays = b"".join(
        data for (src, _, dst, _), data in flows.items() if src in relay_hosts or dst in relay_hosts
    )
    assert len(at_relays) > 10_000  # the cloves of the prefill and every token went through
    words = {word for word in text.replace(".", " ").split() if len(word) >= 5}
    for clear in (QUESTION, text, *words, *(w for w in QUESTION.split() if len(w) >= 5)):
        assert clear.encode() not in at_relays, clear


def test_hosts_personal_client_over_the_overlay_hides_the_user_from_the_first_node(
    overlay_question,
) -> None:
    """During the question, the first node's host exchanges no packet with the user's host:
    the router's /info reads ride the relays too (INFO link messages, issue 43)."""
    flows, addresses = overlay_question["flows"], overlay_question["addresses"]
    first, user = overlay_question["first"], addresses["user"]
    assert first in {addresses[f"node{i}"] for i in range(3)}, first
    direct = {
        (src, sport, dst, dport)
        for (src, sport, dst, dport) in flows
        if {src, dst} == {user, first}
    }
    assert not direct, sorted(direct)[:8]


@pytest.fixture(scope="module")
def ask_relays_question(env, devnet, relays, user_credits) -> dict[str, Any]:
    """`planet ask --relays chain --overlay 3,2,2 --credits` in the user host, the devnet's
    nodes file (node0…2), while the lab's bridge is captured: the answer and the flows."""
    from tests.bridge_capture import BridgeCapture

    lab = devnet["hosts"]
    addresses = {name: host["address"] for name, host in lab["hosts"].items()}
    with BridgeCapture(lab["run_id"], len(addresses) + 4) as capture:
        asked = _in_host(
            env, "user", "ask", "--nodes", devnet["nodes_file"], "--relays", "chain",
            "--overlay", OVERLAY, "--committee-rpc", devnet["committee_rpc"][0], "--credits",
            "--credits-file", str(user_credits), "--json", "--max-tokens", str(MAX_TOKENS),
            QUESTION, timeout=300,
        )  # fmt: skip
    assert asked.returncode == 0, asked.stderr[-3000:]
    # stderr: the client's own account of its paths (a failed or silent one, relays avoided)
    return {"answer": json.loads(asked.stdout), "flows": capture.flows(),
            "frames": capture.frames, "addresses": addresses,
            "stderr": asked.stderr[-4000:]}  # fmt: skip


def _peers(flows: dict[Any, bytes], address: str) -> set[str]:
    """The hosts that exchanged TCP payload with `address` during a capture."""
    return {dst if src == address else src for (src, _, dst, _) in flows if address in (src, dst)}


def test_hosts_ask_over_relays_user_talks_only_to_relays_and_no_node_sees_the_user(
    ask_relays_question, loopback
) -> None:
    """`planet ask --relays chain` (3 paths of 2 relays, any 2 enough) answers the
    loopback text (the direct path's greedy tokens). On the bridge: the user's host exchanged
    packets with three relays (its guards) and the committee's validator (the /relays list)
    only, never with a model node's host; no node's host exchanged any with the user's; each
    relay only with its neighbours (a guard: the user's host and exits; an exit: guards and
    the nodes), so no relay saw both the user and a node; neither the question, the answer
    nor any longer word of them crossed any link in clear, nor the prompt's embedding rows."""
    from node.model.head import ClientHead
    from node.model.source import models_dir

    flows, addresses = ask_relays_question["flows"], ask_relays_question["addresses"]
    answer = ask_relays_question["answer"]
    text = answer["text"].strip()
    assert text == loopback["text"].strip() != ""
    assert answer["tokens"] == loopback["tokens"]
    user = addresses["user"]
    relay_hosts = {addresses[f"relay{i}"] for i in range(RELAYS)}
    node_hosts = {addresses[f"node{i}"] for i in range(3)}
    committee = {addresses[name] for name in addresses if name.startswith("validator")}
    peers = _peers(flows, user)
    print(f"ask --relays capture: {ask_relays_question['frames']} frames; user's peers {peers}")
    assert not peers & node_hosts, sorted(peers & node_hosts)
    assert peers <= relay_hosts | committee, sorted(peers - relay_hosts)
    assert len(peers & relay_hosts) == 3  # 3 paths, each entered by one of the user's guards
    for node in node_hosts:  # the nodes were asked (through the exits) and never saw the user
        assert _peers(flows, node) & relay_hosts, node
        assert user not in _peers(flows, node), node
    # 3 paths of 2 relays: the user's guards enter them and talk to the user and the exits,
    # the exits to the guards and the nodes; no relay talks to both the user and a node, nor
    # to a relay of its own kind. Besides the question's: the committee (its /relays and
    # /node reads), router0 (nat0's rendezvous link, masqueraded), the gateway (reading a
    # fronted node's /info)
    others = committee | {addresses[n] for n in addresses if n.startswith(("router", "gateway"))}
    entries = {relay for relay in relay_hosts if user in _peers(flows, relay)}
    exits = {relay for relay in relay_hosts if _peers(flows, relay) & node_hosts}
    print(f"ask --relays: entries {sorted(entries)}, exits {sorted(exits)}")
    assert len(entries) == 3 and len(exits) == 3 and not entries & exits, (
        entries,
        exits,
        ask_relays_question["stderr"],
    )
    for relay in relay_hosts:
        seen = _peers(flows, relay)
        print(f"{relay}'s peers: {sorted(seen)}")
        if relay in entries:
            assert seen & exits and seen <= {user} | exits | others, (relay, sorted(seen))
        else:
            assert seen & entries and seen <= node_hosts | entries | others, (relay, sorted(seen))
    everything = b"".join(flows.values())
    assert len(everything) > 10_000
    words = {word for word in text.replace(".", " ").split() if len(word) >= 5}
    for clear in (QUESTION, text, *words, *(w for w in QUESTION.split() if len(w) >= 5)):
        assert clear.encode() not in everything, clear
    head = ClientHead.load(models_dir() / MODEL / "manifest.json", device="cpu")
    rows = head.embed_np(head.chat_ids([{"role": "user", "content": QUESTION}]))[0]
    windows = [
        rows[i].astype(dtype).tobytes()[:64] for i in range(len(rows)) for dtype in ("<f4", "<f2")
    ]
    assert not any(window in everything for window in windows)


@pytest.fixture(scope="module")
def operator_home(tmp_path_factory: pytest.TempPathFactory) -> str:
    """operator0's home: it joins shard 0 in one test and leaves in the last."""
    return str(tmp_path_factory.mktemp("operator0"))


def test_hosts_operator_in_its_own_host_funds_stakes_joins_and_is_routable(
    env, devnet, operator_home
) -> None:
    home = operator_home
    operator = {**env, "PLANET_PASSWORD": "operator0 pw"}
    address_of_host = devnet["hosts"]["hosts"]["operator0"]["address"]
    broke = _in_host(
        operator, "operator0", "stake", "--role", "compute", "--amount", "1", "--home", home
    )
    assert broke.returncode != 0
    shown = _in_host(operator, "operator0", "status", "--json", "--home", home)
    wallet = json.loads(shown.stdout)["address"]
    assert f"planet devnet fund {wallet} 10" in broke.stderr
    funded = _planet(env, "devnet", "fund", wallet, timeout=60)
    assert funded.returncode == 0, funded.stderr
    staked = _in_host(
        operator, "operator0", "stake", "--role", "compute", "--amount", "1", "--home", home
    )
    assert staked.returncode == 0, staked.stderr
    joined = _in_host(
        operator, "operator0", "join", "--model", MODEL, "--shard", "0", "--home", home,
        timeout=400,
    )  # fmt: skip
    assert joined.returncode == 0, joined.stderr[-3000:]
    assert f"at {address_of_host}:" in joined.stderr
    mine = json.loads(_in_host(operator, "operator0", "status", "--json", "--home", home).stdout)
    assert mine["committee"]["routable"] is True
    assert mine["committee_rpc"] == devnet["committee_rpc"][0]
    report = json.loads(_planet(env, "devnet", "status", "--json", timeout=120).stdout)
    listed = [n for n in report["nodes"] if n["key"] == mine["node_key"]]
    assert listed and listed[0]["routable"], report["nodes"]
    assert listed[0]["endpoint"].startswith(f"https://{address_of_host}:")  # TLS, its key
    assert wallet in [a["address"] for a in report["accounts"]]


FAILOVER_TOKENS = 32  # long enough over 50 ms links to kill a node between two tokens ...
# ... if the answer runs that long: the capital question ends at EOS after a few tokens, and
# the watcher's TLS probes over the 50 ms links saw its third pass so late once that the answer
# had finished before the kill (clean-clone CI of 8337959: no failover in the receipt)
FAILOVER_QUESTION = "Name the eight planets of the solar system and one fact about each."
WATCH = """
import http.client, json, ssl, sys, time, urllib.parse as up
plain = ssl.create_default_context(); plain.check_hostname = False
plain.verify_mode = ssl.CERT_NONE  # a probe of the counters only: no activations
links = {}
def passes(url):  # one kept-alive link per node: a read is one round trip, not three
    if url not in links:
        where = up.urlsplit(url)
        links[url] = http.client.HTTPSConnection(where.hostname, where.port, timeout=2,
                                                 context=plain)
    links[url].request("GET", "/info")
    return json.loads(links[url].getresponse().read())["load"]["decode_batches"]
urls = sys.argv[1:]
start = {url: passes(url) for url in urls}
print("ready", flush=True)
for _ in range(1200):  # 2 minutes at most
    for url in urls:
        if passes(url) > start[url]:
            print(url, flush=True)
            sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
"""
# The kill comes at the serving node's first decode pass: from its third on, the gateway may
# move a question off a node it picked on trial that runs slower than its replica (node/client/
# failover.py, MIN_OBSERVED_PASSES). A kill that came after such a move hit a node no longer in
# the circuit (clean-clone CI of 7be240c: no failover, both trial nodes in the receipt).


def test_hosts_node_killed_mid_answer_same_text_from_its_replica(
    env, devnet, operator_home
) -> None:
    """Shard 0 now has two nodes in two hosts (node0's and operator0's). A paid question from
    the user host, across the 50 ms links, whose shard-0 node is killed with SIGKILL at its
    first decode pass: the gateway replays the history into the other one and the answer is
    the same text as the same question asked without a kill, the gateway's log names the
    killed node's failure and the receipt names the killed node after the final circuit. The
    verifier is paused meanwhile (SIGSTOP), so the only decode passes are the question's.
    Then operator0 leaves."""
    operator = {**env, "PLANET_PASSWORD": "operator0 pw"}
    homes = [*devnet["operators"], operator_home]
    joined = [json.loads((Path(h) / "run" / "joined.json").read_text()) for h in homes]
    model = devnet["model_hash"]  # not the second model's seat (its shard 0 is another model's)
    shard0 = {
        j["endpoint"]: (j["node_pid"], j["node_key"])
        for j in joined
        if j["shard"] == 0 and j["model"] == model
    }
    assert len(shard0) == 2, joined
    ask = ("ask", "--pay", "--json", "--max-tokens", str(FAILOVER_TOKENS), FAILOVER_QUESTION)
    verifiers = devnet["pids"].get("verifiers", [])
    gateway_log = Path(devnet["dir"]) / "logs" / "gateway.log"
    for pid in verifiers:
        os.kill(pid, signal.SIGSTOP)
    try:
        # (asked first without a kill: also the time a paused verifier's last question needs)
        quiet = _in_host(env, "user", *ask, timeout=300)
        assert quiet.returncode == 0, quiet.stderr[-3000:]
        argv = [sys.executable, "-m", "planet", "devnet", "exec", "user", "--"]
        watch = subprocess.Popen(
            [*argv, sys.executable, "-c", WATCH, *shard0], env=env, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert watch.stdout is not None and watch.stdout.readline().strip() == "ready"
        asked = subprocess.Popen(
            [*argv, "planet", *ask], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        logged = gateway_log.stat().st_size  # the gateway's log from here on is this question's
        serving = watch.stdout.readline().strip()
        assert watch.wait(30) == 0 and serving in shard0, serving
        os.kill(shard0[serving][0], signal.SIGKILL)
        out, err = asked.communicate(timeout=300)
    finally:
        for pid in verifiers:
            os.kill(pid, signal.SIGCONT)
    assert asked.returncode == 0 and "Traceback" not in err, err[-3000:]
    killed, answer = json.loads(out), json.loads(quiet.stdout)
    assert killed["text"] == answer["text"] != ""
    assert killed["receipt"]["completion_tokens"] == answer["receipt"]["completion_tokens"]
    print(f"failover answer: {answer['receipt']['completion_tokens']} tokens")
    with gateway_log.open("rb") as log:
        log.seek(logged)
        failovers = [line for line in log.read().decode().splitlines() if "circuit failed" in line]
    assert any(serving in line for line in failovers), failovers
    # the final circuit (3 shards) with the other shard-0 node, then the nodes it left: the
    # killed one, and any other node it moved off on trial before the kill
    (replica,) = (key for endpoint, (_, key) in shard0.items() if endpoint != serving)
    final, left = killed["receipt"]["nodes"][:3], killed["receipt"]["nodes"][3:]
    assert final[0] == replica and shard0[serving][1] in left, killed["receipt"]
    left = _in_host(operator, "operator0", "leave", "--now", "--home", operator_home, timeout=120)
    assert left.returncode == 0 and "chain status LEFT" in left.stdout, left.stderr
