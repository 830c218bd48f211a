"""Hosts on one machine: one Linux network namespace per host, each with its own address, all on
one bridge; made, entered and torn down by name.

A *lab* is one run's set of hosts. Everything it creates is named after its run id (6 hex digits)
behind the tag `pnl`, so that the leftovers of a crashed run can be found and removed by name:

    network namespace   pnl<run>-<host>                 e.g. pnl3fa2c1-validator0
    bridge              pnl<run>br                      root namespace, no address
    veth, root side     pnl<run>v<index>                the host's side is `eth0` in its namespace
    owner record        /run/planet-netlab/<run>.json   pid and start time of the creating process
    work folder         /run/planet-netlab/<run>/       logs of the lab's helpers (proxies)

Addresses: the i-th host (in the order given, from 0) gets address i+1 of the lab's network
(10.77.0.0/24 by default) on its `eth0`. The bridge has no address in the root namespace and the
namespaces have no route out, so nothing the lab's hosts send can leave the bridge, and the root
namespace cannot reach them except by entering a namespace. Two labs may use the same network at
the same time: their namespaces and bridges are separate.

As made here, hosts reach each other directly over the bridge; `links.Links` adds the interception
that shapes every link (the design is in this package's docstring).

Entering a host: `Host.popen` / `Host.run` start a program inside it (`ip netns exec`), and
`Host.socket` / `Host.connect` make a socket inside it from this process (a short-lived thread joins
the namespace with setns(2); the socket stays in that namespace whichever thread uses it later).

Teardown: `Lab.down()` (also on leaving `with`, and at interpreter exit) stops the processes the lab
started, kills what else still runs in its namespaces, deletes the namespaces, veths and bridge and
the owner record. `down_stale()` does the same for every run whose owner process is gone (a crash,
a SIGKILL); `python -m deploy.netlab down` calls it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from deploy.netlab.errors import CommandFailed, HostsUnavailable, ToolMissing, UnknownHost

log = logging.getLogger(__name__)

TAG = "pnl"
DEFAULT_NETWORK = IPv4Network("10.77.0.0/24")
DEFAULT_NAT_LAN = IPv4Network("192.168.77.0/30")  # a host behind NAT and its router
HOST_INTERFACE = "eth0"
STATE_ROOT = Path("/run/planet-netlab")
NETNS_ROOT = Path("/run/netns")
COMMAND_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0

PRIVILEGE_HINT = (
    'run as root, or with CAP_NET_ADMIN and CAP_SYS_ADMIN, e.g. `sudo -E env PATH="$PATH" '
    "<command>`; without sudo, `unshare --user --map-root-user --net --mount sh -c "
    "'mount -t tmpfs none /run && <command>'` lets <command> make hosts inside its own namespaces "
    "(shaped links also need a second uid for their proxies, which that mapping lacks)"
)

_HOST_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}\Z")
_OWNED_NAME = re.compile(rf"{TAG}([0-9a-f]{{6}})(?:-[a-z][a-z0-9-]*|br|v\d{{3}})\Z")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

T = TypeVar("T")


# --- names and addresses -------------------------------------------------------------------


def new_run_id() -> str:
    return secrets.token_hex(3)


def netns_name(run_id: str, host: str) -> str:
    return f"{TAG}{run_id}-{host}"


def bridge_name(run_id: str) -> str:
    return f"{TAG}{run_id}br"


def veth_name(run_id: str, index: int) -> str:
    return f"{TAG}{run_id}v{index:03d}"


def run_of(name: str) -> str | None:
    """The run id in a namespace or interface name this module made, else None."""
    match = _OWNED_NAME.match(name)
    return match.group(1) if match else None


def plan_addresses(names: Sequence[str], network: IPv4Network) -> dict[str, IPv4Address]:
    """Host name -> address: the i-th name gets address i+1 of `network`."""
    if not names:
        raise ValueError("a lab needs at least one host")
    for name in names:
        if not _HOST_NAME.match(name):
            raise ValueError(f"host name {name!r}: lowercase letters, digits, '-', 1-31 chars")
    if len(set(names)) != len(names):
        raise ValueError(f"host names repeat: {sorted(names)}")
    if len(names) > min(network.num_addresses - 2, 999):
        raise ValueError(f"{len(names)} hosts do not fit in {network}")
    return {name: network[index + 1] for index, name in enumerate(names)}


# --- commands and namespaces ----------------------------------------------------------------


def run_command(
    argv: Sequence[str], *, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT_S
) -> str:
    """Run a short command to completion; its stdout, or CommandFailed / ToolMissing."""
    try:
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise ToolMissing(argv[0], hint="as root: apt-get install iproute2 util-linux") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(argv, -1, f"timed out after {timeout:g} s") from exc
    if done.returncode != 0:
        raise CommandFailed(argv, done.returncode, done.stderr)
    return done.stdout


def ip(*args: str, netns: str | None = None, stdin: str | None = None) -> str:
    """`ip [-n NETNS] ARGS…`; with stdin, ARGS is `-batch -` and stdin holds one command a line."""
    return run_command(["ip", *(["-n", netns] if netns else []), *args], stdin=stdin)


def call_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run `fn` in a fresh thread that has joined network namespace `netns`; its result."""
    outcome: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            fd = os.open(NETNS_ROOT / netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into {netns}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append((False, exc))

    thread = threading.Thread(target=work, name=f"netns:{netns}", daemon=True)
    thread.start()
    thread.join()
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def write_sysctls(settings: Mapping[str, str], *, netns: str | None = None) -> None:
    """Write /proc/sys/net/… keys (dotted names) in `netns` (or here); IPv6 keys are optional."""

    def write() -> None:
        for key, value in settings.items():
            path = Path("/proc/sys", *key.split("."))
            try:
                path.write_text(value)
            except FileNotFoundError:
                if ".ipv6." not in key:  # a kernel without IPv6 has nothing to turn off
                    raise

    if netns is None:
        write()
    else:
        call_in_netns(netns, write)


_QUIET_IPV6 = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}


