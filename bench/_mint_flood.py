"""A mint flood's cost on the in-process committee app (issue 42), for bench/credits.py.

`flood_figures` sends `count` junk one-credit mints (`tests/mint_flood.py`: valid, unbacked, from
`count / 4` fresh payers, 4 each: the most genesis `credits.max_pending_mints` lets one hold)
in blocks of 500 and reads the watchers' whole waiting list back, page by page:
`flood_mints_s` = junk mints per CPU second of the blocks that carry them (what a flood costs
every validator), `pending_pages` and `pending_list_ms` = the pages and CPU time a watcher spends
to list them all (it reads no balance for them: none of their payers ever deposited).
"""

from __future__ import annotations

import json
import time
from typing import Any

from abci_app.queries import query
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.mint_flood import junk_mint

PER_PAYER = 4
BLOCK = 500


def flood_figures(
    chain: Chain, period: int, count: int, price: int, escrow: str, expiry: int
) -> dict[str, Any]:
    sender = seeded_key("flood-bench-sender")
    txs = []
    for n in range(count):
        payer = seeded_evm_key(f"flood-bench-payer-{n // PER_PAYER}")
        _, body = junk_mint(period, payer, price, EVM_CHAIN_ID, escrow, expiry, n)
        txs.append(chain.tx(body, sender))
    cpu = 0.0
    for start in range(0, len(txs), BLOCK):
        t0 = time.process_time()
        results = chain.block(txs[start : start + BLOCK])
        cpu += time.process_time() - t0
        assert all(r.code == 0 for r in results), [r.log for r in results][:3]
    t0 = time.process_time()
    listed, pages, after = 0, 0, None
    while True:
        path = "/mints?pending=true" + (f"&after={after}" if after else "")
        code, value, log = query(chain.state, path, b"")
        assert code == 0, log
        page = json.loads(value)
        listed, pages, after = listed + len(page["mints"]), pages + 1, page["next"]
        if after is None:
            break
    list_ms = (time.process_time() - t0) * 1000
    return {
        "flood_mints": count,
        "flood_mints_s": round(count / cpu, 1) if cpu else 0.0,
        "pending_listed": listed,
        "pending_pages": pages,
        "pending_list_ms": round(list_ms, 1),
    }
