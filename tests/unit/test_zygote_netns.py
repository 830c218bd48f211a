"""`ip netns exec NS python -m MODULE ...` forked by the zygote (node/zygote/netns.py): the
child lives in NS — its interfaces, its addresses, its own /sys — as the command run by
`ip netns exec` does, ends with the same statuses, and the cases a fork cannot stand in for
(no such namespace, an /etc/netns folder) fall back to Popen of that very argv.

Each test makes its own namespace, holding a veth pair and an address (10.250.0.1) that the
test's own namespace does not have. Needs root and `ip netns` (skipped otherwise).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.procs import command_line, run_captured, since_last_start, spawn_logged
from node.zygote import ENV_VAR
from node.zygote.client import ZygoteChild
from node.zygote.fit import namespaces
from node.zygote.netns import ETC_ROOT
from node.zygote.netns import split as split_netns
from node.zygote.wire import BadRequest, parse_spawn

pytestmark = pytest.mark.unit

ADDRESS = "10.250.0.1"  # only in the test's namespace
PROBE = textwrap.dedent(
    """
    import json, os, socket, sys, time
    action = sys.argv[1]
    if action == "where":
        bound = socket.socket()
        try:
            bound.bind((sys.argv[2], 0))
            port = bound.getsockname()[1]
        except OSError as error:
            port = error.errno
        print(json.dumps({
            "net": os.readlink("/proc/self/ns/net"), "mnt": os.readlink("/proc/self/ns/mnt"),
            "links": sorted(name for _, name in socket.if_nameindex()),
            "sys_links": sorted(os.listdir("/sys/class/net")), "bound": port,
            "argv": sys.argv, "pid": os.getpid(), "sid": os.getsid(0),
        }), flush=True)
    elif action == "exit":
        sys.exit(int(sys.argv[2]))
    else:
        time.sleep(120)
    """
)


def _ip_netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"zyg-check-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return made


if not _ip_netns_usable():
    pytest.skip("needs root and `ip netns`", allow_module_level=True)


@pytest.fixture
def probe_dir(tmp_path: Path, zygote: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "zprobe.py").write_text(PROBE)
    monkeypatch.setenv(ENV_VAR, str(zygote))
    return tmp_path


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"zyg-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for command in (
            ["link", "add", "zv0", "type", "veth", "peer", "name", "zv1"],
            ["addr", "add", f"{ADDRESS}/32", "dev", "lo"],
            ["link", "set", "lo", "up"],
        ):
            subprocess.run(["ip", "-n", name, *command], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


def _in(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, "-m", "zprobe", *args]


def _where(
    folder: Path, argv: list[str], *, forked: bool
) -> tuple[dict, ZygoteChild | subprocess.Popen]:
    log = folder / "probe.log"
    child = spawn_logged(argv, log, cwd=folder)
    assert isinstance(child, ZygoteChild) is forked, child
    assert child.wait(timeout=60) == 0, log.read_text()
    return json.loads(since_last_start(log.read_text())), child


def test_forked_child_lives_in_the_namespace_as_ip_netns_exec_runs_it(
    probe_dir: Path, netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked, child = _where(probe_dir, _in(netns, "where", ADDRESS), forked=True)
    assert child.args == _in(netns, "where", ADDRESS)
    assert forked["net"] == f"net:[{os.stat(f'/var/run/netns/{netns}').st_ino}]"
    assert forked["links"] == forked["sys_links"] == ["lo", "zv0", "zv1"]
    assert forked["bound"] > 0  # the address exists there
    assert forked["mnt"] != os.readlink("/proc/self/ns/mnt")  # a mount namespace of its own
    assert forked["pid"] == forked["sid"] == child.pid
    monkeypatch.delenv(ENV_VAR)  # the same argv without a zygote: `ip netns exec` itself
    fresh, _ = _where(probe_dir, _in(netns, "where", ADDRESS), forked=False)
    for key in ("net", "links", "sys_links", "argv"):
        assert forked[key] == fresh[key], key
    assert fresh["bound"] > 0


def test_without_the_prefix_the_child_stays_in_the_callers_namespace(
    probe_dir: Path, netns: str
) -> None:
    here, _ = _where(probe_dir, _in(netns, "where", ADDRESS)[4:], forked=True)
    assert here["net"] == os.readlink("/proc/self/ns/net")
    assert here["bound"] == errno.EADDRNOTAVAIL


def test_forked_child_in_a_namespace_shows_the_commands_argv_and_ends_as_signalled(
    probe_dir: Path, netns: str
) -> None:
    argv = _in(netns, "sleep")
    child = spawn_logged(argv, probe_dir / "probe.log", cwd=probe_dir)
    assert isinstance(child, ZygoteChild)
    try:  # what /proc shows once `ip netns exec` has exec'd the command
        assert command_line(child.pid) == [a.encode() for a in argv[4:]] + [b""]
    finally:
        child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("status", [0, 3])
def test_forked_child_in_a_namespace_exit_status(probe_dir: Path, netns: str, status: int) -> None:
    child = spawn_logged(_in(netns, "exit", str(status)), probe_dir / "probe.log", cwd=probe_dir)
    assert isinstance(child, ZygoteChild)
    assert child.wait(timeout=30) == status


def test_run_captured_in_a_namespace_is_forked_with_its_output(probe_dir: Path, netns: str) -> None:
    done = run_captured(_in(netns, "where", ADDRESS), cwd=probe_dir, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["bound"] > 0 and seen["links"] == ["lo", "zv0", "zv1"]
    assert seen["sid"] != seen["pid"]  # subprocess.run's child: no session of its own
    zygote_log = Path(os.environ[ENV_VAR]).parent / "zygote.log"
    assert f"forked {seen['pid']}: zprobe" in zygote_log.read_text()


def test_no_such_namespace_falls_back_to_ip_netns_exec(probe_dir: Path) -> None:
    argv = _in(f"zyg-none-{os.getpid()}", "exit", "0")
    child = spawn_logged(argv, probe_dir / "probe.log", cwd=probe_dir)
    assert isinstance(child, subprocess.Popen)
    assert child.wait(timeout=30) != 0
    assert "Cannot open network namespace" in (probe_dir / "probe.log").read_text()


def test_namespace_with_an_etc_folder_falls_back_to_ip_netns_exec(
    probe_dir: Path, netns: str
) -> None:
    etc = ETC_ROOT / netns  # `ip netns exec` bind-mounts these files over /etc: not a fork's job
    etc.mkdir(parents=True)
    try:
        here, _ = _where(probe_dir, _in(netns, "where", ADDRESS), forked=False)
    finally:
        etc.rmdir()
        if not any(ETC_ROOT.iterdir()):
            ETC_ROOT.rmdir()
    assert here["bound"] > 0 and here["links"] == ["lo", "zv0", "zv1"]


def test_caller_keeps_its_own_namespace(probe_dir: Path, netns: str) -> None:
    _where(probe_dir, _in(netns, "where", ADDRESS), forked=True)
    with socket.socket() as sock, pytest.raises(OSError):
        sock.bind((ADDRESS, 0))  # only the child entered the namespace


CALLER = """
import sys
from node.procs import spawn_logged
from node.zygote.client import ZygoteChild
child = spawn_logged(sys.argv[2:], __import__("pathlib").Path(sys.argv[1]))
print(type(child).__name__, child.wait(timeout=60), flush=True)
"""


def test_caller_inside_a_namespace_has_its_children_forked_there(
    probe_dir: Path, netns: str
) -> None:
    """A process run by `ip netns exec` (`planet join` in a devnet host) starting a service:
    the child joins the caller's network and mount namespaces, where Popen's would live."""
    log = probe_dir / "probe.log"
    argv = ["ip", "netns", "exec", netns, sys.executable, "-c", CALLER, str(log),
            sys.executable, "-m", "zprobe", "where", ADDRESS]  # fmt: skip
    done = subprocess.run(argv, cwd=probe_dir, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["ZygoteChild", "0"], done.stderr
    seen = json.loads(since_last_start(log.read_text()))
    assert seen["net"] == f"net:[{os.stat(f'/var/run/netns/{netns}').st_ino}]"
    assert seen["bound"] > 0 and seen["links"] == seen["sys_links"] == ["lo", "zv0", "zv1"]


HANDOFF = """
import sys
from node.zygote.handoff import exec_or_fork
print("wrapper", __import__("os").getpid(), flush=True)
exec_or_fork(sys.argv[1:], dict(__import__("os").environ))
"""


def _handoff(folder: Path, *args: str) -> subprocess.Popen[str]:
    (folder / "zhandoff.py").write_text(HANDOFF)
    return subprocess.Popen(
        [sys.executable, "-m", "zhandoff", *args], cwd=folder, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_handoff_runs_the_command_in_its_namespace_on_our_streams(
    probe_dir: Path, netns: str
) -> None:
    wrapper = _handoff(probe_dir, *_in(netns, "where", ADDRESS))
    out, err = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 0, err
    first, report = out.splitlines()
    seen = json.loads(report)
    assert int(first.split()[1]) == wrapper.pid != seen["pid"]  # forked, not exec'd
    assert seen["bound"] > 0 and seen["links"] == ["lo", "zv0", "zv1"]


@pytest.mark.parametrize("status", [0, 3])
def test_handoff_ends_with_the_commands_status(probe_dir: Path, netns: str, status: int) -> None:
    wrapper = _handoff(probe_dir, *_in(netns, "exit", str(status)))
    assert wrapper.wait(timeout=60) == status, wrapper.communicate()[1]


def test_handoff_passes_sigterm_on_and_ends_by_it(probe_dir: Path, netns: str) -> None:
    wrapper = _handoff(probe_dir, *_in(netns, "sleep"))
    assert wrapper.stdout is not None and wrapper.stdout.readline().startswith("wrapper")
    deadline = time.monotonic() + 30
    while not (child := _netns_pids(netns)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    wrapper.terminate()
    assert wrapper.wait(timeout=30) == -signal.SIGTERM
    deadline = time.monotonic() + 30
    while _netns_pids(netns):  # the command itself ended, not only its stand-in
        assert time.monotonic() < deadline, child
        time.sleep(0.05)


def test_handoff_without_a_zygote_is_the_exec(
    probe_dir: Path, netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR)
    wrapper = _handoff(probe_dir, *_in(netns, "where", ADDRESS))
    out, err = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 0, err
    first, report = out.splitlines()
    assert json.loads(report)["pid"] == int(first.split()[1]) == wrapper.pid


def _netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ip", "netns", "exec", "ns1", "python", "-m", "x"], ("ns1", ["python", "-m", "x"])),
        (
            ["ip", "netns", "exec", "../etc", "python"],
            (None, ["ip", "netns", "exec", "../etc", "python"]),
        ),
        (["ip", "netns", "exec", "ns1"], (None, ["ip", "netns", "exec", "ns1"])),
        (["ip", "-n", "ns1", "link"], (None, ["ip", "-n", "ns1", "link"])),
        (["python", "-m", "x"], (None, ["python", "-m", "x"])),
    ],
)
def test_split_takes_only_the_ip_netns_exec_prefix(argv: list[str], expected: tuple) -> None:
    assert split_netns(argv) == expected


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\0b", "n" * 256, 7, ["ns1"], {"ns": 1}])
def test_request_with_a_bad_netns_name_is_refused_by_name(name: object) -> None:
    message = {
        "argv": [sys.executable, "-m", "x"], "env": {}, "cwd": "/", "new_session": True,
        "umask": 0o22, "ignored_signals": [], "namespaces": namespaces(), "cgroups": "",
        "netns": name,
    }  # fmt: skip
    with pytest.raises(BadRequest) as raised:
        parse_spawn(message)
    assert raised.value.field == "netns"


def _spawn_inside(folder: Path, netns: str, *, on_a_thread: bool) -> ZygoteChild | subprocess.Popen:
    """The probe started by a thread that entered `netns` itself (deploy.devnet.hosts `inside`:
    `planet devnet up` runs its steps so, in the devnet's `user` host)."""
    from deploy.devnet.hosts import inside

    started: list[ZygoteChild | subprocess.Popen] = []

    def start() -> None:
        with inside(netns):
            argv = [sys.executable, "-m", "zprobe", "where", ADDRESS]
            started.append(spawn_logged(argv, folder / "probe.log", cwd=folder))

    if on_a_thread:
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
    else:
        start()
    return started[0]


@pytest.mark.parametrize("on_a_thread", [False, True])
def test_a_thread_inside_a_namespace_starts_its_children_there(
    probe_dir: Path, netns: str, on_a_thread: bool
) -> None:
    """The main thread's namespace is its process's: the child joins it. Another thread's is
    not what /proc/PID/ns shows: Popen from that thread puts the child there."""
    child = _spawn_inside(probe_dir, netns, on_a_thread=on_a_thread)
    assert isinstance(child, ZygoteChild) is not on_a_thread
    assert child.wait(timeout=60) == 0
    seen = json.loads(since_last_start((probe_dir / "probe.log").read_text()))
    assert seen["net"] == f"net:[{os.stat(f'/var/run/netns/{netns}').st_ino}]"
    assert seen["bound"] > 0
