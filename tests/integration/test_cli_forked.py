"""The `planet` CLI forked by the session's zygote (`node.procs.run_captured`, how the tests run
it) answers exactly as a fresh `python -m planet` process: the same stdout, stderr and exit
status for help, usage errors (2, `planet ...: error:`), PlanetErrors (one `error:` and one
`hint:` line, `--password-file -` taken for a file name, not stdin) and `-v` (the zygote's
logging is not inherited: the CLI's basicConfig applies).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node.procs import run_captured
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
