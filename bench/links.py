"""What encrypting the links costs: decode tok/s of the same circuit over TLS bound to the node
keys and over plaintext, on loopback, interleaved in one run — one JSON object on stdout.

    python bench/links.py                       # 3 nodes, 48 new tokens, 5 repeats
    python bench/links.py --quick               # smoke run: 2 nodes, 4 new tokens, 1 repeat,
                                                # no warm-up, 2 handshakes per node

Two circuits of the same prepared SmolLM2 shards (fp32) run side by side: one whose nodes serve
TLS 1.3 with their node keys (`planet node serve --node-key`, https://, every link pinned:
client → A → B → C → client), one in local mode (`--plaintext-links`). Each repeat runs the
plaintext circuit, then the TLS one, with the same prompt and EOS ignored; medians over the
repeats. `ratio_tok_s_encrypted_vs_plain_loopback` is TLS decode tok/s ÷ plaintext decode tok/s
(target ≥ 0.95); the greedy tokens of both must be identical. `encryption_cost()` is the
function a WAN bench reuses with its own circuits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread, stop_nodes
from node.procs import exit_process

log = logging.getLogger("bench.links")

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
PORTS = (20500, 20700)
PASSWORD = "bench links"
HANDSHAKES = 10  # fresh connections per node for the handshake figure


class CountingRelay:
    """A loopback TCP relay in front of one node that counts the bytes of both directions
    (what a link puts on the wire, TLS records or HTTP + WebSocket frames)."""

    def __init__(self, port: int, target: int) -> None:
        self.port = port
        self.target = target
        self.bytes = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> CountingRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                self.bytes += len(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()


async def _run(
    hops: Sequence[Any], head: Any, ids: list[int], new_tokens: int
) -> tuple[list[int], Any, float]:
    """One generation on fresh connections → its tokens, its Timings and its first-token ms
    counted from before the first connection (every link's handshake included)."""
    from node.client.circuit import CircuitClient
    from node.client.types import Timings

    timings = Timings()
    started = time.perf_counter()
    first_ms = 0.0
    tokens: list[int] = []
    async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
        async for token in client.generate(
            head, ids, max_new_tokens=new_tokens, timings=timings, stop_on_eos=False
        ):
            if not tokens:
                first_ms = (time.perf_counter() - started) * 1000
            tokens.append(token)
    return tokens, timings, first_ms


async def _connect_ms(hops: Sequence[Any], count: int) -> float:
    """Median ms of a fresh connection + `GET /health` to each hop (TCP, TLS handshake and
    pin when the hop is https)."""
    import aiohttp

    from node.links import link_ssl

    samples = []
    for _ in range(count):
        for hop in hops:
            pin = link_ssl(hop.url, hop.key, plaintext_ok=False)
            started = time.perf_counter()
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
                http.get(f"{hop.url}/health", ssl=pin) as answer,
            ):
                await answer.read()
            samples.append((time.perf_counter() - started) * 1000)
    return median(samples)


async def _wire_bytes(
    hops: Sequence[Any], relays: Sequence[int], head: Any, ids: list[int], new_tokens: int
) -> tuple[int, int]:
    """Bytes on every link of the circuit (client ↔ each node, node → next node, both
    directions) for a 1-token and a `new_tokens`-token generation, through counting relays."""
    from node.client.types import Hop

    through = [
        Hop(hop.url.rsplit(":", 1)[0] + f":{port}", hop.shard, hop.key)
        for hop, port in zip(hops, relays, strict=True)
    ]
    totals = []
    for tokens in (1, new_tokens):
        counters = [
            CountingRelay(port, int(hop.url.rsplit(":", 1)[1]))
            for hop, port in zip(hops, relays, strict=True)
        ]
        async with contextlib.AsyncExitStack() as stack:
            for counter in counters:
                await stack.enter_async_context(counter)
            await _run(through, head, ids, tokens)
            await asyncio.sleep(0.1)  # the last close frames
        totals.append(sum(c.bytes for c in counters))
    return totals[0], totals[1]


