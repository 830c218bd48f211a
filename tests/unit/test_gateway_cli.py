"""`planet gateway serve` resolves its chains like every operator command: flags > env >
$PLANET_HOME/config.toml > defaults, with the same URL checks (named error, no traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.cli.main import main

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
