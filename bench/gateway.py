"""Gateway benchmark: overhead per token, concurrency, and a hostile mix of clients.

What the gateway costs per token against the bare circuit client, how it holds 8 and 32
concurrent paid questions, and whether a hostile mix of clients gets anything unpaid — one JSON
object on stdout, logs on stderr.

    .venv/bin/python bench/gateway.py    # 48 tokens × 3 repeats; 8 and 32 concurrent × 32
                                         # tokens; hostile mix of 32
    .venv/bin/python bench/gateway.py --quick    # a smoke run: 4 tokens × 1 repeat, no warm-up;
                                         # 2 concurrent × 4 tokens; hostile mix of 6

The network is real (harness/gateway_net.py): anvil with the contracts, one CometBFT
validator with the committee app, one int8 SmolLM2 node per shard (2 shards; so the gateway's
circuit and the bare client's are the same two nodes), the gateway as its own process. Every
gateway question is paid by its own QueryEscrow deposit (made before the clock starts).

- overhead per token: decode time per token (first token → last token, / tokens − 1) of the
  bare CircuitClient in this process (the transport the gateway drives: node-to-node forwarding)
  vs a streamed gateway answer measured at the HTTP client,
  same prompt, greedy, interleaved repeats, medians;
- concurrency: N streamed questions at once; aggregate completion tok/s over the wall time,
  first-token latency p50/p99 (request sent → first content chunk), failed requests;
- hostile mix: N streamed questions at once (logprobs on, so every token is its own chunk and
  the client can count them), a third of them hang up with a TCP reset at a random point —
  before the first token, mid-answer, or after the last token (before the receipt). Then each
  question's receipt (with its own key; none = released) is compared with the tokens its client
  received: `hostile_mix_tokens_delivered_minus_charged` = Σ max(0, received − charged) must be
  0 (no token reached a client unpaid); `hostile_mix_tokens_charged_not_received` counts tokens
  the gateway wrote into a socket its client had already reset (charged, by the rule that a
  failed write is paid: the nodes did the work); `holds_left_after` = wei the gateway still
  holds for questions in flight once all ended (/health) must be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread
from node.procs import exit_process

log = logging.getLogger("bench.gateway")

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
MESSAGES = [{"role": "user", "content": PROMPT}]
DEPOSIT = 10**16


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


async def bare_per_token_ms(head: Any, urls: list[str], tokens: int) -> float:
    from node.client.circuit import CircuitClient
    from node.client.types import Hop

    stamps: list[float] = []
    hops = [Hop(url, shard) for shard, url in enumerate(urls)]
    async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
        ids = head.chat_ids(MESSAGES)
        async for _ in client.generate(head, ids, max_new_tokens=tokens, stop_on_eos=False):
            stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1)


async def ask(
    http: Any, url: str, key: str, model: str, tokens: int
) -> tuple[bool, float, list[float], int]:
    """(ok, first-token latency ms, content chunk times, completion tokens) of one question."""
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    chunk_times: list[float] = []
    completion = 0
    ok = False
    async with http.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as answer:
        if answer.status != 200:
            log.warning("question refused status=%d body=%s", answer.status, await answer.text())
            return False, 0.0, [], 0
        async for raw in answer.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                ok = True
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                log.warning("question failed mid-stream: %s", chunk["error"])
                return False, 0.0, chunk_times, 0
            if chunk.get("usage"):
                completion = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunk_times.append(time.perf_counter())
    first = (chunk_times[0] - sent) * 1000 if chunk_times else 0.0
    return ok, first, chunk_times, completion


def gateway_per_token_ms(chunk_times: list[float], tokens: int) -> float:
    # one content chunk per token unless text was held back; use the token count for the rate
    return (chunk_times[-1] - chunk_times[0]) * 1000 / max(1, tokens - 1)


async def concurrent(net: Any, keys: list[str], model: str, tokens: int) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=600), connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(ask(http, net.gateway_url, key, model, tokens) for key in keys),
            return_exceptions=True,
        )
        wall = time.perf_counter() - start
    good = [r for r in results if not isinstance(r, BaseException) and r[0]]
    failed = len(results) - len(good)
    for r in results:
        if isinstance(r, BaseException):
            log.warning("question raised %r", r)
    firsts = [r[1] for r in good]
    total = sum(r[3] for r in good)
    return {
        "aggregate_tok_s": round(total / wall, 2),
        "first_token_ms_p50": round(percentile(firsts, 50), 1),
        "first_token_ms_p99": round(percentile(firsts, 99), 1),
        "failed_requests": failed,
        "wall_s": round(wall, 2),
        "completion_tokens": total,
    }


HANG_UPS = ("before_first_token", "mid_answer", "after_last_token")


async def hostile_question(
    url: str, key: str, model: str, tokens: int, hang_up: str | None, rng: random.Random
) -> int:
    """One streamed question on a raw socket; hangs up (TCP reset) as `hang_up` says. Returns
    the tokens this client received."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": tokens,
            "temperature": 0,
            "logprobs": True,
            "stream": True,
        }
    ).encode()
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    stop_after = {
        None: tokens + 1,  # stays to the end
        "before_first_token": 0,
        "mid_answer": rng.randint(1, max(1, tokens - 1)),
        "after_last_token": tokens,
    }[hang_up]
    if hang_up == "before_first_token":
        await asyncio.sleep(rng.uniform(0, 0.5))
    data = b""
    try:
        while _tokens_in(data) < stop_after:
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
            if b"data: [DONE]" in data:
                break
    finally:
        if hang_up is None:
            writer.close()
        else:
            writer.transport.abort()  # a reset: the gateway sees the client gone at once
    return _tokens_in(data)


