"""Placement quality and shard recovery (issue 44): machines of mixed speeds join one model's
pool with `--model` only, one after another, placed by the product's rule (node/agent/
placement.py `choose_shard`) and then rebalanced (node/agent/rebalance.py `decide`) to a fixed
point; the pool's throughput is compared with the best assignment of the same machines an
exhaustive search finds. In full mode, also the time the devnet takes to serve a shard again
after its node dies (tests/e2e/test_rebalance_devnet.py, a real move).

    python bench/placement.py --quick  # smoke run: modelled stage times, 3 shards × {3, 4}
                                       # nodes, one draw (in process, ~1 s)
    python bench/placement.py          # measured stage times (the 3-part int8 SmolLM2 shards,
                                       # 1 torch thread), 3 shards × {3, 4, 6, 8} nodes, 5
                                       # draws, and the devnet's recovery (~4 min, it takes
                                       # /tmp/planet-devnet.lock itself: do not wrap it in flock)
    python bench/placement.py --recovery-from LOG   # the recovery figure from an earlier
                                       # `pytest tests/e2e/test_rebalance_devnet.py -s` output
    python bench/placement.py --no-devnet          # placement only

Measured (full mode): each shard's decode stage and the client head's logits, seconds per
token, medians over repeats of a greedy decode on this machine at one torch thread (the
fastest class, "4x"). Modelled: the slower classes ("2x", "1x") take 2× and 4× as long per
stage; the committee's `/nodes` `speed` is what the verifier's code (node/verifier/speeds.py)
makes of timed circuits (head + stages + hops), every combination of one node per shard timed
once (bench/_placement_sim.py says exactly how); the pool's throughput is min over shards of
the summed own rates of its replicas. Each draw picks every machine's class from a fixed-seed
uniform mix of 1x/2x/4x; each draw joins in four orders: as drawn, fastest first, slowest
first, and as drawn in a burst (nobody measured yet). The same placements run four times, on
four speed signals: the verifiers' per-node estimate (the product's rule; unsuffixed metric
names), `_circuit_speeds` the old rule (each node credited its best circuit's speed),
`_known_split_speeds` a diagnostic (the per-node estimate with how a circuit's time divides
between shards, which no circuit timing tells, taken from the truth), and `_oracle_speeds`
each node's own true rate.

Nodes that do not rebalance (`pinned_*`, `silent_*`, `cooling_*` metrics; the per-node
estimate, the headline gain): the same draws and orders with every third drawn machine (the
1st, 4th, 7th) joined and then never moving, registered as pinned (`pinned`), never moving
without saying so (`silent`: an older release), or rebalancing with a 4x longer cooldown
(`cooling`); each with the agents' swap memory (node/agent/swap_memory.py; unsuffixed) and
without it (`_no_memory`: the rule before it). Pool ÷ the best assignment that leaves the
non-moving machines where they joined; swaps led, led again (the same leader, partner and
shards), not followed; passes that never reached a fixed point (`_unconverged`).

Prints one BENCHMARKS.md-shaped JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, median, parse_with_quick
from bench._placement_sim import (
    RULES,
    Machine,
    Outcome,
    Timing,
    best_tok_s,
    machine_key,
    place,
)
from node.agent.placement import DEFAULT_REPLICA_FLOOR
from node.agent.rebalance import RebalancePolicy
from node.procs import exit_process

log = logging.getLogger("bench.placement")
ROOT = Path(__file__).resolve().parent.parent
CLASSES = {"4x": 1.0, "2x": 2.0, "1x": 4.0}  # class -> slowdown against the measured machine
ORDERS = ("drawn", "fastest_first", "slowest_first", "burst")
STILL = ("pinned", "silent", "cooling")  # what every third drawn machine is (stills())
# metric name tails of the speeds the rules see: the verifiers' per-node estimate with every node
# probed alone (the headline), with one circuit's nodes probed, from circuits alone, the old rule
# (each node credited its best circuit), circuits alone told the split, each node's true rate
RULE_TAILS = {
    "nodes": "",
    "probed_one_circuit": "_one_circuit_probed_speeds",
    "fit": "_circuit_fit_speeds",
    "circuits": "_circuit_speeds",
    "split": "_known_split_speeds",
    "own": "_oracle_speeds",
}
# --quick's stage times (s/token): of the order this box measures for the 3-part int8 shards
MODELLED = Timing(shard_s=(0.008, 0.008, 0.008), head_s=0.010, hop_s=0.0)
MAX_NODES = 10  # the exhaustive search tries 3^N assignments: 59,049 at 10
LOCK = "/tmp/planet-devnet.lock"
E2E = "tests/e2e/test_rebalance_devnet.py"
RECOVERY_LINE = re.compile(r"^rebalance_recovery (\{.*\})\s*$", re.MULTILINE)


def measure_timing(quant: str, new_tokens: int, repeats: int, hop_s: float) -> Timing:
    """Per-token seconds of each shard's decode stage and of the client head (embedding +
    logits), medians over `repeats` greedy decodes of `new_tokens` tokens at 1 torch thread."""
    import torch

    from harness.shard_cache import prepared_manifest
    from node.model.head import ClientHead
    from node.model.shard import ShardModel

    torch.set_num_threads(1)
    manifest = prepared_manifest(parts=3, quant=quant)
    head = ClientHead.load(manifest, device="cpu")
    shards = [ShardModel.load(manifest, k, device="cpu") for k in range(3)]
    stage_runs: list[list[float]] = [[] for _ in shards]
    head_runs: list[float] = []
    with torch.inference_mode():
        for repeat in range(repeats):
            ids = head.encode("The history of the printing press begins with")
            caches = [s.new_cache() for s in shards]
            hidden = head.embed(ids)
            positions = torch.arange(len(ids))
            stage = [0.0] * len(shards)
            in_head = 0.0
            for step in range(new_tokens + 1):
                for k, (shard, cache) in enumerate(zip(shards, caches, strict=True)):
                    t0 = time.perf_counter()
                    hidden = shard.forward(hidden, positions, cache)
                    if step:  # the prefill is not a decode step
                        stage[k] += time.perf_counter() - t0
                t0 = time.perf_counter()
                token = int(head.logits(hidden[0, -1]).argmax())
                hidden = head.embed([token])
                if step:
                    in_head += time.perf_counter() - t0
                positions = torch.tensor([len(ids) + step])
            for k, seconds in enumerate(stage):
                stage_runs[k].append(seconds / new_tokens)
            head_runs.append(in_head / new_tokens)
            log.info(
                "repeat %d: stages %s ms, head %.2f ms per token", repeat,
                [round(1000 * s / new_tokens, 2) for s in stage], 1000 * in_head / new_tokens,
            )  # fmt: skip
    return Timing(
        shard_s=tuple(median(runs) for runs in stage_runs), head_s=median(head_runs), hop_s=hop_s
    )


def draw(seed: int, nodes: int) -> list[Machine]:
    """`nodes` machines, each of a class drawn from the fixed-seed uniform 1x/2x/4x mix."""
    rng = random.Random(seed * 1000 + nodes)
    return [Machine(machine_key(i), CLASSES[rng.choice(list(CLASSES))]) for i in range(nodes)]


def ordered(machines: list[Machine], order: str) -> list[Machine]:
    if order == "fastest_first":
        return sorted(machines, key=lambda m: m.slowdown)
    if order == "slowest_first":
        return sorted(machines, key=lambda m: -m.slowdown)
    return list(machines)


def scenarios(
    timing: Timing, sizes: list[int], draws: int, floor: int, gains: list[int]
) -> tuple[dict[str, Any], list[str]]:
    """Every draw × size × order through the rules, with the committee's speeds (the per-node
    estimate: the headline; the old circuit rule) and with the nodes' own (oracle),
    rebalancing at each of `gains` (the first: the headline's; the others on the same machines
    and stage times, side by side); metrics, and one line per headline placement below 0.9 of
    the best."""
    headline: dict[tuple[int, str], list[float]] = {}
    runs: dict[str, list[float]] = {}
    moves: dict[str, int] = {}
    unconverged = 0
    notes: list[str] = []
    for nodes in sizes:
        for seed in range(draws):
            drawn = draw(seed, nodes)
            best, best_at = best_tok_s(timing, drawn)
            floored, _ = best_tok_s(timing, drawn, need=min(floor, nodes // timing.shards))
            for order, gain, rule in itertools.product(ORDERS, gains, RULES):
                line = ordered(drawn, order)
                policy = RebalancePolicy(gain_percent=gain)
                outcome = place(
                    timing, line, burst=order == "burst", rule=rule, floor=floor,
                    policy=policy,
                )  # fmt: skip
                tail = RULE_TAILS[rule] + (f"_gain_{gain}" if gain != gains[0] else "")
                named = [(f"ratio_placement_vs_best{tail}", outcome.final_tok_s / best)]
                if gain == gains[0]:
                    named += [
                        (f"ratio_placement_vs_best_floored{tail}", outcome.final_tok_s / floored),
                        (f"ratio_join_only_vs_best{tail}", outcome.joined_tok_s / best),
                    ]
                for name, value in named:
                    runs.setdefault(name, []).append(value)
                moves[tail] = moves.get(tail, 0) + outcome.moves
                unconverged += not outcome.converged
                if rule != RULES[0] or gain != gains[0]:
                    continue
                moves["_max"] = max(moves.get("_max", 0), outcome.moves)
                headline.setdefault((nodes, order), []).append(outcome.final_tok_s / best)
                if outcome.final_tok_s < 0.9 * best:
                    notes.append(_shortfall(timing, line, outcome.final, best_at, order, seed))
    metrics: dict[str, Any] = {}
    for (nodes, order), values in headline.items():
        name = f"ratio_placement_vs_best_{timing.shards}s_{nodes}n_{order}"
        metrics[name] = round(min(values), 3)
    for name, values in runs.items():
        metrics[f"{name}_min"] = round(min(values), 3)
        metrics[f"{name}_median"] = round(statistics.median(values), 3)
    metrics["placements"] = len(runs["ratio_placement_vs_best"])
    for name, values in runs.items():
        if name.startswith("ratio_placement_vs_best"):  # _floored: ÷ the best keeping the floor
            below = name.replace("ratio_placement_vs_best", "placements_below_0_9")
            metrics[below] = sum(1 for v in values if v < 0.9)
    metrics["rebalance_moves_max"] = moves.pop("_max")
    for tail, count in moves.items():
        metrics[f"rebalance_moves_total{tail}"] = count
    metrics["rebalance_unconverged"] = unconverged
    return metrics, notes


def stills(timing: Timing, sizes: list[int], draws: int, floor: int, gain: int) -> dict[str, Any]:
    """Every draw × size × order with every third drawn machine pinned, silent or cooling
    (`STILL`), with the swap memory and without it: metrics (the module docstring)."""
    runs: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    policy = RebalancePolicy(gain_percent=gain)
    bests: dict[tuple[Any, ...], float] = {}
    for nodes, seed in itertools.product(sizes, range(draws)):
        drawn = draw(seed, nodes)
        chosen = frozenset(m.key for i, m in enumerate(drawn) if i % 3 == 0)
        for order, still, memory in itertools.product(ORDERS, STILL, (True, False)):
            line = ordered(drawn, order)
            kept = {"pinned": {"pinned": chosen}, "silent": {"silent": chosen}}
            outcome = place(
                timing, line, burst=order == "burst", floor=floor, policy=policy,
                memory=memory, cooling=chosen if still == "cooling" else frozenset(),
                **kept.get(still, {}),
            )  # fmt: skip
            fixed = {} if still == "cooling" else {k: outcome.joined[k] for k in chosen}
            need = min(floor, nodes // timing.shards)
            best, floored = (
                _best(bests, timing, drawn, fixed, n) for n in (0, need)
            )  # fmt: skip
            tail = "" if memory else "_no_memory"
            for name, value in (("best", best), ("best_floored", floored)):
                runs.setdefault(f"{still}_ratio_vs_{name}{tail}", []).append(
                    outcome.final_tok_s / value
                )
            for name, value in _still_counts(outcome, best, floored).items():
                counts[f"{still}_{name}{tail}"] = counts.get(f"{still}_{name}{tail}", 0) + value
    metrics: dict[str, Any] = {}
    for name, values in runs.items():
        metrics[f"{name}_min"] = round(min(values), 3)
        metrics[f"{name}_median"] = round(statistics.median(values), 3)
    metrics.update(counts)
    return metrics


def _best(
    known: dict[tuple[Any, ...], float],
    timing: Timing,
    drawn: list[Machine],
    fixed: dict[str, int],
    need: int,
) -> float:
    """`best_tok_s` of the machines with `fixed` ones held where they are, computed once."""
    seen = (tuple(drawn), tuple(sorted(fixed.items())), need)
    if seen not in known:
        known[seen] = best_tok_s(timing, drawn, need=need, fixed=fixed)[0]
    return known[seen]


def _still_counts(outcome: Outcome, best: float, floored: float) -> dict[str, int]:
    return {
        "placements_below_0_9": int(outcome.final_tok_s < 0.9 * best),
        "placements_below_0_9_floored": int(outcome.final_tok_s < 0.9 * floored),
        "rebalance_moves_total": outcome.moves,
        "swaps_led": outcome.swaps_led,
        "swaps_led_again": outcome.swaps_led_again,
        "swaps_unfollowed": outcome.swaps_unfollowed,
        "unconverged": int(not outcome.converged),
    }


def _shortfall(
    timing: Timing,
    line: list[Machine],
    final: dict[str, int],
    best_at: dict[str, int],
    order: str,
    seed: int,
) -> str:
    def shards(assign: dict[str, int]) -> list[list[str]]:
        named = {m.key: f"{4 / m.slowdown:.0f}x" for m in line}
        return [[named[m.key] for m in line if assign[m.key] == s] for s in range(timing.shards)]

    return (
        f"{len(line)} nodes, draw {seed}, {order}: the rule ends at {shards(final)}, "
        f"the best is {shards(best_at)}"
    )


def recovery(log_text: str) -> dict[str, Any] | None:
    """The `rebalance_recovery {...}` line of the e2e test's output as metrics, or None."""
    found = RECOVERY_LINE.search(log_text)
    if found is None:
        return None
    figures = json.loads(found[1])
    return {
        "shard_recovery_s": figures["short_to_served_s"],
        "shard_recovery_stop_to_served_s": figures["stop_to_served_s"],
        "shard_recovery_stop_to_short_s": figures["stop_to_short_s"],
        "shard_recovery_questions": figures["questions"],
        "shard_recovery_answered": figures["answered"],
    }


