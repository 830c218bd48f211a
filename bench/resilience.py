"""Resilience of a network of volunteer nodes (issue 27): one JSON object (BENCHMARKS.md).

Real `planet node serve` processes on loopback (harness/replica_net.py): SmolLM2 int8 in 2
shards, two nodes per shard, the client (node/client/failover.py) in this process.

1. **Recovery**: a node serving a hop is killed (-9) mid-answer; `failover_recovery_ms` is the
   client's time from seeing the failure to the next token (replacement chosen, session opened,
   history replayed), against the replay length (prompts of several lengths).
2. **Churn**: `--churn-concurrency` questions at once for `--churn-s` seconds, quiet, then
   again while a random node is killed and restarted every `--churn-every-s`: aggregate tok/s
   under churn ÷ quiet, failed questions, answers that differ from the quiet ones.
3. **Slow node**: a second network whose node 2 (shard 1) is 3× slower than its replica
   (tests/doubles/slow_node.py); `--slow-questions` questions one after another with the
   load-aware choice (node/client/costs.py) and with uniform random choice: p50/p99 of the
   first-token and inter-token latency, after `--slow-warmup` questions not counted (a fresh
   client has seen no node: it tries the slow one too, then backs its trials off: 120 s,
   240 s, … 600 s apart), and how many counted questions went through the slow node.
4. **Join download**: shard 0 fetched by chunks (node/model/fetch.py) from 1 and from 3 nodes
   serving it (each node rate-limits one caller to `--chunk-rate-mb` MiB/s).

    python bench/resilience.py            # ~10 min on 2 cores
    python bench/resilience.py --quick    # a smoke run (tests/integration/test_bench_smoke.py)

`--quick` runs every phase once, small, on ONE network of 3 nodes (shard 0, shard 1 twice, the
second shard-1 node slowed): shard 1 downloaded from 1 and from 2 peers; one counted question
load-aware and one random after one warm-up; one kill -9 mid-answer and its failover, the killed
node restarted while the quiet answers and the quiet load run (the smoke proves the path, not the
figure); 1 s of quiet load and 1 s of churn with one kill of a replicated node half a second in
(not restarted: the network closes next, and the recovery phase already restarted a killed
node). 4 new tokens per answer.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick
from harness.replica_net import ReplicaNet, chunked_model
from harness.shard_cache import prepared_manifest
from node.client.costs import CostBook
from node.client.failover import FailoverPolicy
from node.model.fetch import fetch_shard
from node.model.manifest import Manifest
from node.procs import exit_process

log = logging.getLogger("bench.resilience")

WORDS = ["the", "river", "runs", "past", "the", "old", "town", "and", "the", "bridge"]
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Why is the sky blue?",
    "Write one sentence about rivers.",
]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return float(ordered[rank - 1])


def long_prompt(words: int) -> str:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return f"Summarise this text in one sentence: {body}"


# -- 1. recovery ---------------------------------------------------------------------------------


async def recovery(
    net: ReplicaNet, head: Any, args: argparse.Namespace, *, wait_restart: bool = True
) -> dict[str, Any]:
    """Kills a node serving a hop mid-answer (`--kills` per prompt length) and restarts it
    (waiting until it is healthy unless not `wait_restart`). Only shards with a replica are
    hit."""
    rng = random.Random(27)
    rows: list[dict[str, float]] = []
    shards = [r.shard for r in net.replicas]
    replicated = sorted({s for s in shards if shards.count(s) > 1})
    for words in args.prompt_words:
        ids = head.chat_ids([{"role": "user", "content": long_prompt(words)}])
        for _ in range(args.kills):
            shard = replicated[rng.randrange(len(replicated))]
            kill_at = rng.randint(2, max(2, args.tokens - 2))
            killed: list[int] = []

            async def on_token(
                count: int, source: Any, at: int = kill_at, s: int = shard, out: list[int] = killed
            ) -> None:
                if count == at:
                    index = net.index_of(source.current[s].url)
                    out.append(index)
                    net.kill(index)

            _, timings, _ = await net.answer(
                head, ids, max_new_tokens=args.tokens, on_token=on_token
            )
            for failover in timings.failovers:
                rows.append({"replayed": failover.replayed, "ms": failover.recovery_ms})
            for index in killed:
                await asyncio.to_thread(net.restart, index, wait=wait_restart)
    by_length: dict[str, float] = {}
    for bucket, replayed in _groups(rows):
        values = [r["ms"] for r in rows if r["replayed"] in replayed]
        by_length[f"failover_recovery_ms_p50_replay_{bucket}"] = round(percentile(values, 50), 1)
    all_ms = [r["ms"] for r in rows]
    return {
        "failover_recovery_ms_p50": round(percentile(all_ms, 50), 1),
        "failover_recovery_ms_p99": round(percentile(all_ms, 99), 1),
        "failovers": len(rows),
        **by_length,
        "failover_points": [[int(r["replayed"]), round(r["ms"], 1)] for r in rows],
    }


def _groups(rows: list[dict[str, float]]) -> list[tuple[int, set[float]]]:
    """Replay lengths grouped to the nearest 50 positions: (bucket, lengths)."""
    buckets: dict[int, set[float]] = {}
    for row in rows:
        buckets.setdefault(int(row["replayed"] // 50 * 50), set()).add(row["replayed"])
    return sorted(buckets.items())


# -- 2. churn ------------------------------------------------------------------------------------


async def load(
    net: ReplicaNet,
    head: Any,
    args: argparse.Namespace,
    quiet: dict[str, list[int]],
    *,
    churn: bool,
) -> dict[str, Any]:
    rng = random.Random(28)
    ids = {q: head.chat_ids([{"role": "user", "content": q}]) for q in QUESTIONS}
    tokens = 0
    failed = wrong = failovers = 0
    kills = 0
    shards = [r.shard for r in net.replicas]
    killable = [i for i, s in enumerate(shards) if shards.count(s) > 1]  # a replica answers on

    async def killer(stop: asyncio.Event) -> None:
        nonlocal kills
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), args.churn_every_s)
            except TimeoutError:
                index = killable[rng.randrange(len(killable))]
                net.kill(index)
                kills += 1
                if args.quick:  # one kill, no restart: the network closes next, and the
                    return  # recovery phase already restarted a killed node in this run
                await asyncio.to_thread(net.restart, index)

    async def asker(worker: int, deadline: float) -> None:
        nonlocal tokens, failed, wrong, failovers
        async with aiohttp.ClientSession() as http:
            turn = 0
            while time.monotonic() < deadline:
                question = QUESTIONS[(worker + turn) % len(QUESTIONS)]
                turn += 1
                try:
                    answer, timings, _ = await net.answer(
                        head,
                        ids[question],
                        max_new_tokens=args.tokens,
                        http=http,
                        policy=FailoverPolicy(stall_s=15.0),
                    )
                except Exception as error:  # a failed question is what this counts
                    log.warning("question failed: %r", error)
                    failed += 1
                    continue
                tokens += len(answer)
                failovers += len(timings.failovers)
                wrong += answer != quiet[question]

    stop = asyncio.Event()
    task = asyncio.create_task(killer(stop)) if churn else None
    started = time.monotonic()
    await asyncio.gather(*(asker(w, started + args.churn_s) for w in range(args.churn_concurrency)))
    elapsed = time.monotonic() - started
    stop.set()
    if task is not None:
        await task
    return {
        "tok_s": tokens / elapsed,
        "failed": failed,
        "wrong": wrong,
        "failovers": failovers,
        "kills": kills,
    }


# -- 3. slow node --------------------------------------------------------------------------------


async def latencies(
    net: ReplicaNet, head: Any, args: argparse.Namespace, book: CostBook, slow_url: str
) -> dict:
    """First-token and inter-token latency over `--slow-questions` questions asked one after
    another with `book`, after `--slow-warmup` questions that are not counted (a fresh client
    has seen no node yet: it tries them), and how many counted questions used the slow node."""
    first: list[float] = []
    gaps: list[float] = []
    through_slow = 0
    async with aiohttp.ClientSession() as http:
        for turn in range(args.slow_warmup + args.slow_questions):
            question = QUESTIONS[turn % len(QUESTIONS)]
            ids = head.chat_ids([{"role": "user", "content": question}])
            stamps: list[float] = []

            async def on_token(count: int, source: Any, marks: list[float] = stamps) -> None:
                marks.append(time.perf_counter())

            _, timings, source = await net.answer(
                head,
                ids,
                max_new_tokens=args.tokens,
                http=http,
                on_token=on_token,
                source_args={"costs": book},
            )
            if turn < args.slow_warmup:
                continue
            first.append(timings.prefill_ms)
            gaps += [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
            through_slow += any(hop.url == slow_url for c in source.circuits for hop in c)
    return {
        "first_token_ms_p50": percentile(first, 50),
        "first_token_ms_p99": percentile(first, 99),
        "inter_token_ms_p50": percentile(gaps, 50),
        "inter_token_ms_p99": percentile(gaps, 99),
        "questions_through_slow_node": through_slow,
    }


# -- 4. join download ----------------------------------------------------------------------------


async def download(net: ReplicaNet, peers: int, root: Path, shard: int = 0) -> float:
    manifest = net.manifest
    entry = manifest.shard(shard)
    urls = [r.url for r in net.replicas if r.shard == shard][:peers]
    target = root / f"download-{shard}-{peers}" / entry.file
    target.parent.mkdir(parents=True)
    started = time.monotonic()
    await fetch_shard(entry, target, urls)
    return time.monotonic() - started


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per answer (24)")
    parser.add_argument(
        "--prompt-words",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[8, 120, 360],
        help="prompt lengths in words for the recovery runs (8,120,360)",
    )
    parser.add_argument("--kills", type=int, default=4, help="kills per prompt length (4)")
    parser.add_argument("--churn-s", type=float, default=120.0, help="seconds per load run")
    parser.add_argument("--churn-concurrency", type=int, default=16)
    parser.add_argument("--churn-every-s", type=float, default=10.0)
    parser.add_argument("--slow-questions", type=int, default=16, help="counted (16)")
    parser.add_argument(
        "--slow-warmup",
        type=int,
        default=2,
        help="questions first, not counted: a fresh client tries each node it has not seen (2)",
    )
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--chunk-rate-mb", type=float, default=32.0)
    args = parse_with_quick(
        parser,
        {
            "tokens": 4,
            "prompt_words": [8],
            "kills": 1,
            "churn_s": 1.0,
            "churn_concurrency": 2,
            "churn_every_s": 0.5,
            "slow_questions": 1,
            "slow_warmup": 1,
            "chunk_rate_mb": 256.0,
        },
        argv,
    )
    if args.slow_questions < 1 or args.slow_warmup < 0:
        parser.error("--slow-questions must be at least 1 and --slow-warmup at least 0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    metrics: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="planet-resilience-") as tmp:
        root = Path(tmp)
        manifest = chunked_model(prepared_manifest(parts=2, quant="int8"), root / "model")
        rate = ("--chunk-rate-mb", f"{args.chunk_rate_mb:g}")
        from node.model.head import ClientHead  # lazy: torch

        head = ClientHead.load(manifest, device="cpu")
        if args.quick:
            net = ReplicaNet.start(
                root / "net", manifest, [0, 1, 1], slow={2: args.slow_factor}, extra_args=rate
            )
            try:
                metrics.update(quick_phases(net, head, args, root))
            finally:
                net.close()
        else:
            metrics.update(full_phases(manifest, head, args, root, rate))
    config = {
        "model": "smollm2-135m-2p-int8",
        "nodes": "shard 0, shard 1 ×2, the second slowed; one network for every phase"
        if args.quick
        else "shard 0 ×3, shard 1 ×2 (slow run: 2 + 2, one of shard 1 slowed)",
        **{k: v for k, v in vars(args).items()},
    }
    print(
        json.dumps(
            {
                "bench": "resilience",
                "machine": machine(),
                "config": config,
                "metrics": metrics,
                "targets": {
                    "failed_questions_churn": {"op": "==", "value": 0},
                    "wrong_answers_churn": {"op": "==", "value": 0},
                    "failover_recovery_ms_p99": {"op": "<=", "value": "2000 + replay"},
                    "ratio_p99_load_aware_vs_random_slow_node": {"op": "<=", "value": 0.6},
                },
            }
        )
    )
    return 0


def quick_phases(
    net: ReplicaNet, head: Any, args: argparse.Namespace, root: Path
) -> dict[str, Any]:
    """--quick: every phase once, small, on one network [0, 1, 1 slowed] (the module doc)."""
    metrics: dict[str, Any] = {}
    log.info("join download of shard 1 from 1 and 2 peers")
    one = asyncio.run(download(net, 1, root, shard=1))
    two = asyncio.run(download(net, 2, root, shard=1))
    metrics["shard_download_s_1_peers"] = round(one, 2)
    metrics["shard_download_s_2_peers"] = round(two, 2)
    metrics["ratio_shard_download_2_vs_1_peers"] = round(two / one, 3)
    metrics["shard_bytes"] = net.manifest.shard(1).size
    log.info("slow node: load-aware vs random")
    slow_url = net.replicas[2].url
    aware = asyncio.run(latencies(net, head, args, CostBook(), slow_url))
    uniform = asyncio.run(latencies(net, head, args, CostBook(near=1e9, slack_s=1e9), slow_url))
    metrics.update(_slow_metrics(aware, uniform, args))
    log.info("recovery after kill -9 (the killed node restarts during the quiet runs)")
    metrics.update(asyncio.run(recovery(net, head, args, wait_restart=False)))
    quiet = _quiet_answers(net, head, args)
    calm = asyncio.run(load(net, head, args, quiet, churn=False))
    net.wait()
    log.info("churn: one kill")
    churn = asyncio.run(load(net, head, args, quiet, churn=True))
    metrics.update(_load_metrics(calm, churn))
    return metrics


def _quiet_answers(net: ReplicaNet, head: Any, args: argparse.Namespace) -> dict[str, list[int]]:
    log.info("quiet answers")
    quiet = {}
    for question in QUESTIONS:
        ids = head.chat_ids([{"role": "user", "content": question}])
        quiet[question] = asyncio.run(net.answer(head, ids, max_new_tokens=args.tokens))[0]
    return quiet


def _load_metrics(calm: dict[str, Any], churn: dict[str, Any]) -> dict[str, Any]:
    return {
        "tok_s_quiet": round(calm["tok_s"], 2),
        "tok_s_churn": round(churn["tok_s"], 2),
        "ratio_tok_s_churn_vs_quiet": round(churn["tok_s"] / max(calm["tok_s"], 1e-9), 3),
        "failed_questions_churn": churn["failed"] + calm["failed"],
        "wrong_answers_churn": churn["wrong"] + calm["wrong"],
        "failovers_churn": churn["failovers"],
        "kills_churn": churn["kills"],
    }


def _slow_metrics(aware: dict, uniform: dict, args: argparse.Namespace) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for name, value in aware.items():
        metrics[f"{name}_load_aware"] = round(value, 1)
    for name, value in uniform.items():
        metrics[f"{name}_random"] = round(value, 1)
    metrics["questions_slow_node_counted"] = args.slow_questions
    metrics["ratio_p99_load_aware_vs_random_slow_node"] = round(
        aware["inter_token_ms_p99"] / max(uniform["inter_token_ms_p99"], 1e-9), 3
    )
    metrics["ratio_first_token_p99_load_aware_vs_random_slow_node"] = round(
        aware["first_token_ms_p99"] / max(uniform["first_token_ms_p99"], 1e-9), 3
    )
    return metrics


def full_phases(
    manifest: Path, head: Any, args: argparse.Namespace, root: Path, rate: tuple[str, str]
) -> dict[str, Any]:
    """The full run: a network of 5 for download, recovery and churn, then one of 4 with a
    slow node."""
    metrics: dict[str, Any] = {}
    net = ReplicaNet.start(root / "net", manifest, [0, 0, 1, 1, 0], extra_args=rate)
    try:
        log.info("join download from 1 and 3 peers")
        one = asyncio.run(download(net, 1, root))
        three = asyncio.run(download(net, 3, root))
        metrics["shard_download_s_1_peers"] = round(one, 2)
        metrics["shard_download_s_3_peers"] = round(three, 2)
        metrics["ratio_shard_download_3_vs_1_peers"] = round(three / one, 3)
        metrics["shard_bytes"] = Manifest.load(manifest).shard(0).size
        log.info("recovery after kill -9")
        metrics.update(asyncio.run(recovery(net, head, args)))
        quiet = _quiet_answers(net, head, args)
        log.info("load, quiet then churn")
        calm = asyncio.run(load(net, head, args, quiet, churn=False))
        churn = asyncio.run(load(net, head, args, quiet, churn=True))
    finally:
        net.close()
    metrics.update(_load_metrics(calm, churn))
    log.info("one node %gx slower: load-aware vs random", args.slow_factor)
    slow = ReplicaNet.start(root / "slow", manifest, [0, 0, 1, 1], slow={2: args.slow_factor})
    try:
        slow_url = slow.replicas[2].url
        aware = asyncio.run(latencies(slow, head, args, CostBook(), slow_url))
        random_book = CostBook(near=1e9, slack_s=1e9)
        uniform = asyncio.run(latencies(slow, head, args, random_book, slow_url))
    finally:
        slow.close()
    metrics.update(_slow_metrics(aware, uniform, args))
    return metrics


if __name__ == "__main__":
    exit_process(main)
