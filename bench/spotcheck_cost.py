"""What one spot check costs: ticket size, the node's build + seal, the verifier's check.

SmolLM2-135M fp32, the middle of 3 shards (10 layers), one 128-token natural text served as
users are (32-token prefill, then one position per forward); the checked block is the last one
(positions 96…127, so the ticket carries 128 positions of inputs). Compared with what serving
that block cost the node (32 decode steps of its shard). Medians of --repeats.

A FAILED finding is forwarded by its finder to each peer verifier (node/verifier/findings.py):
`forwarded_bytes` (request + node-signed ticket, sealed), the finder's `forward` and the peer's
`open_forwarded` (both signatures checked) in ms, and `forwarded_fetch_ms_loopback`: the
peer's GET from the finder's findings server over real loopback HTTP (PeerFindings, sealing
included on the first fetch of each peer).

    .venv/bin/python bench/spotcheck_cost.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from nacl.signing import SigningKey

from bench._common import machine, parse_with_quick
from node.model.evaluate import heldout_text
from node.verifier.calibration import load_calibration
from node.verifier.fingerprint import fingerprint_bytes
from node.verifier.measure import load_circuit, serve_trace
from node.verifier.tickets import check_ticket
from protocol.eip712 import commitment_value
from protocol.served import inputs_digests, served_output_hash
from protocol.spotcheck import Triple
from protocol.tickets import TicketRequest, encode_ticket, forward, open_forwarded, seal, unseal

POSITIONS, BLOCK = 128, 3


def forwarding(
    request: TicketRequest, sealed: bytes, finder: SigningKey, repeats: int
) -> dict[str, float]:
    """The finder's forward, the peer's open, and loopback fetches of one finding (ms)."""
    import asyncio
    import ipaddress

    from harness.ports import ephemeral_port
    from node.verifier.findings import FindingBook, PeerFindings, serve_findings

    statement = unseal(sealed, request, finder)
    peers = [SigningKey(secrets.token_bytes(32)) for _ in range(repeats)]
    seal_ms, open_ms = [], []
    for peer in peers:
        t0 = time.perf_counter()
        forwarded = forward(request, statement, peer.verify_key.encode().hex())
        t1 = time.perf_counter()
        open_forwarded(forwarded, peer)
        open_ms.append((time.perf_counter() - t1) * 1000)
        seal_ms.append((t1 - t0) * 1000)
    evidence = "0x" + "ab" * 32
    keys = [p.verify_key.encode().hex() for p in peers]

    async def fetches() -> list[float]:
        book = FindingBook()
        book.keep(evidence, 1, [request.verifier, *keys], request, statement)
        port = ephemeral_port()
        runner = await serve_findings(book, "127.0.0.1", port)
        client = PeerFindings((ipaddress.ip_network("127.0.0.0/8"),))
        out = []
        try:
            for key in keys:
                t0 = time.perf_counter()
                await client.fetch(f"http://127.0.0.1:{port}", evidence, key)
                out.append((time.perf_counter() - t0) * 1000)
        finally:
            await client.close()
            await runner.cleanup()
        return out

    fetch_ms = asyncio.run(fetches())
    return {
        "forwarded_bytes": len(forwarded),
        "finder_forward_ms": round(statistics.median(seal_ms), 2),
        "peer_open_forwarded_ms": round(statistics.median(open_ms), 2),
        "forwarded_fetch_ms_loopback": round(statistics.median(fetch_ms), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_with_quick(parser, {"repeats": 1})
    torch.set_num_threads(1)
    load_start = list(os.getloadavg())
    circuit = load_circuit("none")
    head, first, shard = circuit.head, circuit.shards[0], circuit.shards[1]
    ids = head.encode(heldout_text())[:POSITIONS]
    with torch.inference_mode():
        inputs = first.forward(head.embed(ids), torch.arange(POSITIONS), first.new_cache())
    outputs = serve_trace([shard], inputs, 32).outputs[0]
    node, verifier = SigningKey(secrets.token_bytes(32)), SigningKey(secrets.token_bytes(32))
    session, salt = secrets.token_bytes(32), secrets.token_bytes(32)
    start = BLOCK * 32
    fingerprint = fingerprint_bytes(outputs[:, start : start + 32], start)
    bound = served_output_hash(fingerprint, inputs_digests(inputs.numpy())[BLOCK])
    commitment = commitment_value(session, BLOCK, 1, bound, salt)
    triple = Triple(node.verify_key.encode().hex(), "0x" + session.hex(), BLOCK, 1)
    request = TicketRequest(triple, "0x" + "00" * 32, verifier.verify_key.encode().hex())
    request = request.signed(verifier)
    tolerance = load_calibration().tolerance("none")
    build, check = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        plain = encode_ticket(BLOCK, salt, fingerprint, inputs.numpy())
        sealed = seal(plain, request, node)
        t1 = time.perf_counter()
        result = check_ticket(
            sealed, request, verifier, shard=shard, commitment=commitment, tolerance=tolerance
        )
        check.append(time.perf_counter() - t1)
        build.append(t1 - t0)
    decode = []
    with torch.inference_mode():
        for _ in range(args.repeats):
            cache = shard.new_cache()
            shard.forward(inputs[:, :start], torch.arange(start), cache)
            t0 = time.perf_counter()
            for position in range(start, POSITIONS):
                shard.forward(inputs[:, position : position + 1], torch.tensor([position]), cache)
            decode.append(time.perf_counter() - t0)
    forwarded = forwarding(request, sealed, verifier, args.repeats)
    check_ms = statistics.median(check) * 1000
    serve_ms = statistics.median(decode) * 1000
    print(
        json.dumps(
            {
                "bench": "spotcheck_cost",
                "machine": machine(),
                "config": {
                    "model": "smollm2-135m",
                    "shard": "1 of 3 (10 layers), fp32",
                    "ticket_positions": POSITIONS,
                    "checked_block": BLOCK,
                    "repeats": args.repeats,
                    "quick": args.quick,
                    "loadavg_start": load_start,
                },
                "metrics": {
                    "outcome_passed": int(result.outcome.value == "passed"),  # 1: the check passed
                    "ticket_bytes": len(plain),
                    "sealed_ticket_bytes": len(sealed),
                    "node_ticket_build_seal_ms": round(statistics.median(build) * 1000, 2),
                    "verifier_check_ms": round(check_ms, 1),
                    "node_serving_ms_for_the_block": round(serve_ms, 1),
                    "ratio_verifier_check_vs_serving_block": round(check_ms / serve_ms, 3),
                    **forwarded,
                    "loadavg_end": list(os.getloadavg()),
                },
                "targets": {},
            }
        )
    )


if __name__ == "__main__":
    main()
