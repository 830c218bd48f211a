"""Pipeline benchmark: monolithic vs 2/3/5-node pipelines on loopback, shard sizes, perplexity
per quant, activation bytes on the wire raw vs int8 — one JSON object on stdout, logs on stderr.

    python bench/pipeline.py            # 64 new tokens, 3 repeats
    python bench/pipeline.py --quick    # smoke run: the 3-part circuit, 4 new tokens, 1 repeat,
                                        # no warm-up, a short prompt, monolithic at 1 thread in
                                        # the client's process (its shards not hashed again),
                                        # wire bytes from a 2- minus a 1-token run, no
                                        # perplexity, no codec check

Everything is measured in one run, side by side and interleaved (the machine is shared):
- monolithic: transformers `generate` on the whole fp32 model in this process (the reference a
  user would run), and the same ShardModel code path chained in-process (no HTTP), which
  isolates what the network hops cost;
- pipeline_K: K node processes on loopback started as `planet local up` starts them (each with
  its circuit as --next-hops), driven by the real CircuitClient (node-to-node forwarding over
  one WebSocket per link, protocol/stream.py);
- the timed pipeline runs send the clients' default wire dtype (float16 raw frames, issue 46);
- wire bytes per generated token over all hops, framing included (WebSocket framing and control
  messages), for float32, float16 and compressed frames (`bytes_per_token`: the default's,
  `bytes_per_token_fp32`, their ratio): the client's TCP sockets' payload bytes (TCP_INFO)
  plus the nodes' WebSocket bytes to their next hop (/info), for a 40-token minus an 8-token
  generation, divided by the 32 extra tokens.
Decode rate counts forward steps after the first token; EOS is ignored so every run decodes
the same number of tokens. Prefill = prompt in → first token chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, spread, stop_nodes
from node.procs import exit_process

log = logging.getLogger("bench.pipeline")

SPEED_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
QUICK_PROMPT = "Write a story."  # --quick: the prompt's length is not what a smoke run proves
CHECK_PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Explain in a few sentences how a bicycle works."}],
    [{"role": "user", "content": "List three fruits and say what colour each one is."}],
    [
        {"role": "user", "content": "Give me a name for a black cat."},
        {"role": "assistant", "content": "How about Midnight?"},
        {"role": "user", "content": "Nice. Now one for a white dog, and say why."},
    ],
]
PORTS = (20100, 20300)


class _Stamps:
    """A generate() streamer that timestamps every put (first = the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def bench_monolithic_generate(model: Any, ids: list[int], new_tokens: int) -> tuple[float, float]:
    """(prefill_ms, decode_tok_s) of transformers generate, EOS ignored."""
    import torch

    stamps = _Stamps()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            torch.tensor([ids]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            streamer=stamps,
        )
    tokens = stamps.times[1:]  # the first put is the prompt
    prefill_ms = (tokens[0] - t0) * 1000
    decode_tok_s = (len(tokens) - 1) / (tokens[-1] - tokens[0])
    return prefill_ms, decode_tok_s


def bench_inprocess_shards(
    head: Any, shards: list[Any], ids: list[int], new_tokens: int
) -> tuple[float, float]:
    """The pipeline's own code path (ClientHead + ShardModel.forward) without the network."""
    import torch

    caches = [s.new_cache() for s in shards]
    t0 = time.perf_counter()
    with torch.inference_mode():
        hidden = torch.from_numpy(head.embed_np(ids))
        positions = torch.arange(len(ids), dtype=torch.long)
        times = []
        position = len(ids)
        for _ in range(new_tokens):
            for shard, cache in zip(shards, caches, strict=True):
                hidden = shard.forward(hidden, positions, cache)
            token = int(np.argmax(head.logits_np(hidden[0, -1].numpy())))
            times.append(time.perf_counter())
            hidden = torch.from_numpy(head.embed_np([token]))
            positions = torch.tensor([position], dtype=torch.long)
            position += 1
    return (times[0] - t0) * 1000, (len(times) - 1) / (times[-1] - times[0])


async def _pipeline_run(
    hops: list[Any],
    head: Any,
    ids: list[int],
    new_tokens: int,
    codec: str = "raw",
    stop_on_eos: bool = False,
    dtype: str | None = None,
) -> tuple[list[int], Any]:
    from node.client.circuit import CircuitClient
    from protocol.frames.dtypes import WIRE_DTYPE

    dtype = dtype or WIRE_DTYPE  # what a user's client sends
    from node.client.types import Timings

    timings = Timings()
    client = CircuitClient(hops, hidden_size=head.hidden_size, codec=codec, dtype=dtype)
    async with client:
        tokens = [
            t
            async for t in client.generate(
                head, ids, max_new_tokens=new_tokens, timings=timings, stop_on_eos=stop_on_eos
            )
        ]
    return tokens, timings


class _SocketBytes:
    """Records the client's TCP sockets; their payload bytes sent and received from TCP_INFO
    (tcpi_bytes_acked, tcpi_bytes_received: what crossed loopback, WebSocket framing included,
    TCP/IP headers not)."""

    def __init__(self) -> None:
        self.sockets: list[Any] = []

    def factory(self, addr_info: Any) -> Any:
        import socket

        family, kind, proto, _, _ = addr_info
        sock = socket.socket(family=family, type=kind, proto=proto)
        self.sockets.append(sock)
        return sock

    def total(self) -> int:
        import socket
        import struct

        total = 0
        for sock in self.sockets:
            if sock.fileno() < 0:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)
            acked, received = struct.unpack_from("=QQ", info, 120)
            total += acked + received
        return total


