"""`planet gateway serve --relays FILE --overlay N,K,L` and `planet relay serve`: what a user
or a stranger's relays file can get wrong is one `error:` line (exit 2), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.client.overlay import read_relays
from planet.main import main
from protocol.errors import UsageError

pytestmark = pytest.mark.unit

KEY = "ab" * 32


@pytest.mark.parametrize(
    "shape", ["4,3", "4,x,3", "٤,3,3", "4,3,3,1", "4,5,3", "1,1,1", "17,3,3", "4,3,6", "", "4,,3"]
)
def test_a_bad_overlay_shape_is_a_usage_error(shape: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "serve", "--personal", "--relays", "r.txt", "--overlay", shape])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "N,K,L" in err or "need 2" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("http://198.51.100.1:9100\n", "expected"),
        (f"ftp://198.51.100.1:9100 {KEY}\n", "expected"),
        ("http://198.51.100.1:9100 zz\n", "expected"),
        (f"http://198.51.100.1:9100 {KEY[:-2]}\n", "expected"),
        (f"http://198.51.100.1:9100 {KEY} extra\n", "expected"),
        (f"http://198.51.100.1:9100 {KEY}\nhttp://198.51.100.1:9100/ {KEY}\n", "twice"),
        ("http://198.51.100.1:9100 " + "٣" * 64 + "\n", "expected"),
    ],
)
def test_a_bad_relays_file_is_named_with_its_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "relays.txt"
    path.write_text(text)
    with pytest.raises(UsageError, match=why):
        read_relays(path)


def test_a_relays_file_reads_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "relays.txt"
    path.write_text(f"# mine\n\nhttp://198.51.100.1:9100/ {KEY}  # first\n")
    [hop] = read_relays(path)
    assert hop.url == "http://198.51.100.1:9100" and hop.key == bytes.fromhex(KEY)
    with pytest.raises(UsageError, match="cannot read"):
        read_relays(tmp_path / "missing.txt")


def test_relays_on_a_hosted_gateway_are_refused(capsys) -> None:
    code = main(["gateway", "serve", "--relays", "r.txt"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: --relays, --overlay and --relays-refresh are a personal client's")
    assert "hint:" in err


def test_too_few_relays_for_the_shape_is_one_error_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "relays.txt"
    path.write_text(f"http://198.51.100.1:9100 {KEY}\n")
    code = main(["gateway", "serve", "--personal", "--relays", str(path), "--manifest", "m.json",
                 "--committee-rpc", "http://127.0.0.1:1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "distinct relays" in err and "Traceback" not in err
