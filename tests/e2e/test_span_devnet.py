"""A span hop on the shared devnet (issue 44): a new operator joins with `planet join --model M
--shards 2` (no shard named): placement takes 2 consecutive shards and says why, the node
registers both with one endpoint and the pool's going price on each, and the gateway routes
paid questions through it as one hop (a span is preferred to two single-shard hops). On the
committee chain each shard of the span shows its own committed work, credit locks and
redemptions (`/coverage`): the span is paid and committed as its shards' hops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node.keys import create_dev_wallet
from tests.e2e.devnet_session import (
    QUESTIONS,
    STAKE_ETH,
    fund,
    operator_env,
    planet,
    query,
    release_operator,
    wait,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_devnet_operator_joins_a_span_routed_and_paid_per_shard(
    devnet_env: dict[str, str], shared_devnet: dict[str, Any], fresh_user: Any, tmp_path: Path
) -> None:
    env, devnet = devnet_env, shared_devnet
    home = tmp_path / "span-operator"
    home.mkdir()
    own_env = operator_env(env, home)
    try:
        fund(env, create_dev_wallet(home / "wallet.json", own_env["PLANET_PASSWORD"]).address)
        staked = planet(own_env, "stake", "--role", "compute", "--amount", STAKE_ETH,
                        "--home", str(home))  # fmt: skip
        assert staked.returncode == 0, staked.stderr[-2000:]
        model = Path(devnet["manifest"]).parent.name
        joined = planet(own_env, "join", "--model", model, "--shards", "2", "--json",
                        "--home", str(home), timeout=300)  # fmt: skip
        assert joined.returncode == 0, joined.stderr[-3000:]
        doc = json.loads(joined.stdout)
        span = doc["placement"]["span"]
        assert len(span) == 2 and span[1] == span[0] + 1, doc
        assert "as one hop" in joined.stderr, joined.stderr
        key, rpc = doc["node_key"], devnet["committee_rpc"][0]
        view = query(rpc, "/node", key=key)
        assert view["shards"] == span and view["routable"], view
        prices = query(rpc, "/prices", model=devnet["model_hash"], node=key)["prices"]
        assert sorted(row["shard"] for row in prices) == span  # priced on each shard

        def paid_on_both() -> list[dict[str, Any]] | None:
            shards = query(rpc, "/coverage", node=key).get("shards") or []
            mine = [s for s in shards if s["shard"] in span]
            done = len(mine) == 2 and all(
                s["committed_positions"] > 0 and s["bought_positions"] > 0 for s in mine
            )
            return mine if done else None

        for question in QUESTIONS:
            asked = planet(env, "ask", "--pay", *fresh_user.pay_args(), "--json",
                           "--max-tokens", "6", question, timeout=300)  # fmt: skip
            assert asked.returncode == 0, asked.stderr[-3000:]
            # the router prefers the span once it lists and verifies it; a question whose
            # circuit did not take it (the receipt's nodes) is not waited for
            served = key in json.loads(asked.stdout)["receipt"]["nodes"]
            try:
                wait(paid_on_both, 90 if served else 5,
                     "the span's work committed and paid on both shards", 2.0)  # fmt: skip
                break
            except AssertionError:
                continue
        else:
            raise AssertionError("the gateway never routed a paid question through the span")

        def redeemed_on_both() -> bool:
            shards = query(rpc, "/coverage", node=key).get("shards") or []
            return sum(1 for s in shards if s["shard"] in span and s["charged_positions"]) == 2

        wait(redeemed_on_both, 90, "the span's credits redeemed on each of its shards", 2.0)
    finally:
        release_operator(own_env, home)
