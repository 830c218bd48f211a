"""`planet gateway serve --personal` as its own process, for tests: started, waited for until
`/health` answers (with its token), stopped.

    with personal_client(manifest, committee_rpc, min_positions=8, env=env, log_path=p) as client:
        openai.OpenAI(base_url=client.base_url, api_key=client.token)

The client answers nothing without its bearer token (node/gateway/personal_token.py): it is
read from the token file the client writes at start (`token_file`, default next to the log).
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.ports import ephemeral_port
from node.procs import spawn_process


@dataclass(frozen=True, slots=True)
class PersonalClient:
    port: int
    token: str  # its bearer token: every request's `Authorization: Bearer <token>`
    token_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@contextmanager
def personal_client(
    manifest: Path | str,
    committee_rpc: str,
    *,
    min_positions: int,
    env: Mapping[str, str],
    log_path: Path,
    credits_file: Path | None = None,
    route: str | None = None,
    token_file: Path | None = None,
    port: int | None = None,
    timeout_s: float = 180.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[PersonalClient]:
    """The personal client paying from `credits_file` (default: $PLANET_HOME's), serving on
    `port` (default: a free loopback port) with its token in `token_file` (default:
    `<log_path>.token`; drawn at its first start, reused after); yields its port and token.
    Raises AssertionError with the log's tail if it exits or does not answer within
    `timeout_s`; when the body fails, the log's tail (INFO and up) goes to stderr, which pytest
    shows with the failure."""
    port = port if port is not None else ephemeral_port()
    # -v: its INFO lines (circuits, payments, refusals) in the log, for whoever reads a failure
    command = [sys.executable, "-m", "planet", "-v", "gateway", "serve", "--personal"]
    command += ["--manifest", str(manifest), "--committee-rpc", committee_rpc]
    command += ["--port", str(port), "--min-credit-positions", str(min_positions)]
    command += ["--private-endpoints"]
    command += ["--credits-file", str(credits_file)] if credits_file is not None else []
    command += ["--route", route] if route is not None else []  # None: the default (private)
    token_file = token_file or log_path.with_suffix(".token")
    command += ["--token-file", str(token_file), *extra_args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        client = spawn_process(command, log.fileno(), env=env, new_session=False)
    try:
        deadline = time.monotonic() + timeout_s
        token = ""
        while True:
            assert client.poll() is None, log_path.read_text()[-3000:]
            try:  # the client writes its token before it listens
                token = token or token_file.read_text().strip()
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {token}"}
                )
                with urllib.request.urlopen(request, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                "the personal client did not come up\n" + (log_path.read_text()[-3000:])
            )
            time.sleep(0.5)
        try:
            yield PersonalClient(port, token, token_file)
        except BaseException:  # the test failed while it ran: show what the client said
            print(
                f"personal client log {log_path}:\n{log_path.read_text()[-4000:]}", file=sys.stderr
            )
            raise
    finally:
        client.terminate()
        client.wait(timeout=30)
