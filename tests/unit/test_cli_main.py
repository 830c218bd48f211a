"""The CLI edge: user mistakes become one-line errors with hints and exit codes, not tracebacks."""

from __future__ import annotations

import argparse

import pytest

from planet import main as cli
from protocol.errors import IntegrityError, UsageError

pytestmark = pytest.mark.unit


def _parser_with(handler) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planet")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("boom").set_defaults(handler=handler)
    return parser


def test_main_planet_error_prints_message_and_hint_and_exit_status(monkeypatch, capsys) -> None:
    def handler(_args: argparse.Namespace) -> int:
        raise UsageError("no such file: x.json", hint="run `planet local up` first")

    monkeypatch.setattr(cli, "build_parser", lambda *_: _parser_with(handler))
    assert cli.main(["boom"]) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: no such file: x.json" in err
    assert "hint: run `planet local up` first" in err
    assert "Traceback" not in err


def test_main_error_without_hint_prints_only_the_error_line(monkeypatch, capsys) -> None:
    def handler(_args: argparse.Namespace) -> int:
        raise IntegrityError("hash mismatch")

    monkeypatch.setattr(cli, "build_parser", lambda *_: _parser_with(handler))
    assert cli.main(["boom"]) == IntegrityError.exit_status
    assert capsys.readouterr().err.strip() == "error: hash mismatch"


def test_main_no_command_prints_help_and_exits_2(capsys) -> None:
    assert cli.main([]) == 2
    assert "usage: planet" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("group", "leaf"),
    [
        ("model", "prepare"),
        ("committee", "init"),
        ("node", "serve"),
        ("local", "up"),
        ("contracts", "deploy"),
    ],
)
def test_main_group_without_subcommand_prints_its_help_and_exits_2(
    capsys, group: str, leaf: str
) -> None:
    assert cli.main([group]) == 2
    err = capsys.readouterr().err
    assert f"usage: planet {group}" in err
    assert leaf in err


def test_main_handler_return_value_is_the_exit_status(monkeypatch) -> None:
    monkeypatch.setattr(cli, "build_parser", lambda *_: _parser_with(lambda _a: 3))
    assert cli.main(["boom"]) == 3


def test_commands_table_names_exactly_what_each_group_registers() -> None:
    """`COMMANDS` (which module a run imports) and the groups' own `register` agree, in the
    order `planet --help` lists them."""
    registered: dict[str, str] = {}
    for group in cli.command_modules():
        sub = argparse.ArgumentParser().add_subparsers(dest="command")
        group.register(sub)
        registered.update(dict.fromkeys(sub.choices, group.__name__))
    assert registered == cli.COMMANDS
    assert list(registered) == list(cli.COMMANDS)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["node", "serve"], "node"),
        (["-v", "node", "serve"], "node"),
        (["-vv", "--verbose", "stake", "--role", "compute"], "stake"),
        (["claim", "--epoch", "3"], "claim"),
        ([], None),
        (["-v"], None),
        (["--help"], None),
        (["-h", "node"], None),
        (["--verb", "node"], None),  # argparse's abbreviation: the whole parser reads it
        (["nod"], None),  # argparse's "invalid choice" lists every command
        (["-x", "node"], None),
    ],
)
def test_command_of_reads_the_command_after_verbose_flags_only(
    argv: list[str], command: str | None
) -> None:
    assert cli.command_of(argv) == command


def test_a_command_parses_the_same_with_its_group_alone() -> None:
    argv = ["-v", "node", "serve", "--manifest", "m.json", "--shard", "1", "--port", "9000"]
    alone = vars(cli.build_parser(cli.command_of(argv)).parse_args(argv))
    whole = vars(cli.build_parser().parse_args(argv))
    assert alone.pop("help_parser").prog == whole.pop("help_parser").prog == "planet node"
    assert alone == whole
    assert alone["verbose"] == 1 and alone["shard"] == 1
