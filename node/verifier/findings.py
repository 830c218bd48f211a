"""Spot-check findings handed from verifier to verifier, so a node cannot hide from the committee.

A node may answer the one verifier a check is assigned to and withhold the ticket from the
others: their re-judgements would end in TIMEOUT and the FAILED verdict would never reach 2/3.
So the finder hands over what the node gave it — its own signed request and the node's signed
statement (signature ‖ ticket bytes) — and each peer re-judges the node's own bytes. The peer
checks both signatures and the commitment itself (protocol/tickets.py `open_forwarded`,
node/verifier/tickets.py `judge_ticket`), so a finder can neither forge nor alter a ticket:
what it forwards convicts the node only if the node's bytes fail the peer's own recomputation.

    finder   FindingBook.keep(evidence, epoch, verifiers, request, statement)   a FAILED finding
                                      (kept on disk too: a restarted verifier still has it)
             serve_findings(book, host, port)   GET /v1/findings/{evidence}/{peer key}: the
                                      finding sealed to that peer (only a verifier of the
                                      check's epoch set; 404 otherwise)
    peer     PeerFindings.fetch(url, evidence, me)   one finder's copy, sealed to `me`

Sealed to one peer: a ticket's inputs are a user's activations, from which a probe recovers
most prompt tokens (docs/privacy.md), so nobody but the verifiers the node had to answer may
open them. Each validator publishes its verifier's URL on the committee chain
(`verifier_endpoint`, `/verifier_endpoints`); a peer dials only what the chain lists, and like
a node's next hops (node/server/next_hops.py) only public addresses unless its operator allows
private ranges (`--private-peers`: a devnet or a LAN); redirects are never followed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
from aiohttp import web

from node.client.answers import read_bounded
from node.dial import refuse_redirects
from node.http_logs import quiet_malformed_http_logs
from node.server.next_hops import Network, PublicResolver, address_refusal
from protocol.errors import PlanetError
from protocol.tickets import MAX_FORWARDED_BYTES, TicketRequest, decode_request, forward
from protocol.urls import BadUrlError, canonical_url

log = logging.getLogger(__name__)

FINDINGS_PATH: Final = "/v1/findings"
FETCH_TIMEOUT_S: Final = 30.0  # one finder's answer (a ticket is ~0.3 MB on SmolLM2)
_EVIDENCE = re.compile(r"0x[0-9a-f]{64}\Z")
_KEY = re.compile(r"[0-9a-f]{64}\Z")
_SUFFIX = ".finding"


class PeerNotAllowedError(PlanetError):
    """A verifier URL this verifier's dial policy refuses (a non-public address)."""

    code = "peer_not_allowed"
    http_status = 403


@dataclass
class _Finding:
    epoch: int
    verifiers: frozenset[str]
    request: TicketRequest
    statement: bytes
    sealed: dict[str, bytes] = field(default_factory=dict)  # peer → its sealed copy


class FindingBook:
    """The FAILED findings this verifier can forward, by evidence hash (0x hex). With a
    `directory`, each one is also written there (`<evidence>.finding`) and read back at start,
    so a restarted verifier still hands over the findings its peers have not fetched yet."""

    def __init__(self, directory: Path | None = None) -> None:
        self._held: dict[str, _Finding] = {}
        self.directory = directory
        if directory is not None:
            self._load(directory)

    def __len__(self) -> int:
        return len(self._held)

    def keep(
        self,
        evidence: str,
        epoch: int,
        verifiers: Sequence[str],
        request: TicketRequest,
        statement: bytes,
    ) -> None:
        """Hold a finding of a check of `epoch` whose verifier set is `verifiers`."""
        if evidence in self._held or not _EVIDENCE.match(evidence):
            return
        self._held[evidence] = _Finding(epoch, frozenset(verifiers), request, statement)
        if self.directory is not None:
            header = json.dumps(
                {
                    "epoch": epoch,
                    "verifiers": sorted(verifiers),
                    "request": request.encode().decode(),
                }
            ).encode()
            path = self.directory / f"{evidence}{_SUFFIX}"
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(struct.pack(">I", len(header)) + header + statement)
            tmp.replace(path)

    def _load(self, directory: Path) -> None:
        for path in sorted(directory.glob(f"*{_SUFFIX}")):
            evidence = path.name.removesuffix(_SUFFIX)
            try:
                raw = path.read_bytes()
                (length,) = struct.unpack_from(">I", raw)
                header = json.loads(raw[4 : 4 + length])
                request = decode_request(header["request"].encode())
                epoch, verifiers = header["epoch"], header["verifiers"]
                if not _EVIDENCE.match(evidence) or type(epoch) is not int:
                    raise ValueError("not a finding")
                if not all(isinstance(v, str) and _KEY.match(v) for v in verifiers):
                    raise ValueError("bad verifier keys")
            except (OSError, ValueError, KeyError, TypeError, struct.error, PlanetError) as error:
                log.warning("finding %s not read back: %s", path.name, error)
                continue
            statement = raw[4 + length :]
            self._held[evidence] = _Finding(epoch, frozenset(verifiers), request, statement)
        if self._held:
            log.info("%d findings read back from %s", len(self._held), directory)

    def sealed_for(self, evidence: str, peer: str) -> bytes | None:
        """The finding sealed to `peer`; None if not held or `peer` is not of its epoch's set."""
        held = self._held.get(evidence)
        if held is None or peer not in held.verifiers or peer == held.request.verifier:
            return None
        if peer not in held.sealed:
            try:
                held.sealed[peer] = forward(held.request, held.statement, peer)
            except PlanetError as error:  # a damaged file read back: nothing to hand over
                log.warning("finding %s not forwardable: %s", evidence[:18], error)
                return None
        return held.sealed[peer]

    def prune(self, oldest_epoch: int) -> None:
        """Forget findings of checks older than `oldest_epoch` (their files too)."""
        for evidence, held in list(self._held.items()):
            if held.epoch < oldest_epoch:
                del self._held[evidence]
                if self.directory is not None:
                    (self.directory / f"{evidence}{_SUFFIX}").unlink(missing_ok=True)


