"""`planet ask --relays chain|FILE --overlay N,K,L` (issue 43): the personal client's flags with
the same meaning and defaults; what a user can get wrong is one `error:` line and a `hint:` line,
never a traceback; relays that cannot be reached stop the question before any node is reached,
and nothing falls back to a direct link."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.ports import ephemeral_port
from node.cli.overlay_args import CHAIN_RELAYS, DEFAULT_SHAPE
from node.client.nodesfile import NodeRef, NodesFile
from node.client.overlay import DEFAULT_LENGTH, DEFAULT_NEEDED, DEFAULT_PATHS
from node.model.prepare import prepare
from planet.main import build_parser, main
from protocol.errors import UnavailableError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

KEY = "ab" * 32


def _args(*extra: str):
    return build_parser().parse_args(["ask", "hi", *extra])


def test_the_flags_parse_as_the_personal_clients() -> None:
    args = _args("--relays", "relays.txt", "--overlay", "4,3,2")
    assert args.relays == Path("relays.txt") and args.overlay == (4, 3, 2)
    assert _args("--relays", "chain").relays == CHAIN_RELAYS
    assert _args("--relays", "./chain").relays == Path("chain")  # a file named chain
    plain = _args()
    assert plain.relays is None and plain.overlay is None  # direct unless asked
    personal = build_parser().parse_args(
        ["gateway", "serve", "--personal", "--relays", "relays.txt", "--overlay", "4,3,2"]
    )
    assert (personal.relays, personal.overlay) == (args.relays, args.overlay)
    assert DEFAULT_SHAPE == (DEFAULT_PATHS, DEFAULT_NEEDED, DEFAULT_LENGTH)  # the seed's


@pytest.mark.parametrize("shape", ["4,3", "4,x,3", "٤,3,3", "4,5,3", "1,1,1", "17,3,3", "4,3,6"])
def test_a_bad_overlay_shape_is_a_usage_error(shape: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["ask", "hi", "--relays", "r.txt", "--overlay", shape])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert ("N,K,L" in err or "need 2" in err) and "Traceback" not in err


def _error(capsys, argv: list[str]) -> list[str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[-1].startswith("hint: "), err
    return lines


@pytest.mark.parametrize("pay", ["--pay", "--voucher"])
def test_relays_with_a_hosted_gateway_are_refused_and_say_what_the_gateway_sees(
    pay: str, capsys
) -> None:
    lines = _error(capsys, ["ask", "hi", pay, "--relays", "relays.txt"])
    assert "gateway" in lines[0]
    assert "the gateway sees your address" in lines[-1]


def test_overlay_without_relays_and_plaintext_links_with_relays_are_refused(capsys) -> None:
    assert (
        "--overlay shapes the paths of --relays"
        in _error(capsys, ["ask", "hi", "--overlay", "4,3,3"])[0]
    )
    assert (
        "--plaintext-links"
        in _error(capsys, ["ask", "hi", "--relays", "r.txt", "--plaintext-links"])[0]
    )


def test_a_bad_relays_file_is_named_before_anything_else(tmp_path: Path, capsys) -> None:
    path = tmp_path / "relays.txt"
    path.write_text("http://198.51.100.1:9100 zz\n")
    lines = _error(capsys, ["ask", "hi", "--relays", str(path), "--nodes", str(tmp_path / "none")])
    assert f"{path}:1" in lines[0]


def test_too_few_relays_for_the_paths_is_one_error_line(tmp_path: Path, capsys) -> None:
    relays = tmp_path / "relays.txt"
    relays.write_text(f"http://198.51.100.1:9100 {KEY}\nhttp://198.51.100.2:9100 {KEY}\n")
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")  # never read: the relays are checked first
    nodes = tmp_path / "nodes.json"
    NodesFile(manifest, (NodeRef("http://127.0.0.1:1", 0, (0, 2)),)).save(nodes)
    lines = _error(capsys, ["ask", "hi", "--nodes", str(nodes), "--relays", str(relays)])
    assert "4 paths of 3 relays need 12 distinct relays, 2 known" in lines[0]  # the defaults
    lines = _error(
        capsys,
        ["ask", "hi", "--nodes", str(nodes), "--relays", str(relays), "--overlay", "3,2,1"],
    )
    assert "3 paths of 1 relays need 3 distinct relays, 2 known" in lines[0]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ask-relays")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    return Path(prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None))


@pytest.fixture
def listening_nodes() -> Iterator[list[socket.socket]]:
    """Two listening sockets standing for the nodes: a connection to one stays pending."""
    sockets = []
    try:
        for _ in range(2):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
            sock.setblocking(False)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _reached(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def test_unreachable_relays_stop_the_question_and_no_node_is_reached(
    manifest: Path, listening_nodes: list[socket.socket], tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("PLANET_HOME", str(tmp_path / "home"))
    shards = json.loads(manifest.read_text())["shards"]
    refs = tuple(
        NodeRef(f"http://127.0.0.1:{sock.getsockname()[1]}", i, tuple(shards[i]["layers"]))
        for i, sock in enumerate(listening_nodes)
    )
    nodes = tmp_path / "nodes.json"
    NodesFile(manifest, refs).save(nodes)
    relays = tmp_path / "relays.txt"  # nothing listens on their ports
    relays.write_text("".join(f"http://127.0.0.1:{ephemeral_port()} {KEY}\n" for _ in range(4)))
    argv = ["ask", "hi", "--nodes", str(nodes), "--relays", str(relays), "--overlay", "4,3,1"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == UnavailableError.exit_status and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "did not answer /info over the relays" in errors[0], err
    assert "overlay paths" in errors[0] and "\nhint: " in err
    assert not any(_reached(sock) for sock in listening_nodes)  # never a direct fallback
