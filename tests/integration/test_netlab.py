"""deploy.netlab on real namespaces: hosts a, b, c; a TCP echo server in b; links via toxiproxy.

Skipped, with the reason, where this process cannot make network namespaces (not root) or run the
proxies (toxiproxy-server not built: `bash deploy/setup.sh`, or PLANET_TOXIPROXY). Every byte goes
to addresses inside namespaces this run made (10.77.0.0/24) or to their loopback. The bounds test
behaviour, not speed: they are generous for a busy 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.netlab import (
    Cut,
    Lab,
    Links,
    Shape,
    can_make_hosts,
    can_run_proxies,
    down_stale,
    leftovers,
)
from deploy.netlab.hosts import Host

pytestmark = [pytest.mark.integration, pytest.mark.e2e_lane]

ECHO = Path(__file__).with_name("netlab_echo.py")
ECHO_PORT = 7000
REPO_ROOT = Path(__file__).resolve().parents[2]


def _unavailable() -> str | None:
    for check in (can_make_hosts, can_run_proxies):
        able, reason = check()
        if not able:
            return reason
    return None


def start_echo(host: Host, port: int = ECHO_PORT) -> subprocess.Popen[bytes]:
    """The echo server in `host` on its own address, once it accepts connections."""
    process = host.popen([sys.executable, str(ECHO), str(host.address), str(port)])
    deadline = time.monotonic() + 10.0
    while True:
        try:
            host.connect(host.address, port, timeout=1.0).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < 100:
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed before the end of the line")
        data += chunk
    return data.decode().strip()


def dial_echo(lab: Lab, dialer: str, timeout: float = 5.0) -> tuple[socket.socket, str]:
    """A connection from `dialer` to b's echo server at b's own address, and b's greeting."""
    sock = lab[dialer].connect(lab["b"].address, ECHO_PORT, timeout=timeout)
    try:
        return sock, read_line(sock)
    except BaseException:
        sock.close()
        raise


def round_trips_ms(lab: Lab, dialer: str, samples: int = 7) -> list[float]:
    """Round trips of a 32-byte message over one connection (after one warm-up exchange)."""
    sock, _ = dial_echo(lab, dialer)
    with sock:
        message = b"m" * 31 + b"\n"
        times = []
        for _ in range(samples + 1):
            started = time.perf_counter()
            sock.sendall(message)
            assert read_exactly(sock, len(message)) == message
            times.append((time.perf_counter() - started) * 1000)
    return times[1:]


def greeting_ms(lab: Lab, dialer: str) -> float:
    """Dialing b until its greeting arrives: one trip b -> dialer (the handshake is local)."""
    started = time.perf_counter()
    sock, _ = dial_echo(lab, dialer)
    sock.close()
    return (time.perf_counter() - started) * 1000


@pytest.fixture(scope="module")
def network() -> Iterator[tuple[Lab, Links]]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    down_stale()
    with Lab.create(["a", "b", "c"]) as lab:
        start_echo(lab["b"])
        yield lab, Links.start(lab, {"b": [ECHO_PORT]})


@pytest.fixture
def lab(network: tuple[Lab, Links]) -> Iterator[Lab]:
    yield network[0]
    network[1].reset()


@pytest.fixture
def links(network: tuple[Lab, Links]) -> Links:
    return network[1]


def test_host_dials_peer_at_its_own_address_and_peer_sees_the_dialers_address(lab: Lab) -> None:
    for dialer in ("a", "c"):
        sock, greeting = dial_echo(lab, dialer)
        sock.close()
        assert greeting == str(lab[dialer].address)
    assert lab["b"].address != lab["a"].address


def test_port_not_exposed_is_refused_at_once(lab: Lab) -> None:
    with pytest.raises(ConnectionRefusedError):
        lab["a"].connect(lab["b"].address, ECHO_PORT + 1, timeout=2.0)


def test_latency_adds_the_configured_one_way_delays_to_that_pair_only(
    lab: Lab, links: Links
) -> None:
    baseline = statistics.median(round_trips_ms(lab, "a"))
    assert baseline < 25

    links.shape("a", "b", Shape(50))
    links.shape("b", "a", Shape(50))
    both_ways = statistics.median(round_trips_ms(lab, "a"))
    assert baseline + 85 <= both_ways <= baseline + 250
    assert statistics.median(round_trips_ms(lab, "c")) < 25  # c -> b is another pair

    links.shape("b", "a", Shape())
    one_way = statistics.median(round_trips_ms(lab, "a"))
    assert baseline + 42 <= one_way <= baseline + 150
    assert greeting_ms(lab, "a") < 25  # b's greeting travels b -> a: not delayed

    links.shape("a", "b", Shape())
    links.shape("b", "a", Shape(50))
    assert 42 <= greeting_ms(lab, "a") <= 150


def test_jitter_spreads_round_trips_around_the_delay(lab: Lab, links: Links) -> None:
    links.shape("a", "b", Shape(40, 20))
    links.shape("b", "a", Shape(40, 20))
    times = round_trips_ms(lab, "a", samples=15)
    assert max(times) - min(times) > 8
    assert min(times) >= 35 and max(times) <= 250


