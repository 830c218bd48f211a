"""`planet ask PROMPT`: run a prompt through the shard nodes of a nodes file, stream the answer."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet ask "What is the capital of France?"
  planet ask "Write a haiku about rivers" --temperature 0.8 --top-p 0.9 --seed 7
  planet ask "Hello" --nodes my-nodes.json --max-tokens 32 --json
note: nodes see the activations of your prompt and could read it back; they never see who
asked (no account, wallet or query id is sent with the activations).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ask",
        help="ask a question through the running shard nodes",
        description="Ask a question through the shard nodes listed in a nodes file "
        "(default: the one `planet local up` wrote). Greedy unless --temperature is given.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("prompt", help="the question (one user turn, chat template applied)")
    parser.add_argument(
        "--nodes",
        type=Path,
        default=None,
        help="nodes file (default: $PLANET_HOME/local/nodes.json)",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens at most (128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument(
        "--compress",
        action="store_true",
        help="compress activations on the wire (ohq7: ~25 %% of fp32 bytes; lossy, see docs)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (text, tokens, timings, circuit)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from node.client.nodesfile import NodesFile, default_nodes_path
    from node.client.sampling import SamplingConfig

    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be >= 1")
    if not args.prompt.strip():
        raise UsageError("the prompt is empty")
    sampling = SamplingConfig(args.temperature, args.top_p, args.seed).validate()
    # Before torch loads: our idle OpenMP threads sleep instead of spinning on the cores the
    # nodes need while they compute (same setting the local nodes get).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    nodes = NodesFile.load(args.nodes or default_nodes_path())
    if not nodes.manifest.is_file():
        raise UsageError(
            f"the nodes file names a manifest that does not exist: {nodes.manifest}",
            hint="run `planet local up` again",
        )
    result = asyncio.run(_ask(args, nodes, sampling))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    return 0


async def _ask(args: argparse.Namespace, nodes: Any, sampling: Any) -> dict[str, Any]:
    from node.client.head import NumpyHead
    from node.client.pipeline import Hop, PipelineClient, Timings
    from node.model.manifest import Manifest
    from node.server.run import configure_torch_threads
    from protocol.frames import COMPRESSED_CODEC

    manifest = Manifest.load(nodes.manifest)
    configure_torch_threads(0)
    head = NumpyHead(nodes.manifest)
    prompt_ids = head.chat_ids([{"role": "user", "content": args.prompt}])
    hops = [Hop(url=n.url, shard=n.shard) for n in nodes.nodes]
    timings = Timings()
    tokens: list[int] = []
    printed = ""
    codec = COMPRESSED_CODEC if args.compress else "raw"
    async with PipelineClient(hops, codec=codec) as client:
        await client.check_circuit(manifest.model_hash, manifest.total_layers)
        async for token in client.generate(
            head, prompt_ids, max_new_tokens=args.max_tokens, sampling=sampling, timings=timings
        ):
            tokens.append(token)
            if not args.json:
                text = head.decode(tokens)
                # print only what is new and stable (a partial UTF-8 sequence decodes to U+FFFD)
                if text.startswith(printed) and not text.endswith("\ufffd"):
                    sys.stdout.write(text[len(printed) :])
                    sys.stdout.flush()
                    printed = text
    text = head.decode(tokens)
    if not args.json:
        sys.stdout.write((text[len(printed) :] if text.startswith(printed) else "") + "\n")
        sys.stdout.flush()
    return {
        "text": text,
        "tokens": tokens,
        "timings": timings.to_json(),
        "circuit": [
            {"url": n.url, "shard": n.shard, "layers": list(n.layers)} for n in nodes.nodes
        ],
        "model": manifest.model_id,
        "codec": codec,
    }