def findings_app(book: FindingBook) -> web.Application:
    app = web.Application(client_max_size=4096)

    async def finding(request: web.Request) -> web.Response:
        evidence, peer = request.match_info["evidence"], request.match_info["peer"]
        if not _EVIDENCE.match(evidence) or not _KEY.match(peer):
            return web.json_response(
                {"code": "bad_request", "message": "evidence is 0x + 64 hex, peer 64 hex"},
                status=400,
            )
        sealed = await asyncio.to_thread(book.sealed_for, evidence, peer)
        if sealed is None:
            return web.json_response(
                {"code": "not_found", "message": "no finding of that evidence for that verifier"},
                status=404,
            )
        return web.Response(body=sealed, content_type="application/octet-stream")

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "findings": len(book)})

    app.router.add_get(FINDINGS_PATH + "/{evidence}/{peer}", finding)
    app.router.add_get("/health", health)
    return app


async def serve_findings(book: FindingBook, host: str, port: int) -> web.AppRunner:
    """Start serving `book` on host:port; the caller cleans the runner up."""
    quiet_malformed_http_logs()
    runner = web.AppRunner(findings_app(book), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise PlanetError(
            f"cannot listen on {host}:{port} for findings: {error.strerror or error}",
            hint="choose another --findings-listen port",
            code="findings_listen",
        ) from None
    log.info("findings served on %s:%d", host, port)
    return runner


class PeerFindings:
    """Fetching peers' findings from the URLs their validators published, under this verifier's
    dial policy: public addresses only (host names resolved to public addresses only), or, with
    `private_ranges`, IP literals that are public or inside those ranges."""

    def __init__(
        self,
        private_ranges: tuple[Network, ...] | None = None,
        *,
        timeout_s: float = FETCH_TIMEOUT_S,
    ) -> None:
        self.private_ranges = private_ranges
        self.timeout_s = timeout_s
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            connector = (
                aiohttp.TCPConnector(resolver=PublicResolver())
                if not self.private_ranges
                else aiohttp.TCPConnector()
            )
            self._http = aiohttp.ClientSession(
                connector=connector,
                middlewares=(refuse_redirects,),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        return self._http

    def check(self, url: object) -> str:
        """The canonical URL if this verifier may dial it, else PeerNotAllowedError."""
        try:
            canonical = canonical_url(url)
        except BadUrlError as error:
            raise PeerNotAllowedError(f"verifier URL refused: {error.message}") from None
        ranges = self.private_ranges or ()
        refusal = address_refusal(canonical, not ranges, ranges)  # no ranges: public only
        if refusal == "private":
            raise PeerNotAllowedError(
                f"{canonical} is not a public address (allow private ranges with "
                "--private-peers on a devnet or LAN)"
            )
        if refusal == "host_name":
            raise PeerNotAllowedError(
                f"{canonical} names a host; limited to private ranges, this verifier dials IP "
                "addresses only"
            )
        if refusal == "outside_ranges":
            raise PeerNotAllowedError(f"{canonical} is outside the allowed private ranges")
        return canonical

    async def fetch(self, url: object, evidence: str, me: str) -> bytes:
        """A finder's copy of finding `evidence` sealed to `me` (PlanetError, aiohttp.ClientError,
        OSError or TimeoutError when there is none)."""
        base = self.check(url)
        async with asyncio.timeout(self.timeout_s):
            async with self._session().get(f"{base}{FINDINGS_PATH}/{evidence}/{me}") as answer:
                if answer.status != 200:
                    text = (await answer.content.read(512)).decode("utf-8", "replace")
                    raise PlanetError(
                        f"{base} answered {answer.status}: {text[:160]}", code="no_finding"
                    )
                return await read_bounded(answer, MAX_FORWARDED_BYTES, base)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
