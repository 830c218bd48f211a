"""The live one-hop probe: hop_probe.py's `step` and `check` over a one-hop CircuitClient.

The verifier draws the probe's tokens itself, computes the probed shard's input with its own
copies of the shards before it (rounded to the wire's fp16, as the node receives it) and its
own output of the probed shard for every position, all before the clock starts. Then it opens
`sessions` sessions at the node as a one-hop circuit (the node is the last hop: an `open`
without `next`), and `time_hop` steps each session one position at a time: `send` the row,
`receive` the node's row. Each answer is checked as a spot check is: its fingerprint against
the verifier's own output for that position (protocol/fingerprint.py, the calibrated
tolerance of the shard's quantization).

    rows = probe_rows(head.embed, before=[shard0], probed=shard1, tokens=[[...], ...])
    async with CircuitClient([Hop(url, 1, key)], hidden_size=H, payer=payer) as client:
        result = await run_probe(client, probe, rows, tolerance)

Paying a charging node is the client's (`payer`, as for any question). The worker schedules
it each epoch through hop_runner.py (which nodes: hop_schedule.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from node.client.capabilities import new_session_id
from node.client.circuit import CircuitClient
from node.verifier.fingerprint import check, fingerprint_bytes
from node.verifier.hop_probe import Clock, HopProbe, HopResult, time_hop
from protocol.errors import PlanetError
from protocol.fingerprint import Tolerance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeRows:
    """Per session: the probed shard's input rows [1, P, H] (fp16 values, as sent) and the
    verifier's own outputs of that shard for them [1, P, H]."""

    inputs: tuple[np.ndarray, ...]
    expected: tuple[torch.Tensor, ...]


def probe_rows(
    embed: Callable[[Sequence[int]], torch.Tensor],
    before: Sequence[Any],
    probed: Any,
    tokens: Sequence[Sequence[int]],
    after: Sequence[Any] = (),
) -> ProbeRows:
    """The rows of one probe: `tokens` per session (the verifier's own draw), through `embed`
    and the shards `before` the probed one (each a ShardModel: `new_cache`, `forward`), then
    `probed` and, for a span hop, the span's further shards `after` (unrounded between them, as
    a span runs them in one process) for the expected outputs."""
    inputs: list[np.ndarray] = []
    expected: list[torch.Tensor] = []
    with torch.inference_mode():
        for ids in tokens:
            positions = torch.arange(len(ids))
            hidden = embed(list(ids))
            for shard in before:
                hidden = shard.forward(hidden, positions, shard.new_cache())
            sent = hidden.to(torch.float16).to(torch.float32)  # what the node receives
            inputs.append(sent.numpy().astype(np.float16))
            out = probed.forward(sent, positions, probed.new_cache())
            for shard in after:
                out = shard.forward(out, positions, shard.new_cache())
            expected.append(out)
    return ProbeRows(tuple(inputs), tuple(expected))


async def run_probe(
    client: CircuitClient,
    probe: HopProbe,
    rows: ProbeRows,
    tolerance: Tolerance,
    clock: Clock = time.monotonic,
) -> HopResult:
    """Open the probe's sessions at the client's one hop, time them (`time_hop`: opens not
    counted) and close them; not clean when the node refuses or an answer is wrong."""
    if len(client.hops) != 1 or len(rows.inputs) != probe.sessions:
        raise ValueError("a one-hop probe needs one hop and one row set per session")
    sids: list[int] = []
    try:
        for _ in range(probe.sessions):
            sids.append(await client.open(new_session_id()))

        async def step(session: int, position: int) -> object:
            row = rows.inputs[session][:, position : position + 1]
            try:
                await client.send(sids[session], position, row)
                return await client.receive(sids[session], position, 1)
            except PlanetError as error:  # refused, closed, unpaid: that session is not clean
                return error  # (raised in `time_hop`'s task group it would escape the except)

        def right(session: int, position: int, answer: object) -> bool:
            if isinstance(answer, PlanetError):
                why = f"{type(answer).__name__}: {answer}"
            elif not isinstance(answer, np.ndarray) or answer.shape != (1, 1, client.hidden_size):
                why = f"an answer of shape {getattr(answer, 'shape', type(answer).__name__)}"
            else:
                got = torch.from_numpy(answer.astype(np.float32))
                own = rows.expected[session][:, position : position + 1]
                if check(fingerprint_bytes(got, position), own, position, tolerance).passed:
                    return True
                why = "an answer off the verifier's own beyond the tolerance"
            log.warning(
                "hop probe not clean node=%s session=%d position=%d: %s",
                client.hops[0].url, session, position, why,
            )  # fmt: skip
            return False

        return await time_hop(probe, step, right, clock)
    except PlanetError as error:
        log.warning(
            "hop probe not clean node=%s: %s: %s", client.hops[0].url, type(error).__name__, error
        )
        return HopResult(0.0, clean=False)
    finally:
        for sid in sids:
            with contextlib.suppress(PlanetError, ConnectionError, RuntimeError):
                await client.close(sid)
