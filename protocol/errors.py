"""The one error tree of Planet. Raise these; translate them only at the edges.

    PlanetError                  root: .code (stable snake_case name), .hint (what to do)
    ├── UsageError               the user asked for something impossible (bad flag, bad path)
    ├── ConfigError              a config file or env value is invalid
    ├── IntegrityError           bytes do not hash to what a manifest/registry says
    ├── ProtocolError            a peer sent something malformed (frames, txs, messages)
    ├── RemoteError              a peer answered with a JSON error {code, message}
    ├── UnavailableError         a peer or process is unreachable / not healthy in time
    └── BusyError                a peer refused work because it is at capacity

Edges: the CLI prints `error: <message>` and `hint: <hint>` and exits with `exit_status`;
HTTP handlers answer `{"code", "message"}` with `http_status`; the ABCI app maps to result codes.
Domain modules add typed subclasses next to their code (e.g. frame errors in
`protocol.frames.errors`), building the message from their fields.
"""

from __future__ import annotations


class PlanetError(Exception):
    """Root of all errors Planet raises on purpose."""

    code: str = "planet_error"
    http_status: int = 500
    exit_status: int = 1

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, str]:
        body = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        return body


class UsageError(PlanetError):
    code = "usage"
    http_status = 400
    exit_status = 2


class ConfigError(PlanetError):
    code = "config"
    http_status = 400
    exit_status = 2


class IntegrityError(PlanetError):
    code = "integrity"
    http_status = 409
    exit_status = 3


class ProtocolError(PlanetError):
    code = "protocol"
    http_status = 400
    exit_status = 4


class RemoteError(PlanetError):
    """A peer answered with an error body; `code` is the peer's code."""

    exit_status = 5

    def __init__(self, peer: str, code: str, message: str, *, http_status: int = 500) -> None:
        super().__init__(f"{peer}: {message} ({code})", code=code)
        self.peer = peer
        self.http_status = http_status


class UnavailableError(PlanetError):
    code = "unavailable"
    http_status = 503
    exit_status = 6


class BusyError(PlanetError):
    code = "busy"
    http_status = 503
    exit_status = 7
