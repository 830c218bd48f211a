"""A verifier fetching and judging one spot-check ticket over HTTP, with a deadline.

    result = await spot_check(http, endpoint, request, verifier_key, shard=shard,
                              commitment=value, tolerance=tol, deadline_s=30)

`request` is a `protocol.tickets.TicketRequest` for a selected triple assigned to this verifier
(`protocol.spotcheck.select` / `assign_verifier` under the epoch seed), signed with
`verifier_key`. The node's endpoint comes from its registration (`/node?key=`), the commitment
from the committee chain. Until `deadline_s` runs out, refusals, unreachable nodes and answers
that are not a valid ticket from that node are retried every `retry_s`; then the result is
`Outcome.TIMEOUT` (offence 4, 5 %). A valid ticket is judged once (`judge_ticket`): PASSED or
FAILED (offence 3, 50 %); a FAILED result keeps the node's signed statement (`statement`), which
the finder forwards to its peers (node/verifier/findings.py). The recomputation runs on a worker
thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import aiohttp
from nacl.signing import SigningKey

from node.client.answers import read_bounded
from node.links import link_ssl
from node.verifier.tickets import TicketResult, judge_ticket, timeout_result
from protocol.errors import ProtocolError
from protocol.fingerprint import Tolerance
from protocol.spotcheck import Outcome
from protocol.tickets import (
    MAX_SEALED_BYTES,
    SIGNATURE_BYTES,
    TicketRequest,
    decode_ticket,
    unseal,
)

log = logging.getLogger(__name__)


async def fetch_ticket(
    http: aiohttp.ClientSession,
    endpoint: str,
    request: TicketRequest,
    timeout_s: float,
    *,
    plaintext_links: bool = False,
) -> bytes:
    """One POST /v1/tickets over a link pinned to the node key the request names (https;
    node/links.py); the sealed bytes, or an exception (HTTP status, network, a key mismatch,
    a plaintext link off loopback, size: `node.client.answers.AnswerTooLargeError`)."""
    pin = link_ssl(endpoint, request.triple.node, plaintext_ok=plaintext_links)
    async with asyncio.timeout(timeout_s):
        async with http.post(
            f"{endpoint}/v1/tickets",
            data=request.encode(),
            headers={"Content-Type": "application/json"},
            ssl=pin,
        ) as answer:
            if answer.status != 200:
                text = (await answer.content.read(2048)).decode("utf-8", "replace")
                raise aiohttp.ClientResponseError(
                    answer.request_info, (), status=answer.status, message=text[:200]
                )
            return await read_bounded(answer, MAX_SEALED_BYTES, endpoint)


async def spot_check(
    http: aiohttp.ClientSession,
    endpoint: str,
    request: TicketRequest,
    verifier_key: SigningKey,
    *,
    shard: Any,
    commitment: bytes,
    tolerance: Tolerance,
    deadline_s: float = 30.0,
    retry_s: float = 1.0,
    numerics: int | None = None,
) -> TicketResult:
    """Fetch the ticket before the deadline and judge it; TIMEOUT if no valid ticket came."""
    deadline = time.monotonic() + deadline_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return timeout_result(request)
        try:
            sealed = await fetch_ticket(http, endpoint, request, left)
            statement = unseal(sealed, request, verifier_key)
            ticket = decode_ticket(statement[SIGNATURE_BYTES:])
        except (aiohttp.ClientError, TimeoutError, ProtocolError) as error:
            log.info("no valid ticket yet endpoint=%s error=%s", endpoint, str(error)[:160])
            await asyncio.sleep(min(retry_s, max(0.0, deadline - time.monotonic())))
            continue
        result = await asyncio.to_thread(
            judge_ticket,
            ticket,
            request,
            shard=shard,
            commitment=commitment,
            tolerance=tolerance,
            numerics=numerics,  # the node's announced numerics: other than ours → SKIPPED
        )
        if result.outcome is Outcome.FAILED:
            result = dataclasses.replace(result, statement=statement)
        return result
