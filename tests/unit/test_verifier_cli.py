"""`planet verifier serve` refuses user mistakes with error + hint lines (exit 2), no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from planet import main as cli

pytestmark = pytest.mark.unit


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "validator"
    (home / "config").mkdir(parents=True)
    (home / "config" / "priv_validator_key.json").write_text("{}")
    return home


def _args(
    home: Path,
    *extra: str,
    manifest: str = "m.json",
    asks: tuple[str, ...] = ("--gateway", "http://127.0.0.1:1"),
) -> list[str]:
    return [
        "verifier", "serve", "--home", str(home), "--manifest", manifest,
        *asks, "--deployment", manifest, "--wallet", "w.json", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no-home", "is not a validator home"),
        ("no-manifest", "no manifest at"),
        ("negative-challenges", "--challenges-per-epoch must be at least 0"),
        ("zero-challenges-sampled", "--challenges-per-epoch 0 leaves no prompts"),
        ("missing-operator-key", "no operator key at"),
        ("personal-client-not-a-url", "--personal-client must be an http(s) URL"),
        ("personal-token-missing", "no personal client token at"),
        ("personal-token-open", "is open to others"),
        ("personal-token-for-a-gateway", "--personal-token-file goes with --personal-client"),
        ("findings-listen-no-port", "--findings-listen must be HOST:PORT"),
        ("findings-listen-anywhere", "names no address peers can reach"),
        ("findings-url-alone", "--findings-url needs --findings-listen"),
        ("findings-url-bad", "--findings-url:"),
        ("private-peers-bad", "--private-peers: 'lan' is not an address range"),
        ("negative-threads", "--threads must be 0 … 256"),
        ("hop-probes-negative", "nodes timed per epoch must be 0 … 64"),
        ("hop-positions-too-few", "sessions × positions must be at least 8"),
        ("credits-missing", "no credit wallet at"),
    ],
)
def test_verifier_cli_mistakes_are_one_error_and_a_hint(
    tmp_path: Path, capsys, case: str, message: str
) -> None:
    home = _home(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text("{}")
    m = str(manifest)
    personal = ("--personal-client", "http://127.0.0.1:8001")
    open_token = tmp_path / "token"
    open_token.write_text("planet-personal-" + "a" * 43)
    open_token.chmod(0o644)
    argv = {
        "no-home": _args(tmp_path / "nothing", manifest=str(manifest)),
        "no-manifest": _args(home, manifest=str(tmp_path / "absent.json")),
        "negative-challenges": _args(home, "--challenges-per-epoch", "-1", manifest=m),
        # 0 challenges: spot checks only, which needs --sampled-per-epoch 0 too
        "zero-challenges-sampled": _args(home, "--challenges-per-epoch", "0", manifest=m),
        "missing-operator-key": _args(
            home, "--operator-key", str(tmp_path / "k.json"), manifest=str(manifest)
        ),
        "personal-client-not-a-url": _args(
            home, manifest=str(manifest), asks=("--personal-client", "127.0.0.1:8001")
        ),
        "personal-token-missing": _args(
            home, "--personal-token-file", str(tmp_path / "none"), manifest=m, asks=personal
        ),
        "personal-token-open": _args(
            home, "--personal-token-file", str(open_token), manifest=m, asks=personal
        ),
        "personal-token-for-a-gateway": _args(home, "--personal-token-file", "t", manifest=m),
        "findings-listen-no-port": _args(home, "--findings-listen", "127.0.0.1", manifest=m),
        "findings-listen-anywhere": _args(home, "--findings-listen", "0.0.0.0:8700", manifest=m),
        "findings-url-alone": _args(home, "--findings-url", "http://1.2.3.4:1", manifest=m),
        "findings-url-bad": _args(
            home, "--findings-listen", "0.0.0.0:8700", "--findings-url", "http://x/y", manifest=m
        ),
        "private-peers-bad": _args(home, "--private-peers", "lan", manifest=m),
        "negative-threads": _args(home, "--threads", "-1", manifest=m),
        "hop-probes-negative": _args(home, "--hop-probes-per-epoch", "-1", manifest=m),
        "hop-positions-too-few": _args(
            home, "--hop-sessions", "1", "--hop-positions", "4", manifest=m
        ),
        "credits-missing": _args(home, "--credits", str(tmp_path / "none.json"), manifest=m),
    }[case]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and message in err and "hint:" in err and "Traceback" not in err


def test_verifier_cli_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["verifier", "serve", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--challenges-per-epoch" in out


def test_verifier_cli_asks_through_one_gateway_or_a_personal_client_not_both(capsys) -> None:
    both = ("--gateway", "http://127.0.0.1:1", "--personal-client", "http://127.0.0.1:2")
    for asks in ((), both):
        with pytest.raises(SystemExit) as exited:
            cli.main(_args(Path("/nonexistent"), asks=asks))
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "--gateway" in err and "--personal-client" in err and "Traceback" not in err


@pytest.mark.parametrize(("given", "expected"), [("3", 3), (None, None)])
def test_verifier_serve_sets_torch_threads_before_the_service_starts(
    tmp_path: Path, monkeypatch, given: str | None, expected: int | None
) -> None:
    """`--threads N` (default 0: a node's default, half the cores, 1 to 4) is torch's thread
    count when the service starts: torch's own default (every core) made each reference pass
    wait on descheduled threads where the verifier shares its cores (issue 41)."""
    import torch

    from node.cli import verifier
    from node.server.run import default_torch_threads

    home = _home(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text("{}")
    password = tmp_path / "password"
    password.write_text("pw")
    seen: list[int] = []

    def service(run, *, log_level, log) -> int:  # the service itself is not started
        seen.append(torch.get_num_threads())
        return 0

    monkeypatch.setattr(verifier, "run_service", service)
    threads = ["--threads", given] if given is not None else []
    before = torch.get_num_threads()
    try:
        argv = _args(home, "--password-file", str(password), *threads, manifest=str(manifest))
        assert cli.main(argv) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [expected if expected is not None else default_torch_threads()]
