"""A local anvil (from the npm package @foundry-rs/anvil-linux-amd64) as a managed process.

`start_anvil(port)` launches `node_modules/.bin/anvil` bound to 127.0.0.1 with instant mining
(a block per transaction), waits until `eth_chainId` answers, and returns an `Anvil` handle
whose `stop()` (or context-manager exit) terminates it and reaps the process. Anvil's output
goes to a log file next to nothing else (a temp file unless `log_path` is given), so a full
pipe can never block it.

Anvil's first default account (mnemonic "test test … junk") is a well-known, public dev key:
it is the devnet deployer and must never hold real funds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from protocol.errors import ConfigError, UnavailableError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PORT = 8545
DEVNET_CHAIN_ID = 31337
# Anvil's account 0 for its default mnemonic: public knowledge, dev only.
ANVIL_DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
ANVIL_DEV_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"


def anvil_binary() -> Path:
    """The anvil from node_modules (PLANET_ANVIL overrides), or a ConfigError with a hint."""
    override = os.environ.get("PLANET_ANVIL")
    candidates = [Path(override)] if override else []
    candidates.append(REPO_ROOT / "node_modules" / ".bin" / "anvil")
    found = shutil.which("anvil")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(
        "anvil not found in node_modules/.bin",
        hint="run `bash deploy/setup.sh` (npm installs @foundry-rs/anvil-linux-amd64)",
    )


def rpc_call(url: str, method: str, params: list | None = None, timeout: float = 2.0) -> object:
    """One JSON-RPC call with the standard library (used before web3 is wired up)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if "error" in answer:
        raise UnavailableError(f"{url}: {method} failed: {answer['error']}")
    return answer.get("result")


def _port_is_answering(url: str) -> bool:
    try:
        rpc_call(url, "eth_chainId", timeout=0.5)
    except (urllib.error.URLError, OSError, ValueError, UnavailableError):
        return False
    return True


@dataclass
class Anvil:
    """A running anvil; `stop()` ends it (idempotent)."""

    process: subprocess.Popen[bytes]
    port: int
    chain_id: int
    log_path: Path

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)
        log.info("anvil stopped port=%d pid=%d", self.port, self.process.pid)

    def __enter__(self) -> Anvil:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_anvil(
    port: int = DEFAULT_PORT,
    *,
    chain_id: int = DEVNET_CHAIN_ID,
    accounts: int = 10,
    balance_ether: int = 10_000,
    log_path: Path | None = None,
    ready_timeout: float = 15.0,
) -> Anvil:
    """Start anvil on 127.0.0.1:`port` (instant mining) and wait until it answers."""
    url = f"http://127.0.0.1:{port}"
    if _port_is_answering(url):
        raise UnavailableError(
            f"port {port} already has an RPC server",
            hint="stop it or pick another port (--port)",
        )
    binary = anvil_binary()
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix=f"anvil-{port}-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    command = [
        str(binary),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--chain-id", str(chain_id),
        "--accounts", str(accounts),
        "--balance", str(balance_ether),
    ]  # fmt: skip
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    anvil = Anvil(process=process, port=port, chain_id=chain_id, log_path=log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise UnavailableError(
                f"anvil exited with status {process.returncode} on port {port}: {tail.strip()}",
                hint="is the port in use? see " + str(log_path),
            )
        if _port_is_answering(url):
            log.info("anvil ready port=%d pid=%d log=%s", port, process.pid, log_path)
            return anvil
        time.sleep(0.05)
    anvil.stop()
    raise UnavailableError(f"anvil did not answer on port {port} within {ready_timeout} s")
