"""`planet devnet` edges that need no processes: nothing running, bad sizes, the argv shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.devnet.plan import read_state
from deploy.devnet.processes import argv_tail
from deploy.devnet.status import running
from node.cli import main as cli

pytestmark = pytest.mark.unit


def test_devnet_status_and_down_without_a_devnet(tmp_path: Path, capsys) -> None:
    assert cli.main(["devnet", "status", "--home", str(tmp_path)]) == 0
    assert "no devnet" in capsys.readouterr().out
    assert cli.main(["devnet", "status", "--json", "--home", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "absent"
    for _ in range(2):  # idempotent
        assert cli.main(["devnet", "down", "--home", str(tmp_path)]) == 0
        assert "no devnet was running" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--validators", "0", "--validators must be 1..16"),
        ("--nodes", "10", "--nodes must be 1..9"),
        ("--verifiers", "5", "--verifiers must be 0 to --validators (4)"),
        ("--verifiers", "-1", "--verifiers must be 0 to --validators (4)"),
    ],
)
def test_devnet_up_bad_sizes_are_usage_errors_before_anything_starts(
    tmp_path: Path, capsys, flag: str, value: str, message: str
) -> None:
    assert cli.main(["devnet", "up", flag, value, "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "devnet").exists()


def test_devnet_state_of_a_dead_devnet_is_not_running(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    directory.mkdir()
    (directory / "devnet.json").write_text(json.dumps({"pids": {"anvil": 999_999_999}}))
    state = read_state(directory)
    assert state is not None and not running(state)
    (directory / "devnet.json").write_text("{not json")
    assert read_state(directory) is None


def test_devnet_failed_command_is_shown_as_typed() -> None:
    argv = ["/usr/bin/python3", "-m", "node.cli.main", "join", "--shard", "1"]
    assert argv_tail(argv) == ["planet", "join", "--shard", "1"]
