"""Speculative decoding over slow links: a 3-node SmolLM2 circuit whose every link is delayed.

    python bench/wan.py [--latencies 0,20,50,100] [--new-tokens 48] [--lookahead 16] [--quick]

`--quick` (the smoke run): 2 nodes, 0 ms links only (the proxies still relay every byte), 4 new
tokens, the shortest prompt of each set, the monolithic prefill timed once without a warm-up
(its shards not hashed again: the nodes did), the cached prepared shards.

Three node processes on loopback; every connection to node i (the client's link and the
previous node's) goes through a proxy that delays the bytes of each direction by the link's
one-way latency: toxiproxy's latency toxic (`.tools/bin/toxiproxy-server`, the binary
deploy/netlab uses) when it is there, else an asyncio relay in this process (`config.links`
says which). A token then costs K + 1 = 4 one-way delays without speculation.

For each latency and each prompt set (bench/_prompt_sets.py: held-out questions, repetitive
copy/edit tasks), every prompt is generated greedily with plain decoding and with speculation
(node/client/speculation.py), interleaved: first token ms (against its target: one round trip
per hop + 1.5 × the whole model's prefill of the same prompt in this process), decode tok/s
(tokens after the first over the time after the first), tokens per pass, bytes per token
(client's WebSocket bytes plus node-to-node bytes from /info, whole generation over its new
tokens), and whether the tokens were identical. Before those, `--fresh-links` first questions
per latency each come right after every connection was cut (`<latency>ms_fresh_links`): the first
token of a question whose nodes' next-hop links had just died, `--settle-s` earlier (nodes
that keep warm links, node/server/link_pool.py, have dialled them again by then). Prints one
JSON object (BENCHMARKS.md shape).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick, stop_nodes
from bench._prompt_sets import heldout_prompts, repetitive_prompts
from node.procs import exit_process

log = logging.getLogger("bench.wan")
PORTS = (20400, 20500)  # this bench's share of the port range: 3 nodes, 3 proxies, 1 API
TOXIPROXY = Path(__file__).resolve().parents[1] / ".tools" / "bin" / "toxiproxy-server"


# ------------------------------------------------------------------------------ slow links
class ToxiproxyLinks:
    """One toxiproxy-server on loopback, one proxy per node, a latency toxic each way."""

    kind = "toxiproxy"

    def __init__(self, binary: Path, api_port: int, run_dir: Path) -> None:
        self.api_port = api_port
        log_file = (run_dir / "toxiproxy.log").open("ab")
        self.process = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(api_port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LOG_LEVEL": "warn"},
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self._call("GET", "/version")
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.1)
        self.names: list[str] = []

    def _call(self, method: str, path: str, body: object = None) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", self.api_port, timeout=10)
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, body=payload)
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        if answer.status >= 300:
            raise OSError(f"toxiproxy {method} {path}: HTTP {answer.status} {data[:200]!r}")
        return json.loads(data) if data else None

    def add(self, listen: int, upstream: int) -> None:
        name = f"node{len(self.names)}"
        self._call(
            "POST",
            "/proxies",
            {
                "name": name,
                "listen": f"127.0.0.1:{listen}",
                "upstream": f"127.0.0.1:{upstream}",
                "enabled": True,
            },
        )
        for stream in ("upstream", "downstream"):
            self._call(
                "POST",
                f"/proxies/{name}/toxics",
                {
                    "name": f"delay_{stream}",
                    "type": "latency",
                    "stream": stream,
                    "toxicity": 1.0,
                    "attributes": {"latency": 0, "jitter": 0},
                },
            )
        self.names.append(name)

    def set_latency(self, ms: int) -> None:
        for name in self.names:
            for stream in ("upstream", "downstream"):
                self._call(
                    "PATCH",
                    f"/proxies/{name}/toxics/delay_{stream}",
                    {"attributes": {"latency": ms, "jitter": 0}},
                )

    def reset(self) -> None:
        """Drop every connection through every proxy (disabled, then enabled: toxics kept)."""
        for name in self.names:
            self._call("POST", f"/proxies/{name}", {"enabled": False})
            self._call("POST", f"/proxies/{name}", {"enabled": True})

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class RelayLinks:
    """The same in this process: an asyncio relay per node (its own thread and loop) that
    delivers every chunk `latency` ms after it was read, in order, each direction."""

    kind = "asyncio-relay"

    def __init__(self) -> None:
        self.latency_s = 0.0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[asyncio.AbstractServer] = []
        self.writers: set[asyncio.StreamWriter] = set()
        self.carried = 0  # bytes read on every link, both directions (bench/overlay.py)

    def add(self, listen: int, upstream: int) -> None:
        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(
                lambda r, w: self._connection(r, w, upstream), "127.0.0.1", listen
            )

        self.servers.append(asyncio.run_coroutine_threadsafe(start(), self.loop).result(10))

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: int
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                self.carried += len(data)
                queue.put_nowait((time.monotonic() + self.latency_s, data))
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(Exception):
                await sender

    def set_latency(self, ms: int) -> None:
        self.latency_s = ms / 1000

    def reset(self) -> None:
        """Drop every connection through the relays now (they keep accepting new ones)."""

        async def drop() -> None:
            for writer in self.writers:
                writer.transport.abort()
            self.writers.clear()

        asyncio.run_coroutine_threadsafe(drop(), self.loop).result(10)

    def close(self) -> None:
        for server in self.servers:
            self.loop.call_soon_threadsafe(server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# ------------------------------------------------------------------------------ the circuit
@contextlib.contextmanager
def circuit(
    run_dir: Path, links_kind: str, quick: bool = False, parts: int = 3
) -> Iterator[tuple[Path, list[Any], Any]]:
    """`parts` SmolLM2 nodes behind delaying proxies: (manifest, hops through the proxies,
    links).
    `quick` takes the cached prepared shards without hashing them first (each node checks its
    own shard file's hash when it starts)."""
    from harness.ports import ephemeral_port
    from harness.shard_cache import prepared_manifest
    from node.client.types import Hop
    from node.model.prepare import prepare
    from node.server.launcher import free_ports, start_node, wait_healthy

    manifest = (
        prepared_manifest(parts=parts, quant="none")
        if quick
        else Path(prepare(parts=parts, quant="none", progress=lambda m: log.info("%s", m)))
    )
    # quick (the smoke run, beside other tests): the test range (harness/ports.py), off the
    # devnets' fixed ranges
    count = 2 * parts + 1
    ports = [ephemeral_port() for _ in range(count)] if quick else free_ports(count, *PORTS)
    node_ports, proxy_ports, api_port = ports[:parts], ports[parts : 2 * parts], ports[-1]
    use_toxiproxy = links_kind == "toxiproxy" or (links_kind == "auto" and TOXIPROXY.exists())
    links: Any = ToxiproxyLinks(TOXIPROXY, api_port, run_dir) if use_toxiproxy else RelayLinks()
    nodes = []
    try:
        for node_port, proxy_port in zip(node_ports, proxy_ports, strict=True):
            links.add(proxy_port, node_port)
        urls = [f"http://127.0.0.1:{port}" for port in proxy_ports]
        next_hops = ("--next-hops", ",".join(urls))
        for shard, port in enumerate(node_ports):
            nodes.append(
                start_node(
                    manifest=manifest, shard=shard, port=port, run_dir=run_dir, extra_args=next_hops
                )
            )
        wait_healthy(nodes, timeout_s=240)
        yield manifest, [Hop(url=url, shard=i) for i, url in enumerate(urls)], links
    finally:
        stop_nodes(nodes)
        links.close()


def node_dials(hops: list[Any]) -> int | None:
    """Next-hop links the nodes dialled so far (their /info `links.dialled`, read through the
    proxies); None from nodes that do not report it."""
    total = 0
    for hop in hops:
        with urllib.request.urlopen(f"{hop.url}/info", timeout=30) as answer:
            links = json.loads(answer.read()).get("links")
        if not isinstance(links, dict):
            return None
        total += int(links.get("dialled", 0))
    return total


def forwarded_bytes(hops: list[Any]) -> int:
    """Bytes the nodes sent to their next hop (their /info; read through the proxies)."""
    total = 0
    for hop in hops:
        with urllib.request.urlopen(f"{hop.url}/info", timeout=30) as answer:
            total += int(json.loads(answer.read())["load"].get("stream_bytes_forwarded", 0))
    return total


async def one_generation(
    client: Any,
    head: Any,
    ids: list[int],
    new_tokens: int,
    lookahead: int | None,
    hops: list[Any],
    min_ngram: int = 2,
) -> dict[str, Any]:
    from node.client.speculation import SpeculationConfig, SpeculationStats
    from node.client.types import Timings

    timings = Timings()
    stats = SpeculationStats()
    forwarded = await asyncio.to_thread(forwarded_bytes, hops)
    if lookahead is None:
        gen = client.generate(head, ids, max_new_tokens=new_tokens, timings=timings)
    else:
        gen = client.generate(
            head,
            ids,
            max_new_tokens=new_tokens,
            timings=timings,
            stats=stats,
            speculation=SpeculationConfig(lookahead=lookahead, min_ngram=min_ngram),
        )
    tokens = [t async for t in gen]
    await asyncio.sleep(0.05)  # the close messages
    node_bytes = await asyncio.to_thread(forwarded_bytes, hops) - forwarded
    return {
        "tokens": tokens,
        "first_token_ms": timings.prefill_ms,
        "decode_ms": timings.decode_ms,
        "decode_tokens": timings.decode_steps,
        "passes": stats.passes if lookahead is not None else timings.decode_steps,
        "accepted": stats.accepted,
        "proposed": stats.proposed,
        "bytes": timings.wire_bytes_sent + timings.wire_bytes_received + node_bytes,
    }


def monolithic_prefill_ms(
    manifest: Path, head: Any, ids: list[int], repeats: int = 3, *, quick: bool = False
) -> float:
    """Median ms of the whole model's prefill of `ids` in this process (all shards in a row, no
    links): the first-token target is one round trip per hop + 1.5 × this. `quick`: no
    warm-up run, and the shard files are not hashed again (the nodes serving them did)."""
    import torch

    from node.model.shard import ShardModel

    shards = _SHARDS.get(manifest)
    if shards is None:
        count = len(json.loads(Path(manifest).read_text())["shards"])
        shards = _SHARDS[manifest] = [
            ShardModel.load(manifest, k, device="cpu", verify=not quick) for k in range(count)
        ]
    positions = torch.arange(len(ids))
    warm = 0 if quick else 1  # the first run warms up
    times = []
    with torch.inference_mode():
        for _ in range(repeats + warm):
            started = time.perf_counter()
            hidden = head.embed(ids)
            for shard in shards:
                hidden = shard.forward(hidden, positions, shard.new_cache())
            head.logits(hidden[:, -1])
            times.append((time.perf_counter() - started) * 1000)
    timed = times[warm:]
    return sorted(timed)[len(timed) // 2]


_SHARDS: dict[Path, list[Any]] = {}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    decode_ms = sum(r["decode_ms"] for r in runs)
    decode_tokens = sum(r["decode_tokens"] for r in runs)
    tokens = sum(len(r["tokens"]) for r in runs)
    passes = sum(r["passes"] for r in runs)
    proposed = sum(r["proposed"] for r in runs)
    first = sorted(r["first_token_ms"] for r in runs)
    return {
        "first_token_ms_median": round(first[len(first) // 2], 1),
        "decode_tok_s": round(decode_tokens / (decode_ms / 1000), 2) if decode_ms else 0.0,
        "new_tokens": tokens,
        "tokens_per_pass": round(decode_tokens / passes, 3) if passes else 0.0,
        "acceptance": round(sum(r["accepted"] for r in runs) / proposed, 3) if proposed else 0.0,
        "bytes_per_token": round(sum(r["bytes"] for r in runs) / tokens) if tokens else 0,
    }


async def fresh_links(
    hops: list[Any],
    head: Any,
    links: Any,
    args: argparse.Namespace,
    manifest: Path,
    mono: dict[tuple[int, ...], float],
    latency: int,
) -> dict[str, Any]:
    """The first question after every link was dropped (as after a node start, a restart of
    its next hop, or a link that died): `--fresh-links` times, every connection through the
    proxies is cut, `--settle-s` pass (a node that keeps warm links dials its next hops again
    meanwhile; one that dials at the open pays the handshakes in its first token), a new client
    dials (untimed) and asks the shortest held-out prompt for its first token, then asks it again
    (every link warm by then: the difference is what the fresh links cost)."""
    from node.client.circuit import CircuitClient

    messages = min(heldout_prompts().values(), key=lambda m: len(head.chat_ids(m)))
    ids = head.chat_ids(messages)
    if tuple(ids) not in mono:
        mono[tuple(ids)] = monolithic_prefill_ms(
            manifest, head, ids, repeats=1 if args.quick else 3, quick=args.quick
        )
    first, warm = [], []
    dials: int | None = 0  # next-hop links the nodes dialled during the first questions
    for _ in range(args.fresh_links):
        links.reset()
        await asyncio.sleep(args.settle_s)
        async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
            before = await asyncio.to_thread(node_dials, hops)
            run = await one_generation(client, head, ids, 1, None, hops)
            first.append(round(run["first_token_ms"], 1))
            after = await asyncio.to_thread(node_dials, hops)
            dials = None if dials is None or before is None else dials + after - before
            # the same question again on links that are warm now, whatever the nodes do
            run = await one_generation(client, head, ids, 1, None, hops)
            warm.append(round(run["first_token_ms"], 1))
    median = sorted(first)[len(first) // 2]
    warm_median = sorted(warm)[len(warm) // 2]
    bound = 2 * latency * len(hops) + 1.5 * mono[tuple(ids)]
    log.info(
        "%d ms, fresh links: first token %s ms, then %s ms (bound %.1f), node dials during "
        "the first questions %s",
        latency,
        first,
        warm,
        bound,
        dials,
    )
    return {
        "first_token_ms": first,
        "first_token_ms_median": median,
        "warm_first_token_ms": warm,
        "warm_first_token_ms_median": warm_median,
        "fresh_minus_warm_ms": round(median - warm_median, 1),
        # handshakes on the first questions' path (None: the nodes do not report links)
        "node_dials_during_first_questions": dials,
        "monolithic_prefill_ms_median": round(mono[tuple(ids)], 1),
        "first_token_bound_ms": round(bound, 1),
        "first_token_within_bound": median <= bound,
    }


async def measure(
    hops: list[Any], head: Any, links: Any, args: argparse.Namespace, manifest: Path
) -> dict[str, Any]:
    from node.client.circuit import CircuitClient

    sets = {"heldout": heldout_prompts(), "repetitive": repetitive_prompts()}
    results: dict[str, Any] = {}
    mono: dict[tuple[int, ...], float] = {}  # prompt ids → monolithic prefill ms
    for latency in [int(x) for x in args.latencies.split(",")]:
        links.set_latency(latency)
        if args.fresh_links:
            results[f"{latency}ms_fresh_links"] = await fresh_links(
                hops, head, links, args, manifest, mono, latency
            )
        async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
            for set_name, prompts in sets.items():
                chosen = list(prompts.items())
                if args.quick:  # the shortest first: a smoke run proves the path, not the figure
                    chosen.sort(key=lambda item: len(head.chat_ids(item[1])))
                chosen = chosen[: args.prompts]
                runs: dict[str, list[dict[str, Any]]] = {"plain": [], "spec": []}
                identical = True
                for _ in range(args.repeats):
                    for name, messages in chosen:
                        ids = head.chat_ids(messages)
                        if tuple(ids) not in mono:
                            mono[tuple(ids)] = monolithic_prefill_ms(
                                manifest,
                                head,
                                ids,
                                repeats=1 if args.quick else 3,
                                quick=args.quick,
                            )
                        plain = await one_generation(client, head, ids, args.new_tokens, None, hops)
                        spec = await one_generation(
                            client, head, ids, args.new_tokens, args.lookahead, hops, args.min_ngram
                        )
                        runs["plain"].append(plain)
                        runs["spec"].append(spec)
                        if plain["tokens"] != spec["tokens"]:
                            identical = False
                            log.warning("%s/%s at %d ms: tokens differ", set_name, name, latency)
                plain_s, spec_s = summarize(runs["plain"]), summarize(runs["spec"])
                speedup = (
                    round(spec_s["decode_tok_s"] / plain_s["decode_tok_s"], 3)
                    if plain_s["decode_tok_s"]
                    else 0.0
                )
                prefill = sorted(mono[tuple(head.chat_ids(m))] for _, m in chosen)
                prefill_ms = prefill[len(prefill) // 2]
                # the target: one round trip (2 one-way delays) per hop + 1.5 × the monolithic
                # prefill of the same prompts
                bound = 2 * latency * len(hops) + 1.5 * prefill_ms
                results[f"{latency}ms_{set_name}"] = {
                    "plain": plain_s,
                    "speculative": spec_s,
                    "decode_speedup": speedup,
                    "greedy_tokens_identical": identical,
                    "monolithic_prefill_ms_median": round(prefill_ms, 1),
                    "first_token_bound_ms": round(bound, 1),
                    "first_token_within_bound": plain_s["first_token_ms_median"] <= bound,
                }
                log.info("%d ms %s: %s", latency, set_name, results[f"{latency}ms_{set_name}"])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latencies", default="0,20,50,100", help="one-way ms per link")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument(
        "--lookahead", type=int, default=16, help="most tokens guessed per pass (drafts grow to it)"
    )
    parser.add_argument("--min-ngram", type=int, default=2, help="shortest suffix looked up")
    parser.add_argument("--prompts", type=int, default=4, help="prompts of each set (at most)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--links", choices=("auto", "toxiproxy", "relay"), default="auto")
    parser.add_argument("--parts", type=int, default=3, help="nodes in the circuit (3)")
    parser.add_argument(
        "--fresh-links",
        type=int,
        default=3,
        help="first questions timed after every link was cut, per latency (0: none)",
    )
    parser.add_argument(
        "--settle-s", type=float, default=2.0, help="pause between the cut and that question"
    )
    args = parse_with_quick(
        parser,
        {
            "latencies": "0",
            "new_tokens": 4,
            "prompts": 1,
            "parts": 2,
            "fresh_links": 1,
            "settle_s": 1.0,
        },
        argv,
    )
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from node.model.head import ClientHead
    from protocol.frames.dtypes import WIRE_DTYPE

    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="planet-wan-") as tmp,
        circuit(Path(tmp), args.links, args.quick, args.parts) as (manifest, hops, links),
    ):
        head = ClientHead.load(manifest, device="cpu")
        metrics = asyncio.run(measure(hops, head, links, args, manifest))
        kind = links.kind
    at50 = {
        k: v["decode_speedup"]
        for k, v in metrics.items()
        if k.startswith("50ms_") and "decode_speedup" in v
    }
    metrics["targets"] = {
        "speedup_50ms_repetitive_ge_2": at50.get("50ms_repetitive", 0.0) >= 2.0 if at50 else None,
        "speedup_50ms_heldout_ge_1": at50.get("50ms_heldout", 0.0) >= 1.0 if at50 else None,
        "first_token_within_one_rtt_per_hop_plus_1_5x_prefill": all(
            v["first_token_within_bound"]
            for v in metrics.values()
            if isinstance(v, dict) and "first_token_within_bound" in v
        ),
        "all_greedy_tokens_identical": all(
            v["greedy_tokens_identical"]
            for v in metrics.values()
            if isinstance(v, dict) and "greedy_tokens_identical" in v
        ),
    }
    body = {
        "bench": "wan",
        "machine": machine(),
        "config": {
            "model": f"smollm2-135m fp32, {args.parts} shards, {args.parts} node processes on "
            "loopback",
            "links": kind,
            "wire_dtype": f"{WIRE_DTYPE} raw frames (the clients' default; bytes_per_token)",
            "latency": "one-way ms on every link, each direction (a token costs "
            f"{args.parts + 1} without speculation)",
            "latencies": args.latencies,
            "new_tokens": args.new_tokens,
            "lookahead": args.lookahead,
            "min_ngram": args.min_ngram,
            "prompts_per_set": args.prompts,
            "repeats": args.repeats,
            "fresh_links": args.fresh_links,
            "settle_s": args.settle_s,
            "quick": args.quick,
            "load_average": os.getloadavg()[0],
            "wall_s": round(time.monotonic() - started, 1),
        },
        "metrics": metrics,
    }
    print(json.dumps(body, indent=1))
    return 0


if __name__ == "__main__":
    exit_process(main)
