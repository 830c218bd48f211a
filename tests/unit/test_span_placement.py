"""Spans in placement and on the command lines: `choose_span` takes the N consecutive shards
that are weakest together; `--shards` values are parsed at the boundary (protocol/spans.py,
`planet node serve --shards A-B`, `planet join --shards N|auto`) or refused with a hint."""

from __future__ import annotations

from typing import Any

import pytest

from node.agent.placement import PoolNode, choose_shard, choose_span
from node.server.config import ServerConfig
from protocol.errors import ConfigError, UsageError
from protocol.spans import NonContiguousSpanError, ShardSpan, parse_span_arg, span_of

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "ab" * 32


def node(n: int, *shards: int, routable: bool = True) -> PoolNode:
    return PoolNode(key=f"{n:064x}", shards=shards, status="SERVING", routable=routable)


def test_choose_span_takes_the_consecutive_shards_weakest_together() -> None:
    # shards 0 and 1 have two nodes each, 2 and 3 one, 4 none: the span of 2 is 3-4
    pool = [node(1, 0), node(2, 0), node(3, 1), node(4, 1), node(5, 2), node(6, 3)]
    placement = choose_span(MODEL, 5, pool, 2)
    assert (placement.shard, placement.last, placement.span.shards) == (3, 4, (3, 4))
    assert placement.reason.startswith("shards 3-4 of 5 as one hop")
    assert placement.to_json()["span"] == [3, 4]


def test_choose_span_ties_go_to_the_lowest_first_shard() -> None:
    placement = choose_span(MODEL, 4, [], 2)
    assert (placement.shard, placement.last) == (0, 1)
    # the window holding the weakest shard wins over one of two middling shards
    pool = [node(1, 0), node(2, 1), node(3, 1), node(4, 3), node(5, 3), node(6, 2)]
    assert choose_span(MODEL, 4, pool, 2).span == ShardSpan(0, 1)


def test_choose_span_of_one_is_choose_shard_and_a_span_counts_on_each_shard() -> None:
    pool = [node(1, 0, 1), node(2, 2)]
    one = choose_span(MODEL, 3, pool, 1)
    assert one == choose_shard(MODEL, 3, pool) and one.last is None
    assert [s.replicas for s in one.supply] == [1, 1, 1]


def test_choose_span_longer_than_the_model_is_a_user_error() -> None:
    with pytest.raises(UsageError, match="has 3 shards") as caught:
        choose_span(MODEL, 3, [], 4)
    assert caught.value.hint and "1 to 3" in caught.value.hint


def test_an_already_registered_span_keeps_its_shards() -> None:
    own = node(9, 1, 2)
    assert choose_span(MODEL, 3, [own], 2, own_key=own.key).span == ShardSpan(1, 2)


@pytest.mark.parametrize(
    ("text", "span"), [("3", ShardSpan(3, 3)), ("1-2", ShardSpan(1, 2)), (" 0-0 ", ShardSpan(0, 0))]
)
def test_parse_span_arg_takes_a_shard_or_a_range(text: str, span: ShardSpan) -> None:
    assert parse_span_arg(text) == span


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("2-1", "--shards 1-2"),  # backwards: the hint gives it the right way round
        ("1-", "--shards 1-2"),
        ("a-b", "--shards 1-2"),
        ("-1", "--shards 1-2"),
        ("１-２", "--shards 1-2"),  # full-width digits are not ASCII
        ("0-300", "shorter"),
    ],
)
def test_parse_span_arg_refuses_with_a_hint(text: str, hint: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_span_arg(text)
    assert caught.value.hint and hint in caught.value.hint


def test_parse_span_arg_past_the_models_shards_is_refused() -> None:
    with pytest.raises(UsageError, match=r"shards 0\.\.2"):
        parse_span_arg("2-3", shard_count=3)


@pytest.mark.parametrize(
    "shards", [[], [0, 2], [2, 1], [1, 1], [True], [0, "1"], "01", None, 3, [-1], [70000]]
)
def test_span_of_refuses_what_is_not_one_contiguous_run(shards: Any) -> None:
    with pytest.raises(NonContiguousSpanError):
        span_of(shards)


def test_server_config_span_is_validated() -> None:
    config = ServerConfig(manifest_path=__file__, shard_id=1, last_shard=2)  # type: ignore[arg-type]
    assert config.validate().span == ShardSpan(1, 2)
    with pytest.raises(ConfigError, match="last shard"):
        ServerConfig(manifest_path=__file__, shard_id=2, last_shard=1).validate()  # type: ignore[arg-type]


def test_cli_node_serve_backwards_range_is_one_error_and_a_hint(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    from planet import main as cli

    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    argv = ["node", "serve", "--manifest", str(manifest), "--shards", "2-1", "--plaintext-links"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[0].startswith("error: --shards 2-1")
        and err[1] == "hint: write the lower shard first: --shards 1-2"
    )


def test_cli_join_shards_with_shard_is_a_user_error() -> None:
    import argparse

    from node.cli.operator import _span_size, parse_span_size

    assert parse_span_size("auto") is None and parse_span_size("2") == 2
    for bad in ("0", "2-1", "x", "257"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_span_size(bad)
    args = argparse.Namespace(shards=2, shard=1, rebalance=None, credit_positions=None)
    with pytest.raises(UsageError, match="give one of them"):
        _span_size(args, hosted=False)
    args = argparse.Namespace(shards=2, shard=None, rebalance=True, credit_positions=None)
    with pytest.raises(UsageError, match="not rebalanced") as caught:
        _span_size(args, hosted=False)
    assert caught.value.hint and "--rebalance" in caught.value.hint
    args = argparse.Namespace(shards=2, shard=None, rebalance=None, credit_positions=None)
    with pytest.raises(UsageError, match="one shard"):
        _span_size(args, hosted=True)
    assert _span_size(args, hosted=False) == 2
