"""Threshold blind BLS credits (protocol.blind_bls, protocol.dkg) in-process: one JSON object.

For committees of 4 and 16 validators (t = floor(2n/3) + 1 = 3 and 11), each keyed by a real DKG
run (`tests.threshold_committee.run_dkg`: every participant and the chain's state machine in
this one process):

- primitives (blst through pyblst): `g1_mul_ms`, `g2_mul_ms`, `hash_to_g1_ms`,
  `pairing_check_ms` (e(a, b) = e(c, d): two Miller loops, one final exponentiation);
- issue, per credit: `blind_ms` (client), `partial_sign_ms` (one validator), `partial_verify_ms`
  (anyone checking one validator's partial against its public share), `combine_ms_{n}` (t
  partials, Lagrange at 0), `unblind_ms` (r⁻¹ and the verification `unblind` does), and
  `issue_ms_{n}` = blind + t partial signatures + combine + unblind;
- verify: `verify_ms_per_credit` (one credit alone), `verify_batch_ms_per_credit` (a batch of
  --batch credits, one random-linear-combination check);
- DKG: `dkg_s_{n}` (the whole run: n deals, n × n share openings, complaints none, finish),
  `dkg_chain_s_{n}` (the chain's part alone: every deal's checks and `finish`).

Times are CPU time of this process (`time.process_time`), medians over --repeats; the machine
is shared, so compare numbers of one run only.

    .venv/bin/python bench/threshold_credits.py            # ~30 s
    .venv/bin/python bench/threshold_credits.py --quick    # < 20 s
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick
from protocol import blind_bls, bls, dkg
from tests.threshold_committee import Committee, run_dkg

SIZES = (4, 16)


def cpu_ms(action: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        action()
        samples.append((time.process_time() - start) * 1000)
    return round(median(samples), 3)


def primitives(repeats: int) -> dict[str, float]:
    g1, g2 = bls.g1_generator(), bls.g2_generator()
    a, b = bls.g1_mul(g1, secrets.randbits(255)), bls.g2_mul(g2, secrets.randbits(255))
    scalar = secrets.randbits(255)
    return {
        "g1_mul_ms": cpu_ms(lambda: bls.g1_mul(a, scalar), repeats),
        "g2_mul_ms": cpu_ms(lambda: bls.g2_mul(b, scalar), repeats),
        "hash_to_g1_ms": cpu_ms(
            lambda: bls.hash_to_g1(secrets.token_bytes(72), blind_bls.CREDIT_DST), repeats
        ),
        "pairing_check_ms": cpu_ms(lambda: bls.pairing_equal(a, g2, g1, b), repeats),
    }


def issue(committee: Committee, repeats: int) -> dict[str, float]:
    n, t = len(committee.config.receivers), committee.threshold
    signers = tuple(range(1, t + 1))
    blinding = blind_bls.blind(1, secrets.token_bytes(32))
    partials = {i: blind_bls.partial_sign(committee.shares[i], blinding.blinded) for i in signers}
    blind_sig = blind_bls.combine(partials, t)
    key, share_key = committee.group_key, committee.public_share(1)
    blind_ms = cpu_ms(lambda: blind_bls.blind(1, secrets.token_bytes(32)), repeats)
    sign_ms = cpu_ms(lambda: blind_bls.partial_sign(committee.shares[1], blinding.blinded), repeats)
    combine_ms = cpu_ms(lambda: blind_bls.combine(partials, t), repeats)
    unblind_ms = cpu_ms(lambda: blind_bls.unblind(blinding, blind_sig, key), repeats)
    metrics = {
        f"combine_ms_{n}": combine_ms,
        f"issue_ms_{n}": round(blind_ms + t * sign_ms + combine_ms + unblind_ms, 3),
    }
    if n == SIZES[0]:
        metrics |= {
            "blind_ms": blind_ms,
            "partial_sign_ms": sign_ms,
            "partial_verify_ms": cpu_ms(
                lambda: blind_bls.verify_partial(share_key, blinding.blinded, partials[1]), repeats
            ),
            "unblind_ms": unblind_ms,
        }
    return metrics


def verify(committee: Committee, repeats: int, batch: int) -> dict[str, float]:
    t = committee.threshold
    credits = []
    for _ in range(batch):
        blinding = blind_bls.blind(1, secrets.token_bytes(32))
        partials = {
            i: blind_bls.partial_sign(committee.shares[i], blinding.blinded)
            for i in range(1, t + 1)
        }
        credits.append(
            blind_bls.unblind(blinding, blind_bls.combine(partials, t), committee.group_key)
        )
    key = committee.group_key
    batch_ms = cpu_ms(lambda: blind_bls.verify_credits(key, credits), max(1, repeats // 10))
    return {
        "verify_ms_per_credit": cpu_ms(lambda: blind_bls.verify_credit(key, credits[0]), repeats),
        "verify_batch_ms_per_credit": round(batch_ms / batch, 3),
    }


def dkg_times(size: int, repeats: int) -> tuple[dict[str, float], Committee]:
    totals, chains = [], []
    committee: Committee | None = None
    for _ in range(repeats):
        start = time.process_time()
        committee = run_dkg(size)
        totals.append(time.process_time() - start)
        deals = [dkg.deal(committee.config, dealer)[0] for dealer in committee.config.dealers]
        start = time.process_time()
        state = dkg.DkgState(committee.config)
        for one in deals:
            state.submit_deal(one)
        state.close_deals()
        state.close_complaints()
        state.close_justifications()
        state.finish()
        chains.append(time.process_time() - start)
    assert committee is not None
    return {
        f"dkg_s_{size}": round(median(totals), 3),
        f"dkg_chain_s_{size}": round(median(chains), 3),
    }, committee


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50, help="timed repeats per operation")
    parser.add_argument("--batch", type=int, default=100, help="credits per batch verification")
    parser.add_argument("--dkg-repeats", type=int, default=3, help="DKG runs per committee size")
    args = parse_with_quick(parser, {"repeats": 5, "batch": 20, "dkg_repeats": 1}, argv)
    metrics: dict[str, float] = primitives(args.repeats)
    for size in SIZES:
        times, committee = dkg_times(size, args.dkg_repeats)
        metrics |= times
        metrics |= issue(committee, args.repeats)
        if size == SIZES[0]:
            metrics |= verify(committee, args.repeats, args.batch)
    body: dict[str, Any] = {
        "bench": "threshold_credits",
        "machine": machine(),
        "config": {
            "sizes": list(SIZES),
            "thresholds": [dkg.threshold_for(n) for n in SIZES],
            "repeats": args.repeats,
            "batch": args.batch,
            "dkg_repeats": args.dkg_repeats,
            "curve_library": "pyblst (blst)",
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {"verify_ms_per_credit": {"op": "<=", "value": 2}},
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
