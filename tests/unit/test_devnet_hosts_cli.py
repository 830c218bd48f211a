"""`planet devnet up --hosts | fund | exec` edges that need no devnet processes: the host plan,
flag mistakes, missing privileges, a chain that is not a devnet's, a devnet without hosts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from deploy.devnet.hosts import (
    CONTROL_HOST,
    NODE_PORT,
    OPERATOR_PORTS,
    Placement,
    exec_argv,
    host_names,
    plan_hosts,
)
from deploy.devnet.plan import LinkPlan
from deploy.netlab.shape import Shape
from planet import main as cli
from protocol.errors import UnavailableError, UsageError

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ADDRESS = "0x5B38Da6a701c568545dCfcB03FcB875f56beddC4"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


# --- the plan -------------------------------------------------------------------------------


def test_plan_flat_links_every_ordered_pair_and_exposes_each_service() -> None:
    plan = plan_hosts(validators=2, nodes=3, gateway=True, operators=1, links=LinkPlan(50))
    assert plan.names == (
        "anvil", "validator0", "validator1", "node0", "node1", "node2", "gateway",
        CONTROL_HOST, "operator0",
    )  # fmt: skip
    assert len(plan.shapes) == len(plan.names) * (len(plan.names) - 1)
    assert set(plan.shapes.values()) == {Shape(50, 3)}  # jitter 5 % of the delay, rounded
    assert plan.services["anvil"] == (8545,)
    assert plan.services["validator1"] == (26656, 26657, 8700)  # p2p, RPC, findings
    assert plan.services["node2"] == (NODE_PORT,) and plan.services["gateway"] == (8000,)
    assert plan.services["operator0"] == OPERATOR_PORTS
    assert CONTROL_HOST not in plan.services  # the user host serves nothing


def test_plan_relay_hosts_and_nat_hosts_behind_their_routers() -> None:
    plan = plan_hosts(
        validators=1, nodes=1, gateway=False, operators=0, links=LinkPlan(50), relays=2, nats=1
    )
    assert plan.names[-3:] == ("relay0", "relay1", "router0")  # on the bridge
    assert "nat0" not in plan.names and plan.behind_nat == {"nat0": "router0"}
    assert plan.services["relay1"] == (9100, 9200, 9201, 9202, 9203)  # serve, rendezvous ports
    assert "router0" not in plan.services  # a router serves nothing; nat0 takes nothing in
    assert ("nat0", "router0") not in plan.shapes  # nat0's links are its router's


def test_plan_matrix_places_hosts_in_regions_in_turn(tmp_path: Path) -> None:
    matrix = tmp_path / "m.csv"
    matrix.write_text("from/to,east,west\neast,1,40\nwest,60,2\n")
    plan = plan_hosts(
        validators=1, nodes=1, gateway=False, operators=0, links=LinkPlan(matrix=matrix)
    )
    assert plan.regions == {"anvil": "east", "validator0": "west", "node0": "east", "user": "west"}
    assert plan.shapes[("anvil", "validator0")] == Shape.from_latency(40)
    assert plan.shapes[("validator0", "anvil")] == Shape.from_latency(60)
    assert plan.shapes[("anvil", "node0")] == Shape.from_latency(1)
    default = plan_hosts(validators=4, nodes=3, gateway=True, operators=1, links=LinkPlan())
    assert set(default.regions.values()) == {"virginia", "frankfurt", "saopaulo", "tokyo",
                                             "singapore"}  # fmt: skip


def test_plan_bad_matrix_is_a_usage_error(tmp_path: Path) -> None:
    matrix = tmp_path / "m.csv"
    matrix.write_text("from/to,east\nwest,1\n")
    with pytest.raises(UsageError, match="latency matrix line 2"):
        plan_hosts(validators=1, nodes=1, gateway=False, operators=0, links=LinkPlan(matrix=matrix))


def test_placement_runs_argv_in_the_host_or_on_loopback() -> None:
    loopback = Placement()
    assert loopback.address("anvil") == "127.0.0.1" and loopback.argv("anvil", ["x"]) == ["x"]
    assert loopback.control_netns is None and not loopback.on_hosts
    hosts = Placement({"anvil": {"address": "10.77.0.1", "netns": "pnlabc123-anvil"}})
    assert hosts.address("anvil") == "10.77.0.1"
    assert hosts.argv("anvil", ["anvil", "--host", "10.77.0.1"]) == [
        "ip", "netns", "exec", "pnlabc123-anvil", "anvil", "--host", "10.77.0.1",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="no host 'gateway'") as raised:
        hosts.address("gateway")
    assert raised.value.hint == "its hosts: anvil"
    assert host_names(1, 1, False, 2)[-2:] == ["operator0", "operator1"]


# --- `up` flag mistakes and privileges ------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--link-ms", "50"], "--link-ms shapes the hosts' links; it needs --hosts"),
        (["--operator-hosts", "2"], "--operator-hosts shapes the hosts' links; it needs --hosts"),
        (
            ["--hosts", "--link-ms", "50", "--latency-matrix", "m.csv"],
            "--link-ms and --latency-matrix",
        ),
        (["--hosts", "--link-ms", "-1"], "--link-ms must be 0..10000"),
        (["--hosts", "--link-kbps", "0"], "--link-kbps must be at least 1"),
        (["--hosts", "--latency-matrix", "/no/such.csv"], "--latency-matrix /no/such.csv: no"),
        (["--hosts", "--operator-hosts", "9"], "--operator-hosts must be 0..8"),
        (["--relay-hosts", "3"], "--relay-hosts shapes the hosts' links; it needs --hosts"),
        (["--nat-hosts", "1"], "--nat-hosts shapes the hosts' links; it needs --hosts"),
        (["--hosts", "--relay-hosts", "9"], "--relay-hosts must be 0..8"),
        (["--hosts", "--nat-hosts", "5"], "--nat-hosts must be 0..4"),
    ],
)
def test_devnet_up_host_flag_mistakes_are_usage_errors(
    tmp_path: Path, capsys, flags: list[str], message: str
) -> None:
    code, _, err = _run(capsys, "devnet", "up", *flags, "--home", str(tmp_path))
    assert code == 2 and f"error: {message}" in err
    assert not (tmp_path / "devnet").exists()


def _unprivileged() -> list[str] | None:
    """A prefix that runs a command without the privileges for namespaces, or None."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    return ["setpriv", "--bounding-set=-net_admin,-sys_admin"]


