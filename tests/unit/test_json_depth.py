"""Deeply nested JSON from a peer is a named rejection, even in a process that imported web3.

web3 raises the interpreter's recursion limit to 100,000 at import, so a plain `json.loads` of
100,000 nested brackets overflows the C stack (the process dies with SIGSEGV) instead of raising
RecursionError. Every parser of untrusted JSON goes through a depth check first; each case below
runs in its own interpreter so a crash is seen as a crash.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from protocol.canonical import JsonTooDeepError, loads_bounded

pytestmark = pytest.mark.unit

DEEP = "[" * 200_000 + "]" * 200_000

# (name, code run after `import web3` with DEEP bound; must print "rejected")
CASES = [
    (
        "loads_bounded",
        """
        from protocol.canonical import JsonTooDeepError, loads_bounded
        try:
            loads_bounded(DEEP)
        except JsonTooDeepError:
            print("rejected")
        """,
    ),
    (
        "nodes file",
        """
        import pathlib, tempfile
        from protocol.errors import ConfigError
        from node.client.nodesfile import NodesFile
        path = pathlib.Path(tempfile.mkdtemp()) / "nodes.json"
        path.write_text(DEEP)
        try:
            NodesFile.load(path)
        except ConfigError:
            print("rejected")
        """,
    ),
    (
        "node error body",
        """
        from node.client.answers import parse_error_body
        if parse_error_body(DEEP.encode()) == ("http_error", ""):
            print("rejected")
        """,
    ),
    (
        "gateway request body",
        """
        from node.gateway.requests import parse_body
        from protocol.errors import PlanetError
        try:
            parse_body(DEEP.encode())
        except PlanetError as error:
            print("rejected")
        """,
    ),
    (
        "gateway stream events",
        """
        from node.gateway.sse import parse_events
        try:
            parse_events(b"data: " + DEEP.encode() + b"\\n\\n")
        except ValueError:
            print("rejected")
        """,
    ),
]


def test_web3_import_really_raises_the_recursion_limit() -> None:
    """The premise of this module: if web3 stops doing this, the cases still must pass."""
    code = "import sys, web3; print(sys.getrecursionlimit())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) >= 1000


@pytest.mark.parametrize(("name", "body"), CASES, ids=[name for name, _ in CASES])
def test_deep_json_is_rejected_not_a_crash(name: str, body: str) -> None:
    code = "import web3\nDEEP = " + repr(DEEP[:0]) + " + '[' * 200000 + ']' * 200000\n"
    code += textwrap.dedent(body)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}"
    assert result.stdout.strip().endswith("rejected"), result.stdout + result.stderr[-2000:]


def test_loads_bounded_keeps_json_semantics_within_the_limit() -> None:
    assert loads_bounded('{"temperature": 0.5, "a": [[1]]}') == {"temperature": 0.5, "a": [[1]]}
    assert loads_bounded(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(JsonTooDeepError):
        loads_bounded("[" * 65 + "]" * 65)
    with pytest.raises(ValueError):
        loads_bounded("{not json")
