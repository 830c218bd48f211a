"""The `planet` CLI forked by the session's zygote (`node.procs.run_captured`, how the tests run
it) answers exactly as a fresh `python -m planet` process: the same stdout, stderr and exit
status for help, usage errors (2, `planet ...: error:`), PlanetErrors (one `error:` and one
`hint:` line, `--password-file -` taken for a file name, not stdin) and `-v` (the zygote's
logging is not inherited: the CLI's basicConfig applies). A service forked with a pipe
(`node.procs.spawn_piped`, how the tests start a relay) prints and ends as a Popen'd one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.ports import ephemeral_port
from node.procs import run_captured, spawn_piped
from node.zygote import ENV_VAR

pytestmark = pytest.mark.integration

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback
COMMANDS = [
    ["--help"],
    ["stake", "--help"],
    ["stake", "--bogus"],
    ["frobnicate"],
    ["stake", "--role", "compute", "--amount", "1", "--password-file", "-"],
    ["ask", "hello", "--nodes", "/nonexistent/nodes.json"],
    ["-v", "status", "--evm-rpc", UNREACHABLE, "--committee-rpc", UNREACHABLE],
    ["local", "status", "--json"],
]
STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+")


@pytest.fixture
def env(tmp_path: Path, _zygote: Path | None) -> dict[str, str]:
    if _zygote is None:
        pytest.skip("no zygote in this session (PLANET_TEST_ZYGOTE=0, or it did not start)")
    return {**os.environ, "PLANET_HOME": str(tmp_path), "NO_COLOR": "1"}


def _fresh(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    fresh_env = {k: v for k, v in env.items() if k != ENV_VAR}
    return subprocess.run(argv, capture_output=True, text=True, env=fresh_env, timeout=120)


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_cli_forked_answers_as_a_fresh_process(args: list[str], env: dict[str, str]) -> None:
    argv = [sys.executable, "-m", "planet", *args]
    forked = run_captured(argv, env=env, text=True, timeout=120)
    fresh = _fresh(argv, env)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    assert STAMP.sub("T", forked.stderr) == STAMP.sub("T", fresh.stderr)
    if forked.returncode == 2 and "usage:" in forked.stderr:
        assert re.search(r"^planet( \w+)?: error: ", forked.stderr, re.M)


def test_cli_forked_was_forked_by_the_zygote(env: dict[str, str]) -> None:
    """The comparison above compares something: the CLI ran as the zygote's child."""
    code = "import os; print(os.getppid())"
    probe = run_captured([sys.executable, "-c", code], env=env, text=True, timeout=60)
    assert int(probe.stdout) == os.getpid()  # not `-m`: a plain subprocess
    zygote = Path(env[ENV_VAR]).parent / "zygote.log"
    before = zygote.read_text().count("forked ")
    run_captured([sys.executable, "-m", "planet", "--help"], env=env, timeout=60)
    assert zygote.read_text().count("forked ") == before + 1


def _relay_lines(start: Callable[..., Any], home: Path, env: dict[str, str]) -> tuple[str, int]:
    """`planet relay serve` started by `start` (spawn_piped or Popen): its first line, read
    through the pipe once it listens, masked; its status after SIGTERM, once stdout ended."""
    home.mkdir()
    argv = [sys.executable, "-m", "planet", "relay", "serve", "--home", str(home), "--port",
            str(ephemeral_port()), "--allow-private-next-hops", "--no-register"]  # fmt: skip
    with (home / "relay.log").open("w") as log:
        relay = start(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    with relay:
        line = relay.stdout.readline()
        relay.terminate()
        assert relay.stdout.read() == ""  # EOF once it ended
        status = relay.wait(timeout=60)
    return re.sub(r":\d+ key [0-9a-f]{64}$", ":PORT key KEY", line.rstrip("\n")), status


def test_relay_forked_with_a_pipe_prints_and_ends_as_a_fresh_process(
    env: dict[str, str], tmp_path: Path
) -> None:
    zygote = Path(env[ENV_VAR]).parent / "zygote.log"
    before = zygote.read_text().count("forked ")
    forked = _relay_lines(spawn_piped, tmp_path / "forked", env)
    assert zygote.read_text().count("forked ") == before + 1  # it was the zygote's child
    fresh_env = {k: v for k, v in env.items() if k != ENV_VAR}
    fresh = _relay_lines(subprocess.Popen, tmp_path / "fresh", fresh_env)
    assert forked == fresh
    assert forked[0] == "relay on http://127.0.0.1:PORT key KEY"