def _forwarded(hops: list[Any]) -> int:
    """Bytes the nodes sent to their next hop, from /info."""
    import json
    import urllib.request

    total = 0
    for hop in hops:
        with urllib.request.urlopen(f"{hop.url}/info", timeout=10) as answer:
            total += int(json.loads(answer.read())["load"].get("stream_bytes_forwarded", 0))
    return total


async def _counted_run(
    hops: list[Any], head: Any, ids: list[int], tokens: int, dtype: str, codec: str
) -> int:
    """Loopback bytes of one generation over all hops, framing included."""
    import aiohttp

    from node.client.circuit import CircuitClient

    counter = _SocketBytes()
    connector = aiohttp.TCPConnector(socket_factory=counter.factory)
    async with aiohttp.ClientSession(connector=connector) as http:
        client = CircuitClient(
            hops, hidden_size=head.hidden_size, dtype=dtype, codec=codec, http=http
        )
        forwarded = _forwarded(hops)
        async with client:
            gen = client.generate(head, ids, max_new_tokens=tokens, stop_on_eos=False)
            async for _ in gen:
                pass
            await asyncio.sleep(0.2)  # let the last ACKs land
            used = counter.total()
        return used + _forwarded(hops) - forwarded


def wire_bytes_per_token(
    hops: list[Any],
    head: Any,
    ids: list[int],
    dtype: str = "float32",
    codec: str = "raw",
    lengths: tuple[int, int] = (8, 40),
) -> float:
    """Loopback bytes per generated token over all hops (client sockets + node-to-node), from
    a 40-token minus an 8-token generation (`lengths`; prefill and session set-up cancel out)."""
    used = [asyncio.run(_counted_run(hops, head, ids, tokens, dtype, codec)) for tokens in lengths]
    return (used[1] - used[0]) / (lengths[1] - lengths[0])


def circuit_ports(parts_list: list[int], quick: bool = False) -> dict[int, list[int]]:
    """Each circuit's own ports, chosen together before any node starts: a port picked while
    an earlier circuit's nodes are still starting (not yet bound) would look free again, and
    two circuits would share a node whose --next-hops lists only the other circuit's URLs.
    `quick` (the smoke run, beside other tests): from the test range (harness/ports.py,
    PLANET_TEST_PORTS), off the devnets' fixed ranges."""
    from harness.ports import ephemeral_port
    from node.server.launcher import free_ports

    count = sum(parts_list)
    ports = [ephemeral_port() for _ in range(count)] if quick else free_ports(count, *PORTS)
    out: dict[int, list[int]] = {}
    for parts in parts_list:
        out[parts], ports = ports[:parts], ports[parts:]
    return out


