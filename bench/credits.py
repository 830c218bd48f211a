"""Credits on the committee app in-process (no sockets, no CometBFT): one JSON object.

A 4-validator chain (`tests/committee_chain.py`) with genesis `credits`; the validators form the
first key period's committee key by the on-chain DKG (their watchers' messages, untimed;
`tests/credit_chain.py`), t = 3 of 4. Then, --mints times:

- mint: the client draws --credits nonces and blinds each into ONE list (`client_blind_ms`),
  the `credit_mint` tx runs through a block (`chain_mint_ms`: PrepareProposal → FinalizeBlock →
  Commit), each validator's watcher signs the mint's points with its key share
  (`sign_ms_per_validator`) and posts them in a `mint_partials` tx; the block of the 4 posts,
  each batch-verified by the chain, per validator: `chain_partials_ms_per_validator`; the
  client reads the posted sets (`/credit_partials`), checks every
  partial, combines t, unblinds and verifies (`finalize_ms`). `mint_ms_p50` = the sum, request
  → usable credits, without network or block time (a real chain adds ≥ one block interval and
  4 query round trips); `chain_fund_ms` is the block of the 4 validators' `fund_mint` vouches
  in between (the EVM balance reads behind them are the watchers', not timed here).
- redeem: the credits go to compute nodes in `credit_redeem` txs of --per-tx credits,
  --txs-per-block txs per block; `redeem_records_s` = credits / CPU seconds of the blocks that
  carry them (every validator checks every credit: one batched pairing check per period and tx).

- posted partials of a 128-credit mint (the largest): `partials_verify_ms_per_validator_128`,
  the chain's batch check of one validator's set, and `chain_partials_tx_ms_128`, that set's
  whole tx through a block (`posted_set_cost`).

- flood (issue 42): --flood junk mints nobody pays for, and the watchers' whole waiting list
  read back page by page (`bench/_mint_flood.py`; the `flood_*` metrics).

Times are CPU time of this process (`time.process_time`).

    .venv/bin/python bench/credits.py          # ~30 s
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abci_app import schema
from abci_app.mint_partials import challenge_context
from abci_app.queries import query
from abci_app.threshold_queries import partials
from bench._common import machine, parse_with_quick
from bench._mint_flood import flood_figures
from node.client.mint_request import MintRequest
from node.watcher.mint_signer import sign_set
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.commitments import CommitBatch, CommitmentRecord
from protocol.committee.credits import MAX_MINT, CreditRedeem, FundMint, MintPartials
from protocol.committee.grammar import MAX_BATCH
from protocol.committee.prices import SetPrice
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from protocol.threshold_mint import PeriodKey
from tests.committee_chain import EVM_CHAIN_ID, Chain, seeded_evm_key, seeded_key
from tests.credit_chain import ensure_key, shares

ESCROW = "0x" + "ee" * 20
PRICE = 10**12
NOW = 1_800_000_000


def ask(chain: Chain, path: str) -> Any:
    code, value, log = query(chain.state, path, b"")
    if code != 0:
        raise RuntimeError(log)
    return json.loads(value)


def nodes(chain: Chain, count: int) -> list[Any]:
    keys = [seeded_key(f"credit-bench-{i}") for i in range(count)]
    txs = []
    for i, key in enumerate(keys):
        evm = seeded_evm_key(f"credit-bench-{i}")
        body = RegisterNode(
            address_of(evm),
            sign_registration(evm, key.verify_key.encode().hex()),
            "compute",
            "m",
            (0,),
            "e",
            1,
        )
        txs.append(chain.tx(body, key))
    assert all(r.code == 0 for r in chain.block(txs))
    stake = [chain.tx(Heartbeat(), key) for key in keys]
    for key in keys:
        node = key.verify_key.encode().hex()
        stake += [chain.tx(AttestStake(node, 10**18), v.key) for v in chain.validators[:3]]
    assert all(r.code == 0 for r in chain.block(stake))
    return keys


def commit_served(chain: Chain, workers: list[Any], credits: int) -> None:
    """Each worker registers a price of 1 position per credit (a redemption needs a price on
    the chain, abci_app/prices.py) and commits records covering a position per credit it may
    redeem (abci_app/coverage.py): untimed, as the nodes' agents do it beside serving."""
    records = -(-credits // 32) + 1
    txs = [chain.tx(SetPrice("m", 0, 1), key) for key in workers]
    for key in workers:
        for start in range(0, records, MAX_BATCH):
            batch = tuple(
                CommitmentRecord("0x" + f"{start:064x}", step, 0, "0x" + "c0" * 32)
                for step in range(start, min(records, start + MAX_BATCH))
            )
            txs.append(chain.tx(CommitBatch(batch), key))
    results = chain.block(txs)
    assert all(r.code == 0 for r in results), [r.log for r in results][:3]


def posted_set_cost(
    chain: Chain, stores: list[Any], period: PeriodKey, payer: bytes
) -> dict[str, float]:
    """What verifying one validator's posted partial set of a 128-credit mint costs the chain:
    `partials_verify_ms_per_validator_128` (the batch check alone, `blind_bls.verify_partials`:
    two pairings, 256 point parses and 128-bit multiplications; median of the 4 validators'
    sets) and `chain_partials_tx_ms_128` (its whole `mint_partials` tx through a block of its
    own: decode, checks, the batch check, the writes; median of 4)."""
    request = MintRequest.create(period, MAX_MINT, payer, PRICE, EVM_CHAIN_ID, ESCROW, NOW + 3600)
    [minted] = chain.block([chain.tx(request.body, seeded_key("credit-bench-minter-128"))])
    assert minted.code == 0, minted.log
    assert all(
        r.code == 0
        for r in chain.block([chain.tx(FundMint(request.mint_id), v.key) for v in chain.validators])
    )
    points = tuple(
        bytes.fromhex(p) for p in chain.state.committed(schema.MINT, request.mint_id)["points"]
    )
    check_ms, tx_ms = [], []
    for validator, store in zip(chain.validators, stores, strict=True):
        held = store.share(period.period)
        assert held is not None
        index, share = held
        signed = sign_set(share, points)
        address = next(a for a, i in period.index_of.items() if i == index)
        public = bls.parse_g2(period.public_shares[index], "public share")
        context = challenge_context(request.mint_id, address)
        t0 = time.process_time()
        blind_bls.verify_partials(public, points, signed, context)
        check_ms.append((time.process_time() - t0) * 1000)
        raw = chain.tx(MintPartials(request.mint_id, signed), validator.key)
        t1 = time.process_time()
        [result] = chain.block([raw])
        tx_ms.append((time.process_time() - t1) * 1000)
        assert result.code == 0, result.log
    return {
        "partials_verify_ms_per_validator_128": round(median(check_ms), 2),
        "chain_partials_tx_ms_128": round(median(tx_ms), 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        chain = Chain(
            db=Path(tmp) / "app.sqlite",
            genesis={
                "epoch_length": 1_000_000,
                "evm": {
                    "chain_id": EVM_CHAIN_ID,
                    "committee_address": "0x" + "cc" * 20,
                    "escrow_address": ESCROW,
                },
                "credits": {
                    "price_wei": str(PRICE),
                    "layer_tokens": 4096,
                    "key_period_blocks": 1_000_000,
                    "dkg_phase_blocks": 2,
                },
            },
        )
        chain.time_s = NOW
        ensure_key(chain, Path(tmp))  # the DKG's blocks: untimed
        stores = shares(Path(tmp), chain)
        workers = nodes(chain, args.nodes)
        period = PeriodKey.from_answer(ask(chain, "/credit_period"))
        payer = seeded_evm_key("credit-bench-payer")
        blind_ms, mint_ms, fund_ms, sign_ms, finalize_ms, total_ms = [], [], [], [], [], []
        partials_ms: list[float] = []
        credits: list[ThresholdCredit] = []
        mint_bytes = []
        for i in range(args.mints):
            t0 = time.process_time()
            request = MintRequest.create(
                period, args.credits, payer, PRICE, EVM_CHAIN_ID, ESCROW, NOW + 3600
            )
            t1 = time.process_time()
            raw = chain.tx(request.body, seeded_key(f"credit-bench-minter-{i}"))
            mint_bytes.append(len(raw))
            [result] = chain.block([raw])
            assert result.code == 0, result.log
            t2 = time.process_time()
            vouches = [chain.tx(FundMint(request.mint_id), v.key) for v in chain.validators]
            assert all(r.code == 0 for r in chain.block(vouches))  # the watchers' fund_mint
            t_funded = time.process_time()
            per_validator = []
            posts = []
            record = chain.state.committed(schema.MINT, request.mint_id)
            points = tuple(bytes.fromhex(p) for p in record["points"])
            for validator, store in zip(chain.validators, stores, strict=True):
                s0 = time.process_time()
                held = store.share(period.period)
                assert held is not None
                signed = sign_set(held[1], points)  # what its watcher computes
                per_validator.append((time.process_time() - s0) * 1000)
                posts.append(chain.tx(MintPartials(request.mint_id, signed), validator.key))
            p0 = time.process_time()
            assert all(r.code == 0 for r in chain.block(posts))  # the watchers' mint_partials
            partials_ms.append((time.process_time() - p0) * 1000 / len(posts))
            t3 = time.process_time()
            answers = [partials(chain.state, store, {"mint": request.mint_id}) for store in stores]
            credits += request.finalize(period, answers)
            t4 = time.process_time()
            blind_ms.append((t1 - t0) * 1000)
            mint_ms.append((t2 - t1) * 1000)
            fund_ms.append((t_funded - t2) * 1000)
            sign_ms.append(median(per_validator))
            finalize_ms.append((t4 - t3) * 1000)
            total_ms.append((t4 - t0) * 1000)
        batches = [credits[i : i + args.per_tx] for i in range(0, len(credits), args.per_tx)]
        commit_served(chain, workers, len(credits))  # a redemption needs committed work
        redeem_txs = [
            chain.tx(CreditRedeem("m", 0, tuple(batch)), workers[i % len(workers)])
            for i, batch in enumerate(batches)
        ]
        redeem_bytes = [len(raw) for raw in redeem_txs]
        cpu = 0.0
        redeemed = 0
        for start in range(0, len(redeem_txs), args.txs_per_block):
            block = redeem_txs[start : start + args.txs_per_block]
            t0 = time.process_time()
            results = chain.block(block)
            cpu += time.process_time() - t0
            assert all(r.code == 0 for r in results), [r.log for r in results]
            redeemed += sum(len(b) for b in batches[start : start + args.txs_per_block])
        verify_128 = posted_set_cost(chain, stores, period, payer)
        flood = flood_figures(chain, period.period, args.flood, PRICE, ESCROW, NOW + 3600)
        return {
            "bench": "credits",
            "machine": machine(),
            "config": {
                "validators": 4,
                "threshold": period.threshold,
                "scheme": "threshold blind BLS12-381 (one committee key per key period)",
                "credits_per_mint": args.credits,
                "mints": args.mints,
                "credits_per_redeem_tx": args.per_tx,
                "redeem_txs_per_block": args.txs_per_block,
                "clock": "process CPU time, in-process app (no network, no block interval)",
            },
            "metrics": {
                "mint_ms_p50": round(median(total_ms), 2),
                "mint_ms_per_credit_p50": round(median(total_ms) / args.credits, 2),
                "client_blind_ms_p50": round(median(blind_ms), 2),
                "chain_mint_ms_p50": round(median(mint_ms), 2),
                "chain_fund_ms_p50": round(median(fund_ms), 2),
                "sign_ms_per_validator_p50": round(median(sign_ms), 2),
                "chain_partials_ms_per_validator_p50": round(median(partials_ms), 2),
                **verify_128,
                "finalize_ms_p50": round(median(finalize_ms), 2),
                "mint_tx_bytes": max(mint_bytes),
                "redeem_records_s": round(redeemed / cpu, 1) if cpu else 0.0,
                "redeem_tx_bytes_per_credit": round(sum(redeem_bytes) / len(credits), 1),
                "redeemed_credits": redeemed,
                # flat (BENCHMARKS.md): flood_mints(_s), flood_pending_{listed,pages,list_ms}
                **{k if k.startswith("flood_") else f"flood_{k}": v for k, v in flood.items()},
            },
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mints", type=int, default=8)
    parser.add_argument("--credits", type=int, default=16, help="credits per mint (≤ 128)")
    parser.add_argument("--per-tx", type=int, default=64, help="credits per redeem tx")
    parser.add_argument("--txs-per-block", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--flood", type=int, default=2000, help="junk mints (issue 42)")
    args = parse_with_quick(parser, {"mints": 2, "credits": 4, "per_tx": 4, "flood": 200}, argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
