"""A node's paid work wired into its app: `install_payments` puts the node's `Payments` on its
state (node/server/payments.py), or for a span hop one per shard behind `SpanPayments`
(node/server/span_payments.py), each spooled to `<credits base>/shard-K` where the agent
redeems that shard's credits (node/agent/credit_spools.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from node.server.credit_locks import LockMarks
from node.server.payments import CreditCheck, CreditSpool, Payments, shard_spool, spool_base
from node.server.span_payments import SpanPayments

log = logging.getLogger(__name__)


def install_payments(app: Any, state: Any, config: Any) -> None:
    """With `config.credit_positions`: the node's Payments on `state`, its committee link opened
    and closed with the app (aiohttp cleanup_ctx)."""
    from node.chain.committee_link import CommitteeLink

    async def lifetime(_app: Any) -> Any:
        link = CommitteeLink([config.committee_rpc])
        check = CreditCheck(link, margin_blocks=config.credit_margin_blocks)

        def shard_payments(directory: Path, party: bytes | None) -> Payments:
            return Payments(
                config.credit_positions,
                check,
                CreditSpool(directory),
                wait_s=config.pay_wait_s,
                locks=LockMarks(directory),
                unlocked=config.credit_unlocked,
                party=party,
            )

        if config.span.size == 1:
            state.payments = shard_payments(config.credits_dir, state.credit_party)
        else:  # a span is paid per shard, each spooled where the agent redeems that shard
            base = spool_base(config.credits_dir)
            state.payments = SpanPayments(
                {
                    shard: shard_payments(shard_spool(base, shard), state.credit_parties.get(shard))
                    for shard in config.span
                }
            )
        log.info(
            "paid work: %d positions per credit, credits spooled to %s",
            config.credit_positions,
            config.credits_dir,
        )
        yield
        await link.close()

    app.cleanup_ctx.append(lifetime)