def prepared(parts: int, quant: str, quick: bool) -> Path:
    """The prepared shards' manifest; --quick takes the cached one without hashing every shard
    first (each node still checks its own shard file's hash when it starts)."""
    from harness.shard_cache import prepared_manifest
    from node.model.prepare import prepare

    if quick:
        return prepared_manifest(parts=parts, quant=quant)
    return Path(prepare(parts=parts, quant=quant, progress=lambda m: log.info("%s", m)))


def start_circuit(
    parts: int, ports: list[int], run_dir: Path, quick: bool = False
) -> tuple[Path, list[Any]]:
    from node.server.launcher import start_node

    manifest = prepared(parts, "none", quick)
    hops = ["--next-hops", ",".join(f"http://127.0.0.1:{port}" for port in ports)]
    nodes = [
        start_node(
            manifest=manifest,
            shard=shard,
            port=port,
            run_dir=run_dir / f"{parts}p",
            extra_args=hops,
        )
        for shard, port in enumerate(ports)
    ]
    return manifest, nodes


def shard_sizes(quick: bool) -> dict[str, int]:
    from node.model.manifest import Manifest

    sizes = {}
    for quant, name in (("none", "fp32"), ("int8", "int8"), ("int4", "int4")):
        manifest = Manifest.load(prepared(3, quant, quick))
        sizes[name] = sum(entry.size for entry in manifest.shards)
    return sizes


def perplexities(progress: Any) -> tuple[dict[str, float], int]:
    """Teacher-forced perplexity of the held-out text through 3 shards, per quant
    (node.model.evaluate), and the text's token count."""
    from node.model.evaluate import heldout_text, perplexity
    from node.model.head import ClientHead
    from node.model.manifest import Manifest
    from node.model.prepare import prepare
    from node.model.shard import ShardModel

    text = heldout_text()
    out = {}
    tokens = 0
    for quant, name in (("none", "fp32"), ("int8", "int8"), ("int4", "int4")):
        manifest = prepare(parts=3, quant=quant, progress=progress)
        head = ClientHead.load(manifest, device="cpu")
        shards = [
            ShardModel.load(manifest, e.shard_id, device="cpu")
            for e in Manifest.load(manifest).shards
        ]
        out[name] = float(perplexity(head, shards, text))
        tokens = len(head.encode(text))
    return out, tokens


def monolithic_worker(manifest: Path, new_tokens: int, threads: int, warm_up: bool) -> None:
    """Child process (default OpenMP wait policy, as a user's own process would run):
    one measurement of transformers generate and of the in-process shards, as JSON."""
    import json

    print(json.dumps(measure_monolithic(manifest, new_tokens, threads, warm_up)))


def measure_monolithic(
    manifest: Path,
    new_tokens: int,
    threads: int,
    warm_up: bool,
    prompt: str = SPEED_PROMPT,
    verify: bool = True,
) -> dict[str, tuple[float, float]]:
    """transformers generate on the whole model and the shards chained in this process, at
    `threads` torch threads: {"monolithic": (prefill_ms, decode_tok_s), "monolithic_inprocess":
    ...}. `verify=False`: the shard files are not hashed (the nodes serving them did)."""
    import torch
    from transformers import AutoModelForCausalLM

    from node.model.head import ClientHead
    from node.model.manifest import Manifest
    from node.model.shard import ShardModel
    from node.model.source import resolve_source
    from node.server.run import configure_torch_threads

    configure_torch_threads(threads)
    directory = resolve_source("default").directory
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    head = ClientHead.load(manifest, device="cpu")
    shards = [
        ShardModel.load(manifest, e.shard_id, device="cpu", verify=verify)
        for e in Manifest.load(manifest).shards
    ]
    ids = head.chat_ids([{"role": "user", "content": prompt}])
    if warm_up:
        bench_monolithic_generate(model, ids, 4)
        bench_inprocess_shards(head, shards, ids, 4)
    return {
        "monolithic": bench_monolithic_generate(model, ids, new_tokens),
        "monolithic_inprocess": bench_inprocess_shards(head, shards, ids, new_tokens),
    }