def encryption_cost(
    tls_hops: Sequence[Any],
    plain_hops: Sequence[Any],
    head: Any,
    ids: list[int],
    *,
    new_tokens: int,
    repeats: int,
    label: str = "loopback",
    warm_up: bool = True,
) -> dict[str, Any]:
    """Interleaved runs of the same circuit over plaintext and TLS → decode tok/s, first
    token (handshakes included), their ratios and whether the greedy tokens agree (keys
    suffixed with `label`)."""
    if warm_up:  # connections, first allocations
        asyncio.run(_run(plain_hops, head, ids, 4))
        asyncio.run(_run(tls_hops, head, ids, 4))
    runs: dict[str, list[tuple[Any, float]]] = {"plain": [], "tls": []}
    same = True
    for repeat in range(repeats):
        plain_tokens, plain, plain_first = asyncio.run(_run(plain_hops, head, ids, new_tokens))
        tls_tokens, tls, tls_first = asyncio.run(_run(tls_hops, head, ids, new_tokens))
        same = same and plain_tokens == tls_tokens
        runs["plain"].append((plain, plain_first))
        runs["tls"].append((tls, tls_first))
        log.info(
            "repeat %d/%d decode tok/s plain %.2f tls %.2f, first token ms plain %.1f tls %.1f",
            repeat + 1,
            repeats,
            plain.decode_tok_s,
            tls.decode_tok_s,
            plain_first,
            tls_first,
        )
    out: dict[str, Any] = {}
    for name, pairs in runs.items():
        decode = [t.decode_tok_s for t, _ in pairs]
        first = [ms for _, ms in pairs]
        out[f"decode_tok_s_{name}_{label}"] = round(median(decode), 2)
        out[f"decode_tok_s_{name}_{label}_spread"] = spread(decode)
        out[f"first_token_ms_{name}_{label}"] = round(median(first), 1)
        out[f"first_token_ms_{name}_{label}_spread"] = spread(first, 1)
    out[f"ratio_tok_s_encrypted_vs_plain_{label}"] = round(
        out[f"decode_tok_s_tls_{label}"] / out[f"decode_tok_s_plain_{label}"], 3
    )
    out[f"ratio_tok_s_encrypted_vs_plain_{label}_per_repeat"] = [
        round(t.decode_tok_s / p.decode_tok_s, 3)
        for (t, _), (p, _) in zip(runs["tls"], runs["plain"], strict=True)
    ]
    out[f"ratio_first_token_encrypted_vs_plain_{label}"] = round(
        out[f"first_token_ms_tls_{label}"] / out[f"first_token_ms_plain_{label}"], 3
    )
    out[f"greedy_tokens_identical_{label}"] = same
    return out


def link_costs(
    tls_hops: Sequence[Any],
    plain_hops: Sequence[Any],
    relays: dict[str, Sequence[int]],
    head: Any,
    ids: list[int],
    *,
    new_tokens: int,
    handshakes: int = HANDSHAKES,
) -> dict[str, Any]:
    """A fresh connection's cost per node (median of `handshakes` per node) and the bytes per
    decoded token on all links (`relays`: the counting relays' ports for "tls" and "plain",
    one per node)."""
    out: dict[str, Any] = {}
    for name, hops in (("plain", plain_hops), ("tls", tls_hops)):
        out[f"connect_ms_{name}"] = round(asyncio.run(_connect_ms(hops, handshakes)), 2)
    out["handshake_ms_tls_minus_plain"] = round(out["connect_ms_tls"] - out["connect_ms_plain"], 2)
    for name, hops in (("plain", plain_hops), ("tls", tls_hops)):
        one, many = asyncio.run(_wire_bytes(hops, relays[name], head, ids, new_tokens))
        out[f"wire_bytes_first_token_{name}"] = one
        out[f"wire_bytes_per_token_{name}"] = round((many - one) / (new_tokens - 1), 1)
    out["ratio_wire_bytes_per_token_tls_vs_plain"] = round(
        out["wire_bytes_per_token_tls"] / out["wire_bytes_per_token_plain"], 4
    )
    return out