def _tokens_in(data: bytes) -> int:
    """Token chunks in an SSE byte stream (with logprobs each token has its own chunk)."""
    count = 0
    for part in data.split(b"data: ")[1:]:
        line = part.split(b"\n", 1)[0].strip()
        if not line.startswith(b"{"):
            continue
        try:
            chunk = json.loads(line)
        except ValueError:
            continue
        for choice in chunk.get("choices") or []:
            count += len((choice.get("logprobs") or {}).get("content") or [])
    return count


async def hostile_mix(
    net: Any, paid: list[tuple[str, bytes]], model: str, tokens: int, seed: int
) -> dict[str, Any]:
    import aiohttp

    rng = random.Random(seed)
    plans: list[str | None] = [None] * len(paid)  # a third hang up, each point in turn
    for slot, index in enumerate(rng.sample(range(len(paid)), len(paid) // 3)):
        plans[index] = HANG_UPS[slot % len(HANG_UPS)]
    start = time.perf_counter()
    received = await asyncio.gather(
        *(
            hostile_question(net.gateway_url, key, model, tokens, plan, rng)
            for (key, _), plan in zip(paid, plans, strict=True)
        )
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        deadline = time.monotonic() + 120
        while True:  # every question ends: charged or released
            async with http.get(f"{net.gateway_url}/health") as answer:
                health = await answer.json()
            if not health["in_flight"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        receipts = []
        for key, query_id in paid:
            async with http.get(
                f"{net.gateway_url}/v1/receipts/0x{query_id.hex()}",
                headers={"Authorization": f"Bearer {key}"},
            ) as answer:
                receipts.append(await answer.json() if answer.status == 200 else None)
    charged = [int(doc["completion_tokens"]) if doc else 0 for doc in receipts]
    wall = time.perf_counter() - start
    unpaid = sum(max(0, r - c) for r, c in zip(received, charged, strict=True))
    extra = sum(max(0, c - r) for r, c in zip(received, charged, strict=True))
    by_plan: dict[str, list[int]] = {}
    for plan, r, c in zip(plans, received, charged, strict=True):
        stats = by_plan.setdefault(plan or "stayed", [0, 0, 0])
        stats[0] += 1
        stats[1] += r
        stats[2] += c
    log.info("hostile mix: %s", by_plan)
    return {
        "hostile_mix_questions": len(paid),
        "hostile_mix_hung_up": sum(1 for p in plans if p),
        "hostile_mix_tokens_received": sum(received),
        "hostile_mix_tokens_charged": sum(charged),
        "hostile_mix_tokens_delivered_minus_charged": unpaid,
        "hostile_mix_tokens_charged_not_received": extra,
        "hostile_mix_released": sum(1 for doc in receipts if doc is None),  # nothing charged
        "hostile_mix_prompt_only": sum(
            1 for doc in receipts if doc and not doc["completion_tokens"]
        ),
        # per hang-up plan, flat (BENCHMARKS.md): hostile_mix_<plan>_{questions,received,charged}
        **{
            f"hostile_mix_{plan}_{field}": value
            for plan, stats in by_plan.items()
            for field, value in zip(("questions", "received", "charged"), stats, strict=True)
        },
        "holds_left_after": int(health["held_wei"]),
        "in_flight_after": int(health["in_flight"]),
        "hostile_mix_wall_s": round(wall, 2),
    }


async def run(net: Any, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from node.model.head import ClientHead
    from node.server.run import configure_torch_threads

    configure_torch_threads(1)
    head = ClientHead.load(net.manifest_path, device="cpu")
    urls = [node.process.url for node in net.nodes]
    model = net.manifest.model_id
    user = net.account("bench-user", ether=1000)
    counts = args.concurrency
    keys = [net.pay(user, DEPOSIT)[0] for _ in range(args.repeats + sum(counts))]
    hostile = [net.pay(user, DEPOSIT) for _ in range(args.hostile)]
    log.info("made %d deposits", len(keys) + len(hostile))
    bare, gateway = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        for _ in range(args.warm_ups):  # connections, caches
            await bare_per_token_ms(head, urls, 4)
        for repeat in range(args.repeats):
            bare.append(await bare_per_token_ms(head, urls, args.tokens))
            ok, _, times, completion = await ask(
                http, net.gateway_url, keys.pop(), model, args.tokens
            )
            if not ok or completion < args.tokens:
                raise RuntimeError(f"the gateway answered {completion} of {args.tokens} tokens")
            gateway.append(gateway_per_token_ms(times, completion))
            log.info("repeat %d bare=%.2f ms gateway=%.2f ms", repeat, bare[-1], gateway[-1])
    metrics: dict[str, Any] = {
        "decode_ms_per_token_bare": round(median(bare), 2),
        "decode_ms_per_token_gateway": round(median(gateway), 2),
        "decode_ms_per_token_bare_spread": spread(bare),
        "decode_ms_per_token_gateway_spread": spread(gateway),
        "gateway_overhead_per_token": round(median(gateway) / median(bare) - 1, 4),
    }
    for count in counts:
        batch, keys = keys[:count], keys[count:]
        result = await concurrent(net, batch, model, args.concurrent_tokens)
        log.info("concurrent %d: %s", count, result)
        metrics[f"aggregate_tok_s_concurrent_{count}"] = result["aggregate_tok_s"]
        metrics[f"first_token_ms_p50_concurrent_{count}"] = result["first_token_ms_p50"]
        metrics[f"first_token_ms_p99_concurrent_{count}"] = result["first_token_ms_p99"]
        metrics[f"failed_requests_concurrent_{count}"] = result["failed_requests"]
        metrics[f"wall_s_concurrent_{count}"] = result["wall_s"]
    mix = await hostile_mix(net, hostile, model, args.concurrent_tokens, args.seed)
    log.info("hostile mix: %s", mix)
    metrics.update(mix)
    return metrics


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("every count must be at least 1")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48, help="tokens per overhead repeat")
    parser.add_argument("--repeats", type=int, default=3, help="overhead repeats")
    parser.add_argument(
        "--concurrent-tokens", type=int, default=32, help="tokens per concurrent question"
    )
    parser.add_argument("--hostile", type=int, default=32, help="questions in the hostile mix")
    parser.add_argument("--seed", type=int, default=24, help="who hangs up where")
    parser.add_argument(
        "--concurrency",
        type=_counts,
        default=(8, 32),
        help="concurrent questions, comma-separated (default 8,32)",
    )
    parser.add_argument(
        "--warm-ups", type=int, default=1, help="bare 4-token questions first, untimed (1)"
    )
    args = parse_with_quick(
        parser,
        {
            "tokens": 4,
            "repeats": 1,
            "concurrent_tokens": 4,
            "hostile": 6,
            "concurrency": (2,),
            "warm_ups": 0,
        },
    )
    if args.tokens < 2 or args.repeats < 1 or args.hostile < 0:
        parser.error("--tokens must be at least 2, --repeats at least 1, --hostile at least 0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from harness.gateway_net import GatewayNet, prepared_manifest

    manifest = prepared_manifest(parts=2, quant="int8")
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as run_dir:
        net = GatewayNet.start(Path(run_dir), manifest, staked=[0, 1], unstaked=[])
        try:
            metrics = asyncio.run(run(net, args))
        finally:
            net.close()
    counts = list(args.concurrency)
    targets: dict[str, Any] = {
        "gateway_overhead_per_token": {"op": "<=", "value": 0.05},
        "hostile_mix_tokens_delivered_minus_charged": {"op": "==", "value": 0},
        "holds_left_after": {"op": "==", "value": 0},
    }
    for count in counts:
        targets[f"failed_requests_concurrent_{count}"] = {"op": "==", "value": 0}
    print(
        json.dumps(
            {
                "bench": "gateway",
                "machine": machine(),
                "config": {
                    "model": "smollm2-135m",
                    "shards": 2,
                    "quant": "int8",
                    "transport": "circuit (node-to-node WebSocket forwarding), bare and gateway",
                    "tokens": args.tokens,
                    "repeats": args.repeats,
                    "warm_ups": args.warm_ups,
                    "quick": args.quick,
                    "concurrent_tokens": args.concurrent_tokens,
                    "concurrency": counts,
                    "hostile_mix": {
                        "questions": args.hostile,
                        "hang_up": "a third, TCP reset: " + ", ".join(HANG_UPS),
                        "seed": args.seed,
                    },
                },
                "metrics": metrics,
                "targets": targets,
            }
        )
    )
    return 0


if __name__ == "__main__":
    exit_process(main)