def run_monolithic(
    manifest: Path, new_tokens: int, threads: int, warm_up: bool = True, own_process: bool = True
) -> dict[str, tuple[float, float]]:
    """`measure_monolithic` in its own process (default OpenMP wait policy), or in this one
    (`own_process=False`, --quick: one process start fewer, the short prompt, the shard files
    not hashed again; this process's torch threads are set back afterwards)."""
    import json
    import os
    import subprocess

    if not own_process:
        from node.server.run import configure_torch_threads

        before = configure_torch_threads(0)
        try:
            return measure_monolithic(
                manifest, new_tokens, threads, warm_up, QUICK_PROMPT, verify=False
            )
        finally:
            configure_torch_threads(before)

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--monolithic-worker",
            str(manifest),
            str(new_tokens),
            str(threads),
            "1" if warm_up else "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3 parts, 4 new tokens, 1 repeat, no warm-up, monolithic at 1 thread "
        "in this process, no perplexity, no codec check",
    )
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--parts", default=None, help="pipelines to run (default 2,3,5; --quick: 3)"
    )
    parser.add_argument("--skip-ppl", action="store_true")
    parser.add_argument(
        "--skip-codec", action="store_true", help="skip the compressed-codec greedy check"
    )
    parser.add_argument(
        "--monolithic-worker",
        nargs=4,
        metavar=("MANIFEST", "TOKENS", "THREADS", "WARM_UP"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args(argv)
    if args.monolithic_worker:
        manifest, tokens, threads, warm_up = args.monolithic_worker
        monolithic_worker(Path(manifest), int(tokens), int(threads), warm_up == "1")
        return 0
    # This process is the pipeline client: idle OpenMP threads must sleep, not spin, while
    # the nodes compute (the nodes get the same setting from the launcher).
    import os

    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    new_tokens = args.max_new_tokens or (4 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    check_prompts = CHECK_PROMPTS[:1] if args.quick else CHECK_PROMPTS
    parts_list = [int(p) for p in (args.parts or ("3" if args.quick else "2,3,5")).split(",")]
    skip_codec = args.skip_codec or args.quick
    warm_up = not args.quick
    mono_threads_list = (1,) if args.quick else (1, 2)
    wire_lengths = (1, 2) if args.quick else (8, 40)
    prompt_text = QUICK_PROMPT if args.quick else SPEED_PROMPT
    progress = lambda message: log.info("%s", message)  # noqa: E731

    from node.client.types import Hop
    from node.model.head import ClientHead
    from node.server.launcher import wait_healthy
    from node.server.run import configure_torch_threads
    from protocol.frames.codecs import COMPRESSED_CODEC, body_size, encode_body
    from protocol.frames.dtypes import WIRE_DTYPE
    from protocol.frames.header import FRAME_HEADER_BYTES

    threads = configure_torch_threads(0)
    load_start = [round(x, 2) for x in os.getloadavg()]
    metrics: dict[str, Any] = {}
    run_dir = Path(tempfile.mkdtemp(prefix="planet-bench-"))
    circuits: dict[int, tuple[Path, list[Any]]] = {}
    try:
        log.info("starting node processes for %s-part circuits", parts_list)
        for parts, ports in circuit_ports(parts_list, args.quick).items():
            circuits[parts] = start_circuit(parts, ports, run_dir, args.quick)
        manifest3 = Path(next(iter(circuits.values()))[0])
        manifest3 = Path(circuits[3][0]) if 3 in circuits else manifest3
        head = ClientHead.load(manifest3, device="cpu")
        ids = head.chat_ids([{"role": "user", "content": prompt_text}])
        for parts, (_, nodes) in circuits.items():
            wait_healthy(nodes, timeout_s=300)
            log.info("%d-part circuit healthy", parts)
        hops = {
            parts: [Hop(url=n.url, shard=n.shard) for n in nodes]
            for parts, (_, nodes) in circuits.items()
        }
        # warm-up: one short run of each (first-call allocations, connection set-up)
        for parts in parts_list if warm_up else ():
            asyncio.run(_pipeline_run(hops[parts], head, ids, 4))

        runs: dict[str, list[tuple[float, float]]] = {}
        for repeat in range(repeats):
            log.info("repeat %d/%d", repeat + 1, repeats)
            # transformers generate with 1 and with 2 threads; the faster one is "monolithic"
            for mono_threads in mono_threads_list:
                measured = run_monolithic(
                    manifest3, new_tokens, mono_threads, warm_up, own_process=not args.quick
                )
                for name, value in measured.items():
                    runs.setdefault(f"{name}_{mono_threads}t", []).append(value)
            for parts in parts_list:
                _, timings = asyncio.run(_pipeline_run(hops[parts], head, ids, new_tokens))
                runs.setdefault(f"pipeline_{parts}", []).append(
                    (timings.prefill_ms, timings.decode_tok_s, timings.total_ms)
                )
            log.info("  %s", {k: [round(x, 2) for x in v[-1]] for k, v in runs.items()})
        for name, values in runs.items():
            prefill = [v[0] for v in values]
            decode = [v[1] for v in values]
            if len(values[0]) > 2:  # pipelines: whole call, prompt in -> last token
                whole = [new_tokens / (v[2] / 1000) for v in values]
                metrics[f"whole_tok_s_{name}"] = round(median(whole), 2)
            metrics[f"decode_tok_s_{name}"] = round(median(decode), 2)
            metrics[f"decode_tok_s_{name}_spread"] = spread(decode)
            metrics[f"prefill_ms_{name}"] = round(median(prefill), 1)
            metrics[f"prefill_ms_{name}_spread"] = spread(prefill, 1)
        best = max(mono_threads_list, key=lambda t: metrics[f"decode_tok_s_monolithic_{t}t"])
        metrics["monolithic_best_threads"] = best
        for key in ("decode_tok_s", "prefill_ms"):
            metrics[f"{key}_monolithic"] = metrics[f"{key}_monolithic_{best}t"]
            metrics[f"{key}_monolithic_inprocess"] = metrics[f"{key}_monolithic_inprocess_{best}t"]
        mono = metrics["decode_tok_s_monolithic"]
        inp = metrics["decode_tok_s_monolithic_inprocess"]
        mono_whole = new_tokens / (
            (metrics["prefill_ms_monolithic"] + 1000 * (new_tokens - 1) / mono) / 1000
        )
        metrics["whole_tok_s_monolithic"] = round(mono_whole, 2)
        for parts in parts_list:
            rate = metrics[f"decode_tok_s_pipeline_{parts}"]
            metrics[f"ratio_whole_pipeline_{parts}_vs_monolithic"] = round(
                metrics[f"whole_tok_s_pipeline_{parts}"] / mono_whole, 3
            )
            metrics[f"ratio_first_token_pipeline_{parts}_vs_monolithic"] = round(
                metrics[f"prefill_ms_pipeline_{parts}"] / metrics["prefill_ms_monolithic"], 3
            )
            metrics[f"ratio_decode_pipeline_{parts}_vs_monolithic"] = round(rate / mono, 3)
            metrics[f"ratio_decode_pipeline_{parts}_vs_inprocess"] = round(rate / inp, 3)
            metrics[f"hop_overhead_ms_per_token_pipeline_{parts}"] = round(
                (1000 / rate - 1000 / inp) / parts, 3
            )

        # ---- wire bytes per generated token, all hops, framing included ----------------
        log.info("wire bytes per token")
        wire_ids = ids[:8] if args.quick else ids  # quick: a short prefill (it cancels out)
        wire_parts = 3 if 3 in hops else parts_list[-1]
        wire_runs = (
            ("float32", "raw", "raw"),
            ("float16", "raw", "fp16"),
            ("float32", COMPRESSED_CODEC, "compressed"),
        )
        for dtype, codec, label in wire_runs:
            metrics[f"wire_bytes_per_token_{label}_{wire_parts}"] = round(
                wire_bytes_per_token(hops[wire_parts], head, wire_ids, dtype, codec, wire_lengths)
            )
        # bytes per generated token on node ports beside tok/s: the default wire (WIRE_DTYPE
        # raw frames, what every client sends) and float32 frames (the default before issue 46)
        default_label = {"float16": "fp16", "float32": "raw"}[WIRE_DTYPE]
        metrics["bytes_per_token"] = metrics[f"wire_bytes_per_token_{default_label}_{wire_parts}"]
        metrics["bytes_per_token_fp32"] = metrics[f"wire_bytes_per_token_raw_{wire_parts}"]
        metrics["ratio_bytes_per_token_default_vs_fp32"] = round(
            metrics["bytes_per_token"] / metrics["bytes_per_token_fp32"], 4
        )
        # what the star relay (client POSTs every step to each node, retired) measured at 3
        # nodes before the forwarding transport replaced it
        metrics["wire_bytes_per_token_issue_baseline"] = 22900
        for _, _, label in wire_runs:
            metrics[f"ratio_wire_bytes_{label}_vs_issue_baseline"] = round(
                metrics[f"wire_bytes_per_token_{label}_{wire_parts}"] / 22900, 3
            )

        # ---- activations on the wire, and greedy tokens with compression ------------------
        # "compressed" = COMPRESSED_CODEC (hq9, what `planet ask --compress` uses); plain
        # blockwise int8 is measured beside it as the Nesa baseline.
        one = np.asarray(head.embed_np([ids[-1]]))
        prompt = np.asarray(head.embed_np(ids))
        n_tok, n_prompt = one.size, prompt.size
        raw_frame = FRAME_HEADER_BYTES + n_tok * 4
        metrics["activation_bytes_per_token_raw"] = body_size("float32", "raw", n_tok)
        metrics["frame_header_bytes_per_hop"] = FRAME_HEADER_BYTES
        for codec, label in ((COMPRESSED_CODEC, "compressed"), ("int8", "int8")):
            body = len(encode_body(one, "float32", codec))  # measured: rq is variable-rate
            metrics[f"activation_bytes_per_token_{label}"] = body
            metrics[f"ratio_activation_bytes_{label}_vs_raw"] = round(body / (n_tok * 4), 4)
            metrics[f"ratio_frame_bytes_{label}_vs_raw_per_token"] = round(
                (body + FRAME_HEADER_BYTES) / raw_frame, 4
            )
            metrics[f"activation_bytes_prefill_{len(ids)}_tokens_{label}"] = len(
                encode_body(prompt, "float32", codec)
            )
        metrics[f"activation_bytes_prefill_{len(ids)}_tokens_raw"] = n_prompt * 4
        check_parts = 3 if 3 in hops else parts_list[-1]
        # greedy tokens against float32 raw frames: the compressed codecs, and the default
        # float16 wire (its agreement over more prompts and int8 shards: bench/wire_dtype.py)
        checked = (
            ()
            if skip_codec
            else (
                ("float16", "raw", "fp16"),
                ("float32", COMPRESSED_CODEC, "compressed"),
                ("float32", "int8", "int8"),
            )
        )
        for dtype, codec, label in checked:
            unchanged = []
            first_divergence = []
            for messages in check_prompts:
                prompt_ids = head.chat_ids(messages)
                raw_tokens, _ = asyncio.run(
                    _pipeline_run(
                        hops[check_parts], head, prompt_ids, 32, stop_on_eos=True, dtype="float32"
                    )
                )
                packed_tokens, _ = asyncio.run(
                    _pipeline_run(
                        hops[check_parts],
                        head,
                        prompt_ids,
                        32,
                        codec=codec,
                        stop_on_eos=True,
                        dtype=dtype,
                    )
                )
                unchanged.append(raw_tokens == packed_tokens)
                pairs = zip(raw_tokens, packed_tokens, strict=False)
                first_divergence.append(next((i for i, (a, b) in enumerate(pairs) if a != b), None))
            metrics[f"greedy_tokens_unchanged_{label}"] = all(unchanged)
            metrics[f"{label}_prompts_checked"] = len(unchanged)
            metrics[f"{label}_prompts_unchanged"] = sum(unchanged)
            metrics[f"{label}_first_divergence_step"] = first_divergence
        metrics["compressed_codec"] = COMPRESSED_CODEC
    finally:
        stop_nodes([node for _, nodes in circuits.values() for node in nodes])

    log.info("nodes stopped")
    sizes = shard_sizes(args.quick)
    for name, size in sizes.items():
        metrics[f"shard_bytes_{name}"] = size
    metrics["ratio_shard_bytes_int8_vs_fp32"] = round(sizes["int8"] / sizes["fp32"], 4)
    metrics["ratio_shard_bytes_int4_vs_fp32"] = round(sizes["int4"] / sizes["fp32"], 4)
    if not (args.skip_ppl or args.quick):
        ppl, ppl_tokens = perplexities(progress)
        metrics["ppl_heldout_tokens"] = ppl_tokens
        for name, value in ppl.items():
            metrics[f"ppl_{name}"] = round(value, 3)
        metrics["ratio_ppl_int8_vs_fp32"] = round(ppl["int8"] / ppl["fp32"], 4)
        metrics["ratio_ppl_int4_vs_fp32"] = round(ppl["int4"] / ppl["fp32"], 4)

    result = {
        "bench": "pipeline",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "max_new_tokens": new_tokens,
            "repeats": repeats,
            "parts": parts_list,
            "prompt_tokens": len(ids),
            "torch_threads": threads,
            "topology": "pipeline_K: a circuit of K nodes forwarding to each other over "
            "WebSockets; loopback",
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "monolithic": "transformers generate, fp32, "
            + ("in the client's process, " if args.quick else "own process per repeat, ")
            + f"{' and '.join(map(str, mono_threads_list))} torch thread(s) measured, the "
            "faster one compared",
            "warm_up": warm_up,
            "wire_bytes_lengths": list(wire_lengths),
            "wire_dtype": f"{WIRE_DTYPE} raw frames (the clients' default) for the timed runs "
            "and bytes_per_token; bytes_per_token_fp32: float32 raw frames",
            "client_omp_wait_policy": "PASSIVE",
            "ppl_text": "node/model/data/heldout.txt (teacher forced, 3 shards)",
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {
            "ratio_decode_pipeline_3_vs_monolithic": {"op": ">=", "value": 0.95},
            "ratio_whole_pipeline_3_vs_monolithic": {"op": ">=", "value": 0.95},
            "ratio_first_token_pipeline_3_vs_monolithic": {"op": "<=", "value": 1.5},
            "ratio_wire_bytes_fp16_vs_issue_baseline": {"op": "<=", "value": 0.25},
            # issue 46: bytes per generated token on node ports <= 0.5x float32 frames
            "ratio_bytes_per_token_default_vs_fp32": {"op": "<=", "value": 0.5},
            "ratio_shard_bytes_int8_vs_fp32": {"op": "<=", "value": 0.30},
            "ratio_shard_bytes_int4_vs_fp32": {"op": "<=", "value": 0.18},
            "ratio_ppl_int8_vs_fp32": {"op": "<=", "value": 1.02},
            "ratio_ppl_int4_vs_fp32": {"op": "<=", "value": 1.10},
            "ratio_activation_bytes_compressed_vs_raw": {"op": "<=", "value": 0.30},
            "greedy_tokens_unchanged_compressed": {"op": "==", "value": True},
        },
    }
    import json

    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_process(main)