def test_devnet_up_hosts_without_privileges_says_how_to_get_them(tmp_path: Path) -> None:
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("root without setpriv: cannot drop the namespace privileges")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_")}
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "planet", "devnet", "up", "--hosts", "--detach"],
        env={**env, "PLANET_HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr  # one error, one hint, no traceback
    assert lines[0].startswith("error: --hosts needs network namespaces, which this process")
    assert lines[1].startswith("hint: run it as root (or with CAP_NET_ADMIN and CAP_SYS_ADMIN)")
    assert "planet devnet up --hosts" in lines[1]
    assert not (tmp_path / "devnet").exists()


# --- fund -----------------------------------------------------------------------------------


class _Geth(BaseHTTPRequestHandler):
    """A JSON-RPC endpoint that is not anvil (mainnet's chain id); it records the methods."""

    calls: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(body["method"])
        answers = {"web3_clientVersion": "Geth/v1.14.0-stable/linux-amd64", "eth_chainId": "0x1"}
        result = answers.get(body["method"], "0x0")
        data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def geth() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Geth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Geth.calls = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _devnet(home: Path, **changes: Any) -> None:
    (home / "devnet").mkdir(parents=True)
    state = {"status": "up", "evm_rpc": "http://127.0.0.1:1", "chain_id": 31337, **changes}
    (home / "devnet" / "devnet.json").write_text(json.dumps(state))


def test_fund_refuses_a_chain_that_is_not_a_devnet_by_name(tmp_path: Path, capsys, geth) -> None:
    _devnet(tmp_path)
    code, _, err = _run(
        capsys, "devnet", "fund", ADDRESS, "1", "--evm-rpc", geth, "--home", str(tmp_path)
    )
    assert code == 2
    assert f"error: {geth} is not a devnet chain (Geth/v1.14.0-stable/linux-amd64, chain 1)" in err
    assert "hint:" in err
    assert "eth_sendTransaction" not in _Geth.calls  # nothing was sent


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([ADDRESS], "no devnet is up in"),
        (["0x1234", "1"], "'0x1234' is not an EVM address"),
        ([ADDRESS, "-1"], "the amount must be positive ETH"),
        ([ADDRESS, "ten"], "the amount 'ten' is not an amount of ETH"),
        ([ADDRESS, "5000"], "the amount 5000 ETH is more than a dev faucet gives"),
        ([ADDRESS, "1e999999999"], "the amount '1e999999999' is not an amount of ETH"),
        ([ADDRESS, "1e-999999999"], "the amount '1e-999999999' is not an amount of ETH"),
        ([ADDRESS, "0.0000000000000000001"], "the amount '0.0000000000000000001' has more than"),
    ],
)
def test_fund_mistakes_are_usage_errors(
    tmp_path: Path, capsys, argv: list[str], message: str
) -> None:
    code, _, err = _run(capsys, "devnet", "fund", *argv, "--home", str(tmp_path))
    assert code == 2 and f"error: {message}" in err