def _start(
    parts: int, run_dir: Path, quick: bool = False
) -> tuple[Path, list[Any], list[Any], list[int]]:
    """The TLS circuit's and the plaintext circuit's node processes (not yet healthy), and
    the ports of the counting relays (TLS nodes' first, then the plaintext nodes'), which every
    node may forward to as well. `quick` takes the cached prepared shards without hashing them
    first (each node checks its own shard file's hash when it starts)."""
    from harness.ports import ephemeral_port
    from harness.shard_cache import prepared_manifest
    from node.keys import PASSWORD_ENV, create_node_key
    from node.model.prepare import prepare
    from node.server.launcher import free_ports, start_node

    manifest = (
        prepared_manifest(parts=parts, quant="none")
        if quick
        else Path(prepare(parts=parts, quant="none", progress=lambda m: log.info("%s", m)))
    )
    # quick (the smoke run, beside other tests): the test range (harness/ports.py), off the
    # devnets' fixed ranges
    count = 4 * parts
    ports = [ephemeral_port() for _ in range(count)] if quick else free_ports(count, *PORTS)
    tls_ports, plain_ports, relays = ports[:parts], ports[parts : 2 * parts], ports[2 * parts :]
    tls, plain = [], []
    for shard in range(parts):
        key = run_dir / f"node_key_{shard}.json"
        create_node_key(key, PASSWORD)
        hops = ",".join(f"https://127.0.0.1:{port}" for port in tls_ports + relays[:parts])
        tls.append(
            start_node(
                manifest=manifest,
                shard=shard,
                port=tls_ports[shard],
                run_dir=run_dir / "tls",
                extra_args=("--next-hops", hops),
                extra_env={PASSWORD_ENV: PASSWORD},
                node_key=key,
            )
        )
    for shard in range(parts):
        hops = ",".join(f"http://127.0.0.1:{port}" for port in plain_ports + relays[parts:])
        plain.append(
            start_node(
                manifest=manifest,
                shard=shard,
                port=plain_ports[shard],
                run_dir=run_dir / "plain",
                extra_args=("--next-hops", hops),
            )
        )
    return manifest, tls, plain, relays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=3, help="nodes per circuit (default 3)")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens per run (default 48)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved pairs (default 5)")
    args = parse_with_quick(parser, {"parts": 2, "new_tokens": 4, "repeats": 1}, argv)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # the client's idle threads sleep, as the nodes'
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    import json

    from node.client.types import Hop
    from node.model.head import ClientHead
    from node.server.launcher import wait_healthy
    from node.server.run import configure_torch_threads

    configure_torch_threads(0)
    load_start = [round(x, 2) for x in os.getloadavg()]
    run_dir = Path(tempfile.mkdtemp(prefix="planet-bench-links-"))
    nodes: list[Any] = []
    try:
        manifest, tls, plain, relays = _start(args.parts, run_dir, args.quick)
        nodes = tls + plain
        head = ClientHead.load(manifest, device="cpu")
        ids = head.chat_ids([{"role": "user", "content": PROMPT}])
        wait_healthy(nodes, timeout_s=300)
        tls_hops = [Hop(n.url, n.shard, n.key) for n in tls]
        plain_hops = [Hop(n.url, n.shard) for n in plain]
        metrics = encryption_cost(
            tls_hops,
            plain_hops,
            head,
            ids,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            warm_up=not args.quick,
        )
        metrics |= link_costs(
            tls_hops,
            plain_hops,
            {"tls": relays[: args.parts], "plain": relays[args.parts :]},
            head,
            ids,
            new_tokens=args.new_tokens,
            handshakes=2 if args.quick else HANDSHAKES,
        )
    finally:
        stop_nodes(nodes)
    metrics["load_average_start_end"] = [load_start, [round(x, 2) for x in os.getloadavg()]]
    body = {
        "bench": "links",
        "machine": machine(),
        "config": {
            "model": "SmolLM2-135M-Instruct fp32",
            "parts": args.parts,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "warm_up": not args.quick,
            "handshakes_per_node": 2 if args.quick else HANDSHAKES,
            "prompt_tokens": len(ids),
            "links": "TLS 1.3 (ed25519 node-key certificates, pinned) vs --plaintext-links",
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {
            "ratio_tok_s_encrypted_vs_plain_loopback": {"op": ">=", "value": 0.95},
            "greedy_tokens_identical_loopback": {"op": "==", "value": True},
        },
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    exit_process(main)