@dataclass(frozen=True, eq=False)
class Host:
    """One host of a lab: its namespace, its address, and ways to run things inside it."""

    name: str
    netns: str
    address: IPv4Address
    veth: str
    started: list[subprocess.Popen[Any]] = field(repr=False)

    def popen(self, argv: Sequence[str], **popen_args: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside this host (`ip netns exec`); the lab stops it at teardown.

        It gets its own session (Ctrl-C in a terminal reaches this process, whose teardown then
        stops it) and no stdin unless `popen_args` say otherwise.
        """
        popen_args.setdefault("stdin", subprocess.DEVNULL)
        popen_args.setdefault("start_new_session", True)
        process = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **popen_args)
        self.started.append(process)
        return process

    def run(self, argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """Run `argv` inside this host to completion; its stdout."""
        return run_command(["ip", "netns", "exec", self.netns, *argv], timeout=timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` in a thread inside this host's network namespace."""
        return call_in_netns(self.netns, fn)

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A new socket that lives in this host's network namespace."""
        return self.call(lambda: socket.socket(family, kind))

    def connect(self, address: IPv4Address | str, port: int, timeout: float = 5.0) -> socket.socket:
        """A TCP connection from this host to address:port (timeout: seconds, also for I/O)."""
        return self.call(lambda: socket.create_connection((str(address), port), timeout=timeout))


# --- the lab --------------------------------------------------------------------------------


class Lab:
    """One run's hosts on one bridge. Make it with `Lab.create`; `down()` removes all of it."""

    def __init__(self, run_id: str, network: IPv4Network) -> None:
        self.run_id = run_id
        self.network = network
        self.bridge = bridge_name(run_id)
        self.workdir = STATE_ROOT / run_id  # logs; removed with the lab
        self.hosts: dict[str, Host] = {}
        self._started: list[subprocess.Popen[Any]] = []
        self._is_down = False

    @classmethod
    def create(cls, names: Sequence[str], *, network: IPv4Network = DEFAULT_NETWORK) -> Lab:
        """Make one namespace per name on a new bridge (HostsUnavailable without privileges)."""
        addresses = plan_addresses(names, network)
        lab = cls(new_run_id(), network)
        _write_owner(lab.run_id, list(names))
        lab.workdir.mkdir(mode=0o755)
        atexit.register(lab.down)
        try:
            lab._build(addresses)
        except BaseException:
            lab.down()
            raise
        log.info("netlab up run=%s hosts=%s network=%s", lab.run_id, ",".join(names), network)
        return lab

    def _build(self, addresses: Mapping[str, IPv4Address]) -> None:
        try:
            ip("link", "add", self.bridge, "type", "bridge")
        except CommandFailed as exc:
            raise HostsUnavailable(_last_line(exc.stderr), hint=PRIVILEGE_HINT) from exc
        write_sysctls({f"net.ipv6.conf.{self.bridge}.disable_ipv6": "1"})
        ip("link", "set", self.bridge, "up")
        for index, (name, address) in enumerate(addresses.items()):
            netns, veth = netns_name(self.run_id, name), veth_name(self.run_id, index)
            host = Host(name, netns, address, veth, self._started)
            ip("netns", "add", host.netns)
            self.hosts[name] = host
            write_sysctls(_QUIET_IPV6, netns=host.netns)
            ip("link", "add", veth, "type", "veth", "peer", "name", HOST_INTERFACE, "netns", netns)
            write_sysctls({f"net.ipv6.conf.{host.veth}.disable_ipv6": "1"})
            ip("link", "set", host.veth, "master", self.bridge, "up")
            batch = [
                f"addr add {address}/{self.network.prefixlen} dev {HOST_INTERFACE}",
                "link set lo up",
                f"link set {HOST_INTERFACE} up",
            ]
            ip("-batch", "-", netns=host.netns, stdin="\n".join(batch) + "\n")

    def add_behind_nat(self, name: str, router: str, *, lan: IPv4Network = DEFAULT_NAT_LAN) -> Host:
        """A host with only outbound connectivity: its namespace sits on a private `lan` behind
        `router` (a host of this lab), which forwards its traffic to the bridge and masquerades
        it (iptables MASQUERADE: others see the router's address), and lets in only the answers
        to connections it made (conntrack ESTABLISHED,RELATED). No host of the bridge has a
        route to `lan` either. ToolMissing without iptables."""
        if shutil.which("iptables") is None:
            raise ToolMissing("iptables", hint="as root: apt-get install iptables")
        gateway = self[router]
        if not _HOST_NAME.match(name) or name in self.hosts:
            raise UnknownHost(name, list(self.hosts))
        router_side, address = lan.network_address + 1, lan.network_address + 2
        netns = netns_name(self.run_id, name)
        veth = veth_name(self.run_id, 900 + len(self.hosts))
        ip("netns", "add", netns)
        host = Host(name, netns, address, veth, self._started)
        self.hosts[name] = host
        write_sysctls(_QUIET_IPV6, netns=netns)
        ip("link", "add", veth, "type", "veth", "peer", "name", HOST_INTERFACE, "netns", netns)
        ip("link", "set", veth, "netns", gateway.netns)
        ip(
            "-batch",
            "-",
            netns=gateway.netns,
            stdin=f"addr add {router_side}/{lan.prefixlen} dev {veth}\nlink set {veth} up\n",
        )
        ip(
            "-batch",
            "-",
            netns=netns,
            stdin=f"addr add {address}/{lan.prefixlen} dev {HOST_INTERFACE}\nlink set lo up\n"
            f"link set {HOST_INTERFACE} up\nroute add default via {router_side}\n",
        )
        write_sysctls({"net.ipv4.ip_forward": "1"}, netns=gateway.netns)
        for rule in (
            ["-t", "nat", "-A", "POSTROUTING", "-s", str(lan), "-o", HOST_INTERFACE,
             "-j", "MASQUERADE"],
            ["-A", "FORWARD", "-i", HOST_INTERFACE, "-o", veth, "-m", "conntrack",
             "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
            ["-A", "FORWARD", "-i", HOST_INTERFACE, "-o", veth, "-j", "DROP"],
        ):  # fmt: skip
            gateway.run(["iptables", *rule])
        log.info("netlab host %s behind NAT at %s (router %s)", name, address, router)
        return host

    def __getitem__(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise UnknownHost(name, list(self.hosts)) from None

    def __enter__(self) -> Lab:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    def down(self) -> None:
        """Stop the lab's processes and remove everything it made (idempotent, never raises)."""
        if self._is_down:
            return
        self._is_down = True
        atexit.unregister(self.down)
        stop_processes(self._started)
        down_run(self.run_id)
        log.info("netlab down run=%s", self.run_id)


# --- processes ------------------------------------------------------------------------------


def stop_processes(processes: Iterable[subprocess.Popen[Any]]) -> None:
    """SIGTERM each live process (its group, if it leads one), SIGKILL after STOP_GRACE_S."""
    live = [process for process in processes if process.poll() is None]
    for process in live:
        _signal(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in live:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_GRACE_S)


def _signal(pid: int, signum: int) -> None:
    """Signal pid's process group when pid leads it (start_new_session), else pid alone."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def _netns_pids(netns: str) -> list[int]:
    try:
        return [int(pid) for pid in ip("netns", "pids", netns).split()]
    except (CommandFailed, ValueError):
        return []


def _kill_netns_processes(netns: str) -> None:
    """SIGTERM what runs in `netns` (only this lab starts things there), SIGKILL stragglers."""
    pids = _netns_pids(netns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = _netns_pids(netns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- owner records, leftovers, teardown -----------------------------------------------------


def _start_ticks(pid: int) -> int | None:
    """When live process `pid` started, in clock ticks since boot (tells a reused pid apart);
    None for no process or a zombie (a killed owner whose parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # fields[0] is the state, [19] the start time
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _write_owner(run_id: str, hosts: list[str]) -> None:
    STATE_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
    pid = os.getpid()
    record = {"pid": pid, "start_ticks": _start_ticks(pid), "hosts": hosts}
    (STATE_ROOT / f"{run_id}.json").write_text(json.dumps(record))


def owner_alive(run_id: str) -> bool:
    try:
        record = json.loads((STATE_ROOT / f"{run_id}.json").read_text())
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return _start_ticks(pid) == record.get("start_ticks")


def leftovers() -> dict[str, list[str]]:
    """Run id -> the namespaces, interfaces and owner records of that run found on this machine."""
    found: dict[str, list[str]] = {}
    netns = os.listdir(NETNS_ROOT) if NETNS_ROOT.is_dir() else []
    links = os.listdir("/sys/class/net")
    for name in [*netns, *links]:
        run_id = run_of(name)
        if run_id:
            found.setdefault(run_id, []).append(name)
    if STATE_ROOT.is_dir():
        for entry in STATE_ROOT.iterdir():
            run_id = entry.name.removesuffix(".json")
            if re.fullmatch(r"[0-9a-f]{6}", run_id):
                found.setdefault(run_id, []).append(str(entry))
    return found


def down_run(run_id: str) -> list[str]:
    """Remove every namespace, interface and record of run `run_id`; the names removed.

    Errors are logged, never raised: teardown goes on with the next item.
    """
    removed: list[str] = []
    names = leftovers().get(run_id, [])
    for netns in [name for name in names if name.startswith(f"{TAG}{run_id}-")]:
        _kill_netns_processes(netns)
        _quietly(removed, netns, "netns", "delete", netns)
    links = set(os.listdir("/sys/class/net"))
    for link in [name for name in names if name in links]:
        _quietly(removed, link, "link", "delete", link)
    workdir = STATE_ROOT / run_id
    if workdir.is_dir():
        shutil.rmtree(workdir, ignore_errors=True)
        removed.append(str(workdir))
    record = STATE_ROOT / f"{run_id}.json"
    if record.exists():
        record.unlink(missing_ok=True)
        removed.append(str(record))
    return removed


def _quietly(removed: list[str], name: str, *args: str) -> None:
    try:
        ip(*args)
        removed.append(name)
    except CommandFailed as exc:
        if name in os.listdir("/sys/class/net") or (NETNS_ROOT / name).exists():
            log.warning("netlab teardown: %s", exc.message)
        else:  # gone meanwhile (a veth goes with its namespace)
            removed.append(name)


def down_stale() -> list[str]:
    """Remove the leftovers of every run whose owner process is gone; their run ids."""
    stale = [run_id for run_id in leftovers() if not owner_alive(run_id)]
    for run_id in stale:
        down_run(run_id)
        log.info("netlab removed leftovers of run=%s", run_id)
    return stale


# --- can this process make hosts? -----------------------------------------------------------


def can_make_hosts() -> tuple[bool, str]:
    """Whether this process can make the lab's namespaces, veths and bridge, and if not why/how.

    It tries: a throw-away namespace with a veth pair and a bridge inside, deleted at once.
    """
    if sys.platform != "linux":
        return False, "network namespaces need Linux"
    if shutil.which("ip") is None:
        return False, "iproute2's `ip` is not installed (as root: apt-get install iproute2)"
    run_id = new_run_id()
    probe = netns_name(run_id, "probe")
    try:
        _write_owner(run_id, ["probe"])  # so that a concurrent down_stale() leaves it alone
    except OSError as exc:
        return False, f"cannot write {STATE_ROOT} ({exc.strerror}); {PRIVILEGE_HINT}"
    try:
        ip("netns", "add", probe)
        ip("link", "add", "probe0", "type", "veth", "peer", "name", "probe1", netns=probe)
        ip("link", "add", "probebr", "type", "bridge", netns=probe)
    except CommandFailed as exc:
        return False, f"`{' '.join(exc.argv)}` failed ({_last_line(exc.stderr)}); {PRIVILEGE_HINT}"
    finally:
        down_run(run_id)
    return True, "network namespaces, veth pairs and bridges can be made"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no output"