class _Anvil(_Geth):
    """An anvil-like JSON-RPC endpoint (client anvil, chain 31337) that keeps balances."""

    balances: ClassVar[dict[str, int]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(body["method"])
        params = body.get("params") or []
        result: Any = "0x0"
        if body["method"] == "web3_clientVersion":
            result = "anvil/v1.0.0"
        elif body["method"] == "eth_chainId":
            result = hex(31337)
        elif body["method"] == "eth_sendTransaction":
            to = params[0]["to"].lower()
            self.balances[to] = self.balances.get(to, 0) + int(params[0]["value"], 16)
            result = "0x" + "ab" * 32
        elif body["method"] == "eth_getTransactionReceipt":
            result = {"status": "0x1"}
        elif body["method"] == "eth_getBalance":
            result = hex(self.balances.get(params[0].lower(), 0))
        data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def anvil() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Anvil)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Anvil.calls, _Anvil.balances = [], {}
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fund_sends_from_the_dev_account_and_status_lists_the_funded_address(
    tmp_path: Path, capsys, anvil
) -> None:
    """The hint of an empty wallet promises `planet devnet status` lists funded accounts."""
    _devnet(tmp_path, evm_rpc=anvil, dir=str(tmp_path / "devnet"))
    code, out, _ = _run(capsys, "devnet", "fund", ADDRESS, "2.5", "--home", str(tmp_path))
    assert code == 0 and f"sent 2.5 ETH to {ADDRESS}" in out and "balance now 2.5 ETH" in out
    assert _Anvil.balances[ADDRESS.lower()] == 25 * 10**17
    code, out, _ = _run(capsys, "devnet", "fund", ADDRESS, "--json", "--home", str(tmp_path))
    assert code == 0 and json.loads(out)["balance_wei"] == str(125 * 10**17)  # default 10 ETH
    state = json.loads((tmp_path / "devnet" / "devnet.json").read_text())
    assert [a["address"] for a in state["accounts"]] == [ADDRESS]  # listed once
    code, out, _ = _run(capsys, "devnet", "status", "--home", str(tmp_path))
    assert code == 0 and "funded accounts" in out
    assert any(ADDRESS in line and "funded" in line for line in out.splitlines()), out


# --- exec -----------------------------------------------------------------------------------


def test_exec_needs_a_devnet_with_hosts_and_a_known_host(tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, "devnet", "exec", "user", "--", "true", "--home", str(tmp_path))
    assert code == 2 and "error: no devnet is up in" in err
    _devnet(tmp_path)
    code, _, err = _run(
        capsys, "devnet", "exec", "--home", str(tmp_path), "user", "--", "planet", "status"
    )
    assert code == 2 and "error: this devnet runs on 127.0.0.1, not in hosts" in err


def test_exec_argv_enters_the_host_and_names_the_devnet(tmp_path: Path) -> None:
    hosts = {
        "user": {"address": "10.77.0.10", "netns": "pnlabc123-user"},
        "operator0": {"address": "10.77.0.11", "netns": "pnlabc123-operator0"},
    }
    state = {"status": "up", "hosts": {"hosts": hosts, "pid": os.getpid()}}
    with pytest.raises(UsageError, match="no host 'gateway'") as raised:
        exec_argv(state, tmp_path, "gateway", ["planet", "status"])
    assert raised.value.hint == "its hosts: user, operator0"
    # a keeper pid that is not the keeper: the hosts are gone, nothing can reach them
    with pytest.raises(UnavailableError, match="the devnet's hosts are gone"):
        exec_argv(state, tmp_path, "operator0", ["planet", "status"])


def test_status_of_a_devnet_whose_hosts_are_gone(tmp_path: Path, capsys) -> None:
    _devnet(tmp_path, hosts={"hosts": {}, "pid": 999_999_999}, dir=str(tmp_path / "devnet"))
    code, out, _ = _run(capsys, "devnet", "status", "--home", str(tmp_path))
    assert code == 0 and "its hosts are gone (keeper exited)" in out


def test_the_ports_exec_names_are_the_ports_the_lab_exposes_and_join_takes_one(
    monkeypatch,
) -> None:
    """`planet devnet exec HOST` names HOST's exposed ports (PLANET_DEVNET_PORTS), the same
    the lab's links carry (plan_hosts); `planet join` there takes a free one of them, not a
    random port no other host reaches, and says so by name when all are taken."""
    import socket

    from deploy.devnet.hosts import exposed_ports
    from node.cli.operator import _devnet_host_port
    from node.config import DEVNET_PORTS_ENV, devnet_ports

    plan = plan_hosts(validators=2, nodes=3, gateway=True, operators=2, links=LinkPlan(50))
    for host in plan.names:
        assert exposed_ports(host) == plan.services.get(host, ()), host
    assert devnet_ports({DEVNET_PORTS_ENV: "18100,18101"}) == (18100, 18101)
    for junk in ("x", "١٨١٠٠", "1_8100", "0", "70000", "18100,-1", "9" * 400):
        assert devnet_ports({DEVNET_PORTS_ENV: junk}) == (), junk
    assert devnet_ports({}) == ()
    monkeypatch.delenv(DEVNET_PORTS_ENV, raising=False)
    assert _devnet_host_port("127.0.0.1") == 0  # outside a devnet host: any free port
    with socket.socket() as one, socket.socket() as two:
        one.bind(("127.0.0.1", 0))
        two.bind(("127.0.0.1", 0))
        taken, other = one.getsockname()[1], two.getsockname()[1]
        one.listen()
        monkeypatch.setenv(DEVNET_PORTS_ENV, f"{taken},{other}")
        two.close()
        assert _devnet_host_port("127.0.0.1") == other
        monkeypatch.setenv(DEVNET_PORTS_ENV, str(taken))
        with pytest.raises(UsageError, match="every port this devnet host exposes"):
            _devnet_host_port("127.0.0.1")
