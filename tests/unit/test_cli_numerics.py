"""`planet node numerics` (node/cli/numerics.py): its refusal messages name the committee's
codes with a hint, its view says whether the node's version is checked, its --help teaches."""

from __future__ import annotations

import argparse

import pytest

from abci_app.codes import Code
from node.cli import numerics as cli
from planet.main import build_parser
from protocol.errors import UsageError
from protocol.numerics import NUMERICS

pytestmark = pytest.mark.unit


def test_the_cli_knows_the_committees_codes() -> None:
    assert cli.UNKNOWN_NODE == Code.UNKNOWN_NODE and cli.WRONG_ROLE == Code.WRONG_ROLE
    assert cli.INVALID_LIFECYCLE == Code.INVALID_LIFECYCLE
    assert cli.NUMERICS_NOT_ACCEPTED == Code.NUMERICS_NOT_ACCEPTED
    assert cli.NUMERICS_UNCHANGED == Code.NUMERICS_UNCHANGED
    assert cli.NUMERICS_TOO_SOON == Code.NUMERICS_TOO_SOON


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (Code.NUMERICS_NOT_ACCEPTED, "genesis.numerics"),
        (Code.NUMERICS_TOO_SOON, "once every 8 epochs"),
        (Code.UNKNOWN_NODE, "planet join"),
        (Code.INVALID_LIFECYCLE, "left"),
        (Code.WRONG_ROLE, "compute nodes"),
        (99, "docs/network.md"),
    ],
)
def test_a_refusal_is_one_error_with_a_hint(code: int, hint: str) -> None:
    error = cli.refusal(int(code), "the log", 3)
    assert isinstance(error, UsageError)
    assert "numerics 3" in error.message and f"code {int(code)}" in error.message
    assert "\n" not in error.message and hint in (error.hint or "")


def test_scheduled_or_unchanged_is_no_error() -> None:
    assert cli.refusal(0, "", 3) is None
    assert cli.refusal(int(Code.NUMERICS_UNCHANGED), "already", 3) is None


def test_parse_version_refuses_what_is_not_a_version() -> None:
    assert cli.parse_version("3") == 3
    for bad in ("0", "65536", "x", "2.0", "", "\u0663", "+3", " 3"):  # ٣: not ASCII
        with pytest.raises(argparse.ArgumentTypeError, match="not a numerics version"):
            cli.parse_version(bad)


def test_describe_says_pending_and_unchecked() -> None:
    listing = {
        "total_power": 40,
        "floor": {"verifiers": 2, "power": 14},
        "versions": [
            {"numerics": 2, "verifiers": ["A", "B", "C"], "power": 30, "checked": True},
            {"numerics": 3, "verifiers": ["D"], "power": 10, "checked": False},
        ],
    }
    view = {"numerics": 3, "numerics_epoch": 4, "numerics_next": {"epoch": 9, "numerics": 2}}
    lines = cli.describe(view, listing)
    assert lines[0] == f"numerics    3 (since epoch 4); this release: {NUMERICS}"
    assert lines[1] == "pending     2 from epoch 9"
    assert lines[2].startswith("checked     NO (spot checks on it convict nobody): 1 verifiers")
    assert lines[3] == "versions    [2, 3] on this chain"
    assert cli.describe(None, listing) == ["numerics    the node is not registered"]
    assert cli.describe({}, listing)[0].startswith("numerics    not announced")


def test_help_teaches_with_examples() -> None:
    parser = build_parser("node")
    [node] = [a for a in parser._subparsers._group_actions if a.choices]  # type: ignore[union-attr]
    text = node.choices["node"]._subparsers._group_actions[0].choices["numerics"].format_help()
    assert "planet node numerics --set 3" in text and "next committee epoch" in text
    args = parser.parse_args(["node", "numerics", "--set"])
    assert args.set_to == NUMERICS


def test_agent_warns_when_the_registration_announces_other_numerics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from node.agent.agent import _note_numerics

    caplog.set_level("WARNING", logger="node.agent.agent")
    _note_numerics({"numerics": NUMERICS})
    _note_numerics({"numerics": NUMERICS + 1, "numerics_next": {"epoch": 4, "numerics": NUMERICS}})
    assert caplog.records == []  # this release's, now or once the pending change took effect
    _note_numerics({"numerics": NUMERICS + 1})
    [record] = caplog.records
    assert "planet node numerics --set" in record.getMessage()