NO_RECOVERY = dict.fromkeys(
    (
        "shard_recovery_s",
        "shard_recovery_stop_to_served_s",
        "shard_recovery_stop_to_short_s",
        "shard_recovery_questions",
        "shard_recovery_answered",
    )
)


def run_recovery_test(timeout_s: float) -> tuple[str, bool]:
    """Run the e2e test once under the devnet lock (it brings up the shared devnet): its output
    and whether it passed (it prints its times before it checks the answers)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    pytest = [sys.executable, "-m", "pytest", E2E, "-q", "-x", "-s", "-p", "no:cacheprovider"]
    argv = ["flock", LOCK, *pytest]
    log.info("recovery: %s (waits for the devnet lock)", " ".join(argv))
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        log.error("%s", (done.stdout + done.stderr)[-4000:])
    return done.stdout + done.stderr, done.returncode == 0


def sizes_arg(text: str) -> list[int]:
    """`--sizes`: comma-separated node counts, each in [3, MAX_NODES]."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 3,4,6,8") from None
    if not sizes or not all(3 <= n <= MAX_NODES for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: each size 3-{MAX_NODES} (3^N assignments)")
    return sizes


def _read_saved(path: Path) -> dict[str, Any] | None:
    """The recovery figures of a saved e2e output, or None after an `error:` and a `hint:`."""
    try:
        found = recovery(path.read_text(encoding="utf-8"))
    except OSError as error:
        print(f"error: cannot read {path}: {error.strerror}", file=sys.stderr)
        print(f"hint: save the output of `pytest {E2E} -q -x -s`", file=sys.stderr)
        return None
    if found is None:
        print(f"error: no `rebalance_recovery` line in {path}", file=sys.stderr)
        print(f"hint: save the output of `pytest {E2E} -q -x -s`", file=sys.stderr)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=sizes_arg, default="3,4,6,8",
                        help=f"nodes per pool, comma-separated (3-{MAX_NODES})")  # fmt: skip
    parser.add_argument("--draws", type=int, default=5, help="seeded draws of the speed mix")
    parser.add_argument("--measure", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the stage times (else the modelled ones)")  # fmt: skip
    parser.add_argument("--quant", default="int8", choices=("int8", "none"))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--floor", type=int, default=DEFAULT_REPLICA_FLOOR,
                        help="the chain's replica_floor (genesis default 2)")  # fmt: skip
    parser.add_argument("--gain-percent", type=int, default=RebalancePolicy().gain_percent,
                        help="rebalancing's `weakest` gain, percent (the policy's)")  # fmt: skip
    parser.add_argument("--compare-gains", type=lambda t: [int(g) for g in t.split(",") if g],
                        default=[25, 5], help="other gain thresholds, side by side")  # fmt: skip
    parser.add_argument("--hop-ms", type=float, default=0.0, help="modelled per-stage hop")
    parser.add_argument("--devnet", action=argparse.BooleanOptionalAction, default=True,
                        help="time the devnet's recovery of a lost shard (e2e test)")  # fmt: skip
    parser.add_argument("--recovery-from", type=Path, default=None,
                        help="the e2e test's output to read the recovery figure from")  # fmt: skip
    parser.add_argument("--devnet-timeout-s", type=float, default=1200.0)
    parser.add_argument("--devnet-log", type=Path, default=None,
                        help="save the e2e test's whole output here")  # fmt: skip
    quick = {"sizes": "3,4", "draws": 1, "measure": False, "devnet": False}
    args = parse_with_quick(parser, quick, argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    sizes: list[int] = args.sizes
    saved = _read_saved(args.recovery_from) if args.recovery_from is not None else None
    if args.recovery_from is not None and saved is None:
        return 2
    hop_s = args.hop_ms / 1000
    started = time.perf_counter()
    if args.measure:
        timing = measure_timing(args.quant, args.new_tokens, args.repeats, hop_s)
    else:
        timing = Timing(MODELLED.shard_s, MODELLED.head_s, hop_s)
    metrics: dict[str, Any] = {
        "stage_times_measured": int(args.measure),
        **{f"stage_ms_shard_{k}_1t": round(1000 * s, 3) for k, s in enumerate(timing.shard_s)},
        "head_ms_1t": round(1000 * timing.head_s, 3),
        **{
            f"stage_tok_s_{name}": round(1 / (slow * statistics.fmean(timing.shard_s)), 1)
            for name, slow in CLASSES.items()
        },
    }
    gains = [args.gain_percent, *(g for g in args.compare_gains if g != args.gain_percent)]
    placed, notes = scenarios(timing, sizes, args.draws, args.floor, gains)
    metrics.update(placed)
    metrics.update(stills(timing, sizes, args.draws, args.floor, args.gain_percent))
    metrics["placement_wall_s"] = round(time.perf_counter() - started, 2)
    for note in notes:
        log.info("below 0.9 (committee speeds, per-node estimate): %s", note)
    source = "none"
    found: dict[str, Any] | None = None
    if saved is not None:
        found = saved
        source = f"read from {args.recovery_from}: the output of {E2E}"
    elif args.devnet:
        output, passed = run_recovery_test(args.devnet_timeout_s)
        if args.devnet_log is not None:
            args.devnet_log.write_text(output, encoding="utf-8")
        found = recovery(output)
        verdict = "passed" if passed else "failed"
        source = f"{'measured' if found else 'not measured'} now: {E2E} ({verdict})"
        metrics["shard_recovery_test_passed"] = int(passed)
    metrics.update(found or NO_RECOVERY)
    metrics["shard_recovery_measured"] = int(found is not None)
    result = {
        "bench": "placement",
        "machine": machine(),
        "config": {
            "shards": timing.shards,
            "sizes": sizes,
            "draws": args.draws,
            "classes": {name: f"stage time × {slow:g}" for name, slow in CLASSES.items()},
            "orders": list(ORDERS),
            "stage_times": f"measured: smollm2-135m-3p-{args.quant}, 1 torch thread"
            if args.measure
            else "modelled",
            "new_tokens": args.new_tokens if args.measure else 0,
            "repeats": args.repeats if args.measure else 0,
            "hop_ms": args.hop_ms,
            "replica_floor": args.floor,
            "rebalance": "node/agent/rebalance.py decide, to a fixed point",
            "stills": "every third drawn machine pinned / silent / cooling (4x cooldown), "
            "with and without the swap memory",
            "gain_percent": args.gain_percent,
            "compare_gains": gains[1:],
            "recovery": source,
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {
            "ratio_placement_vs_best_min": {"op": ">=", "value": 0.9},
            "shard_recovery_s": {"op": "<=", "value": 60},
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_process(main)