def test_bandwidth_limit_slows_a_transfer_in_its_direction(lab: Lab, links: Links) -> None:
    payload = os.urandom(50_000)

    def transfer_s() -> float:
        sock, _ = dial_echo(lab, "a")
        with sock:
            started = time.perf_counter()
            sock.sendall(payload)
            assert read_exactly(sock, len(payload)) == payload
            return time.perf_counter() - started

    assert transfer_s() < 0.3
    links.shape("a", "b", Shape(kbytes_per_s=100))  # 50 kB at 100 kB/s: 0.5 s
    assert 0.35 <= transfer_s() <= 5.0


def test_partition_holds_bytes_until_restored_then_delivers_them(lab: Lab, links: Links) -> None:
    open_before, _ = dial_echo(lab, "a")
    with open_before:
        links.cut("a", "b", Cut.PARTITION)
        open_before.settimeout(1.0)
        open_before.sendall(b"held\n")
        with pytest.raises(TimeoutError):
            open_before.recv(5)
        with pytest.raises(TimeoutError):
            dial_echo(lab, "a", timeout=1.0)  # the handshake is local; the greeting never comes

        links.restore("a", "b")
        open_before.settimeout(5.0)
        assert read_exactly(open_before, 5) == b"held\n"
    sock, greeting = dial_echo(lab, "a")
    sock.close()
    assert greeting == str(lab["a"].address)


def test_down_link_closes_connections_and_refuses_new_ones_until_restored(
    lab: Lab, links: Links
) -> None:
    open_before, _ = dial_echo(lab, "a")
    with open_before:
        links.cut("b", "a", Cut.DOWN)
        open_before.settimeout(5.0)
        try:
            closed = open_before.recv(1) == b""
        except ConnectionResetError:
            closed = True
        assert closed
    with pytest.raises(ConnectionRefusedError):
        dial_echo(lab, "a", timeout=2.0)
    assert dial_echo(lab, "c")[1] == str(lab["c"].address)  # only the a-b link is down

    links.restore("a", "b")
    sock, _ = dial_echo(lab, "a")
    sock.close()


def names_of_run(run_id: str) -> list[str]:
    """The run's namespaces and interfaces as `ip netns list` and `ip link` show them."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    words = (netns.stdout + links.stdout).split()
    return sorted({word.split("@")[0].rstrip(":") for word in words if f"pnl{run_id}" in word})


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def pids_in(lab_names: list[str]) -> list[int]:
    pids: list[int] = []
    for name in lab_names:
        found = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        pids += [int(pid) for pid in found.stdout.split()]
    return pids


def test_down_removes_namespaces_bridge_veths_proxies_and_servers() -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    lab = Lab.create(["x", "y"])
    start_echo(lab["y"])
    Links.start(lab, {"y": [ECHO_PORT]})
    run_id, workdir = lab.run_id, lab.workdir
    names = names_of_run(run_id)
    pids = pids_in([host.netns for host in lab.hosts.values()])
    assert len(names) == 2 + 1 + 2  # namespaces, bridge, veths
    assert len(pids) == 3  # two proxies, one echo server

    lab.down()

    assert names_of_run(run_id) == []
    assert not any(alive(pid) for pid in pids)
    assert not workdir.exists()
    assert run_id not in leftovers()


# A run that a SIGKILL ends: it leaves namespaces, bridge, veths, proxies and a server behind.
CRASHING_RUN = """
import sys, time
from deploy.netlab import Lab, Links
lab = Lab.create(["x", "y"])
y = lab["y"]
y.popen([sys.executable, sys.argv[1], str(y.address), "7000"])
Links.start(lab, {"y": [7000]})
print(lab.run_id, flush=True)
time.sleep(60)
"""


def test_down_stale_removes_what_a_killed_run_left() -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    owner = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN, str(ECHO)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        run_id = owner.stdout.readline().strip() if owner.stdout else ""
        assert len(run_id) == 6, "the crashing run did not start"
        pids = pids_in([name for name in names_of_run(run_id) if "-" in name])
        assert run_id not in down_stale()  # its owner is alive: left alone
        assert len(pids) == 3
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)

    assert run_id in leftovers()
    assert run_id in down_stale()
    assert names_of_run(run_id) == []
    assert not any(alive(pid) for pid in pids)
    assert run_id not in leftovers()


def test_can_make_hosts_without_privileges_says_how_to_get_them() -> None:
    if os.geteuid() != 0:
        able, reason = can_make_hosts()
    else:
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        check = "import json; from deploy.netlab import can_make_hosts as c; print(json.dumps(c()))"
        unprivileged = subprocess.run(
            [*as_nobody, sys.executable, "-c", check],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        assert unprivileged.returncode == 0, unprivileged.stderr
        able, reason = json.loads(unprivileged.stdout)
    assert not able
    assert "sudo" in reason and "unshare" in reason
