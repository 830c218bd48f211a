"""`planet gateway serve` resolves its chains like every operator command: flags > env >
$PLANET_HOME/config.toml > defaults, with the same URL checks (named error, no traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planet.main import main

pytestmark = pytest.mark.unit


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Runs the CLI up to the point where it would serve; records the config it would use."""
    seen: dict[str, Any] = {}

    def fake_serve(config: Any, password: str) -> None:
        seen.update(config=config, password=password)

    import node.gateway.run

    monkeypatch.setattr(node.gateway.run, "serve", fake_serve)
    for name in (
        "PLANET_EVM_RPC",
        "PLANET_COMMITTEE_RPC",
        "PLANET_PASSWORD_FILE",
        "PLANET_REFUND_MARGIN_S",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLANET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PLANET_PASSWORD", "pw")
    (tmp_path / "home").mkdir()
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "deployment.json").write_text("{}")
    seen["argv"] = [
        "gateway", "serve",
        "--manifest", str(tmp_path / "manifest.json"),
        "--deployment", str(tmp_path / "deployment.json"),
        "--wallet", str(tmp_path / "wallet.json"),
    ]  # fmt: skip
    seen["home"] = tmp_path / "home"
    return seen


def test_gateway_serve_reads_rpcs_from_config_file_then_env_then_flags(
    served: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (served["home"] / "config.toml").write_text(
        'evm_rpc = "http://10.0.0.5:8545"\ncommittee_rpc = "http://10.0.0.6:26657"\n'
    )
    assert main(served["argv"]) == 0
    assert served["config"].evm_rpc == "http://10.0.0.5:8545"
    assert served["config"].committee_rpc == "http://10.0.0.6:26657"
    monkeypatch.setenv("PLANET_EVM_RPC", "http://127.0.0.1:9545")
    assert main(served["argv"]) == 0
    assert served["config"].evm_rpc == "http://127.0.0.1:9545"
    assert main([*served["argv"], "--evm-rpc", "http://127.0.0.1:7545"]) == 0
    assert served["config"].evm_rpc == "http://127.0.0.1:7545"
    assert served["password"] == "pw"


def test_gateway_serve_bad_rpc_url_is_named_error_without_traceback(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*served["argv"], "--committee-rpc", "ftp://\u0661"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --committee-rpc:") and "Traceback" not in err
    assert "config" not in served


def test_gateway_serve_refund_margin_from_defaults_file_env_then_flag(
    served: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(served["argv"]) == 0
    assert served["config"].refund_margin_s is None  # derived from the timeline at start
    (served["home"] / "config.toml").write_text("refund_margin_s = 600\n")
    assert main(served["argv"]) == 0
    assert served["config"].refund_margin_s == 600
    monkeypatch.setenv("PLANET_REFUND_MARGIN_S", "900")
    assert main(served["argv"]) == 0
    assert served["config"].refund_margin_s == 900
    assert main([*served["argv"], "--refund-margin-s", "30"]) == 0
    assert served["config"].refund_margin_s == 30


@pytest.mark.parametrize("value", ["-1", "2592001"])
def test_gateway_serve_bad_refund_margin_is_named_error_without_traceback(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert main([*served["argv"], "--refund-margin-s", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --refund-margin-s:") and "hint:" in err
    assert "Traceback" not in err and "config" not in served


def test_gateway_serve_pays_nodes_from_a_credit_file_next_to_its_wallet_and_tops_it_up(
    served: dict[str, Any], tmp_path: Path
) -> None:
    assert main(served["argv"]) == 0
    config = served["config"]
    assert config.credits_path == tmp_path / "wallet-credits.json"
    assert (config.min_credit_positions, config.top_up_below, config.top_up) == (16, 100, 300)
    assert config.credit_rpcs == (config.committee_rpc,)  # no devnet: the committee RPC alone
    argv = [
        *served["argv"],
        "--credits-file", str(tmp_path / "c.json"),
        "--min-credit-positions", "64",
        "--top-up-below", "500",
        "--top-up", "0",
        "--validator-rpc", "http://10.0.0.1:26657/",
        "--validator-rpc", "http://10.0.0.2:26657",
    ]  # fmt: skip
    assert main(argv) == 0
    config = served["config"]
    assert config.credits_path == tmp_path / "c.json"
    assert (config.min_credit_positions, config.top_up_below, config.top_up) == (64, 500, 0)
    assert config.credit_rpcs == ("http://10.0.0.1:26657", "http://10.0.0.2:26657")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--top-up", "-1"], "error: --top-up must be 0 (never buy) .. 100000 credits"),
        (["--top-up", "100001"], "error: --top-up must be 0 (never buy) .. 100000 credits"),
        (["--top-up-below", "-5"], "error: --top-up-below must be 0 .. 1000000 credits"),
        (["--top-up-below", "0"], "error: --top-up-below 0 never buys"),
        (["--min-credit-positions", "0"], "error: --min-credit-positions must be >= 1"),
        (["--validator-rpc", "ftp://x"], "error: --validator-rpc: 'ftp://x' is not an http(s)"),
    ],
)
def test_gateway_serve_bad_credit_flags_are_named_errors_without_traceback(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    assert main([*served["argv"], *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(named), err
    assert "Traceback" not in err and "config" not in served


def test_gateway_serve_top_up_flags_are_refused_by_a_personal_client(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["gateway", "serve", "--personal", "--manifest", str(tmp_path / "manifest.json")]
    for flags in (["--top-up", "30"], ["--top-up-below", "9"], ["--validator-rpc", "http://v:1"]):
        assert main([*base, *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flags[0]} is a hosted gateway's"), err
        assert "hint: a personal client pays with the credits you buy" in err


def test_gateway_serve_buys_from_every_validator_of_the_running_devnet(
    served: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    devnet = served["home"] / "devnet"
    devnet.mkdir()
    rpcs = ["http://127.0.0.1:27001", "http://127.0.0.1:27011", "http://127.0.0.1:27021"]
    (devnet / "devnet.json").write_text(
        json.dumps(
            {
                "status": "up",
                "evm_rpc": "http://127.0.0.1:8545",
                "committee_rpc": rpcs,
                "chain_id": 31337,
                "deployment": str(devnet / "deployment.json"),
            }
        )
    )
    assert main(served["argv"]) == 0  # the devnet's committee RPC (its first validator)
    assert served["config"].credit_rpcs == tuple(rpcs)
    assert main([*served["argv"], "--committee-rpc", "http://10.0.0.9:26657"]) == 0
    assert served["config"].credit_rpcs == ("http://10.0.0.9:26657",)  # another committee
