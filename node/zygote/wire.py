"""The zygote's messages: a 4-byte big-endian length and a JSON object, the request carrying
the child's standard streams as SCM_RIGHTS file descriptors: one (stdout and stderr, its log;
stdin /dev/null) for a service, three (stdin, stdout, stderr) for a command whose output the
caller captures (`stdio`).

Client → zygote: `{"op": "ping"}` or `{"op": "spawn", ...}` (the fields of `SpawnRequest`).
Zygote → client: `{"ready": true}`; or `{"pid": N}` then, once reaped, `{"exit": RC}`; or
`{"refused": REASON}`. `parse_spawn` turns a request into a `SpawnRequest` or raises
`BadRequest`.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

from node.zygote.netns import valid_name

MAX_MESSAGE = 1 << 20  # a request is argv + env: a few KiB
NAMESPACES = ("net", "mnt", "pid", "user", "uts", "ipc")
STDIO_FDS = {"log": 1, "pipes": 3}  # how many fds a request of each `stdio` kind carries


class BadRequest(ValueError):
    """A message that is not what the zygote's protocol allows; `field` names the culprit."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"bad zygote request: {field}: {why}")
        self.field = field


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    argv: tuple[str, ...]  # [python, "-m", module, args...]
    env: dict[str, str]  # the child's whole environment
    cwd: str  # absolute
    new_session: bool  # setsid, as Popen's start_new_session
    umask: int
    ignored_signals: tuple[int, ...]  # SIG_IGN in the caller: stays ignored, as across exec
    namespaces: dict[str, str]  # name -> /proc/self/ns/NAME link of the caller
    cgroups: str  # the caller's /proc/self/cgroup: the child joins its groups
    stdio: str = "log"  # "log": one fd for stdout+stderr; "pipes": stdin, stdout, stderr
    netns: str | None = None  # `ip netns exec NETNS ...`: the child joins it (node.zygote.netns)
    caller: int = 0  # the caller's pid (SO_PEERCRED, set by the zygote; never from the message)

    @property
    def module(self) -> str:
        return self.argv[2]


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(field, "not a list of strings")
    return tuple(value)


def parse_spawn(message: dict[str, Any]) -> SpawnRequest:
    argv = _strings(message.get("argv"), "argv")
    if len(argv) < 3 or argv[1] != "-m" or not all(p.isidentifier() for p in argv[2].split(".")):
        raise BadRequest("argv", "not `python -m MODULE ...`")
    env = message.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise BadRequest("env", "not a mapping of strings")
    if any("\0" in a for a in argv):
        raise BadRequest("argv", "NUL in an argument")
    cwd = message.get("cwd")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise BadRequest("cwd", "not an absolute path")
    new_session, umask = message.get("new_session"), message.get("umask")
    if not isinstance(new_session, bool):
        raise BadRequest("new_session", "not a boolean")
    if not isinstance(umask, int) or isinstance(umask, bool) or not 0 <= umask <= 0o777:
        raise BadRequest("umask", "not a mode")
    ignored = message.get("ignored_signals")
    if not isinstance(ignored, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 < s < 65 for s in ignored
    ):
        raise BadRequest("ignored_signals", "not a list of signal numbers")
    namespaces = message.get("namespaces")
    if not isinstance(namespaces, dict) or set(namespaces) != set(NAMESPACES):
        raise BadRequest("namespaces", f"not one link for each of {NAMESPACES}")
    if not all(isinstance(v, str) for v in namespaces.values()):
        raise BadRequest("namespaces", "not strings")
    cgroups = message.get("cgroups")
    if not isinstance(cgroups, str):
        raise BadRequest("cgroups", "not a string")
    stdio = message.get("stdio", "log")
    if stdio not in STDIO_FDS:
        raise BadRequest("stdio", f"not one of {sorted(STDIO_FDS)}")
    netns = message.get("netns")
    if netns is not None and not (isinstance(netns, str) and valid_name(netns)):
        raise BadRequest("netns", "not a network namespace's name")
    return SpawnRequest(
        argv, dict(env), cwd, new_session, umask, tuple(ignored), dict(namespaces), cgroups, stdio,
        netns,
    )  # fmt: skip


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = encode(message)
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def _exactly(sock: socket.socket, count: int, head: bytes = b"") -> bytes | None:
    data = head
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def receive(sock: socket.socket, *, max_fds: int = 0) -> tuple[dict[str, Any], list[int]] | None:
    """One message (and the fds that came with it); None at a clean end of the stream."""
    fds: list[int] = []
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, 4, max_fds)
    else:
        head = sock.recv(4)
    if not head:
        return None
    head = _exactly(sock, 4, head)
    if head is None:
        raise BadRequest("length", "stream ended inside the length")
    (length,) = struct.unpack(">I", head)
    if length > MAX_MESSAGE:
        raise BadRequest("length", f"{length} bytes is over {MAX_MESSAGE}")
    body = _exactly(sock, length)
    if body is None:
        raise BadRequest("body", "stream ended inside the message")
    try:
        message = json.loads(body)
    except ValueError as error:
        raise BadRequest("body", f"not JSON ({error})") from None
    if not isinstance(message, dict):
        raise BadRequest("body", "not an object")
    return message, fds
