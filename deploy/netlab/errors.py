"""The errors of the network lab, each with a message built from its fields and a `hint`.

    NetlabError                 root: .message, .hint (what to do), .code (stable name)
    ├── HostsUnavailable        network namespaces cannot be made here (privileges, no `ip`)
    ├── ToolMissing             a program the lab runs is not installed (toxiproxy-server, …)
    ├── CommandFailed           an `ip`/`setpriv` command exited non-zero: argv, status, stderr
    ├── ProxyApiError           toxiproxy's HTTP API refused a request or did not answer in time
    ├── MatrixError             a region latency matrix is malformed: line and reason
    ├── UnknownHost             a name that is not one of the lab's hosts
    └── UnknownRegion           a host placed in a region the latency matrix does not have

The package imports only the standard library, so these do not derive from `protocol.errors`;
an edge (the `planet` CLI) prints `error: <message>` and `hint: <hint>` for them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence


class NetlabError(Exception):
    """Root of the errors the network lab raises on purpose."""

    code = "netlab"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class HostsUnavailable(NetlabError):
    """This process cannot create network namespaces; `reason` says why, `hint` how to fix."""

    code = "netlab_hosts_unavailable"

    def __init__(self, reason: str, *, hint: str) -> None:
        super().__init__(f"cannot make network namespaces here: {reason}", hint=hint)
        self.reason = reason


class ToolMissing(NetlabError):
    code = "netlab_tool_missing"

    def __init__(self, tool: str, *, hint: str) -> None:
        super().__init__(f"{tool} not found", hint=hint)
        self.tool = tool


class CommandFailed(NetlabError):
    code = "netlab_command_failed"

    def __init__(self, argv: Sequence[str], status: int, stderr: str) -> None:
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
        super().__init__(f"`{' '.join(argv)}` exited with {status}: {detail}")
        self.argv = tuple(argv)
        self.status = status
        self.stderr = stderr


class ProxyApiError(NetlabError):
    code = "netlab_proxy_api"

    def __init__(self, host: str, request: str, detail: str) -> None:
        super().__init__(f"toxiproxy in host {host}: {request}: {detail}")
        self.host = host
        self.request = request
        self.detail = detail


class MatrixError(NetlabError):
    code = "netlab_matrix"

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"latency matrix line {line}: {reason}")
        self.line = line
        self.reason = reason


class UnknownHost(NetlabError):
    code = "netlab_unknown_host"

    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(f"no host named {name!r} (hosts: {', '.join(known) or 'none'})")
        self.name = name


class UnknownRegion(NetlabError):
    code = "netlab_unknown_region"

    def __init__(self, region: str, known: Sequence[str]) -> None:
        super().__init__(f"no region named {region!r} in the matrix (regions: {', '.join(known)})")
        self.region = region
