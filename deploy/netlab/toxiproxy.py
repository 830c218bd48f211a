"""Toxiproxy (Shopify's TCP proxy with injected faults) as one process per host, and its HTTP API.

One `toxiproxy-server` runs inside each host's namespace under the reserved uid PROXY_UID (the
routing rules of `links` send that uid's connections to the wire and everyone else's to the
proxies), with its API on 127.0.0.1:API_PORT of that namespace. This process reaches the API with
a socket made inside the namespace (`Host.connect`), so nothing listens outside the lab.

The API calls used (toxiproxy v2): GET /version; POST /populate (create proxies);
PATCH /proxies/{name} (enable, disable); POST /proxies/{name}/toxics (add a toxic);
PATCH and DELETE /proxies/{name}/toxics/{toxic}.

The binary: $PLANET_TOXIPROXY, else .tools/bin/toxiproxy-server (deploy/setup.sh builds VERSION
there), else `toxiproxy-server` on PATH. It must be executable by PROXY_UID.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.netlab.errors import NetlabError, ProxyApiError, ToolMissing
from deploy.netlab.hosts import Host, run_command

VERSION = "v2.12.0"  # what deploy/setup.sh builds
PROXY_UID = 64_700  # reserved for the proxies: no other process of a lab may run as it
API_PORT = 8474
API_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = (
    "run `bash deploy/setup.sh` (it builds toxiproxy-server into .tools/bin with Go), or set "
    "PLANET_TOXIPROXY to a toxiproxy-server binary"
)


def toxiproxy_binary() -> Path:
    """The toxiproxy-server to run, or ToolMissing with a hint."""
    override = os.environ.get("PLANET_TOXIPROXY")
    candidates = [Path(override)] if override else []
    candidates.append(REPO_ROOT / ".tools" / "bin" / "toxiproxy-server")
    found = shutil.which("toxiproxy-server")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ToolMissing("toxiproxy-server", hint=INSTALL_HINT)


def can_run_proxies() -> tuple[bool, str]:
    """Whether toxiproxy-server is installed and this process can start it as PROXY_UID."""
    try:
        binary = toxiproxy_binary()
    except ToolMissing as exc:
        return False, f"{exc.message}: {exc.hint}"
    try:
        run_command([*_as_proxy_uid(), str(binary), "-version"], timeout=10.0)
    except NetlabError as exc:  # CommandFailed, or setpriv missing
        return False, (
            f"cannot run {binary} as uid {PROXY_UID} ({exc.message}): the proxies need root "
            "(setpriv to another uid) and a binary that others may read and execute"
        )
    return True, f"{binary} runs as uid {PROXY_UID}"


def _as_proxy_uid() -> list[str]:
    return ["setpriv", f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups"]


@dataclass(frozen=True)
class Toxic:
    """One toxic of one proxy. stream: "upstream" (dialer -> target) or "downstream"."""

    name: str
    kind: str  # toxiproxy's toxic type: "latency", "bandwidth"
    stream: str
    attributes: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.kind,
            "stream": self.stream,
            "toxicity": 1.0,
            "attributes": dict(self.attributes),
        }


class ToxiproxyApi:
    """The API of the toxiproxy inside one host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def request(self, method: str, path: str, body: object = None) -> Any:
        """One API call; the decoded JSON answer, or ProxyApiError."""
        what = f"{method} {path}"
        connection = http.client.HTTPConnection("127.0.0.1", API_PORT, timeout=API_TIMEOUT_S)
        try:
            connection.sock = self.host.connect("127.0.0.1", API_PORT, timeout=API_TIMEOUT_S)
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, body=payload, headers=_HEADERS)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ProxyApiError(self.host.name, what, str(exc) or type(exc).__name__) from exc
        finally:
            connection.close()
        if response.status >= 300:
            detail = data.decode(errors="replace")[:300]
            raise ProxyApiError(self.host.name, what, f"HTTP {response.status}: {detail}")
        return json.loads(data) if data else None

    def version(self) -> str:
        return str(self.request("GET", "/version"))

    def create_proxies(self, proxies: Iterable[tuple[str, str, str]]) -> None:
        """Create (name, listen "addr:port", upstream "addr:port") proxies, enabled."""
        body = [
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True}
            for name, listen, upstream in proxies
        ]
        if body:
            self.request("POST", "/populate", body)

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self.request("PATCH", f"/proxies/{proxy}", {"enabled": enabled})

    def add_toxic(self, proxy: str, toxic: Toxic) -> None:
        self.request("POST", f"/proxies/{proxy}/toxics", toxic.to_json())

    def update_toxic(self, proxy: str, toxic: Toxic) -> None:
        body = {"attributes": dict(toxic.attributes), "toxicity": 1.0}
        self.request("PATCH", f"/proxies/{proxy}/toxics/{toxic.name}", body)

    def remove_toxic(self, proxy: str, name: str) -> None:
        self.request("DELETE", f"/proxies/{proxy}/toxics/{name}")


_HEADERS = {"Content-Type": "application/json", "User-Agent": "planet-netlab"}


def start_toxiproxy(host: Host, log_path: Path) -> tuple[subprocess.Popen[Any], ToxiproxyApi]:
    """Start toxiproxy-server in `host` as PROXY_UID; it and its API once /version answers."""
    binary = toxiproxy_binary()
    argv = [*_as_proxy_uid(), str(binary), "-host", "127.0.0.1", "-port", str(API_PORT)]
    with log_path.open("ab") as log_file:
        process = host.popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LOG_LEVEL": "warn"},
        )
    api = ToxiproxyApi(host)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        status = process.poll()
        if status is not None:
            tail = log_path.read_text(errors="replace")[-500:].strip() or "no output"
            detail = f"toxiproxy-server exited with {status}: {tail}"
            raise ProxyApiError(host.name, "start", detail)
        try:
            api.version()
            return process, api
        except ProxyApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
