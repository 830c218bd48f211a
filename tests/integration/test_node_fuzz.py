"""Fuzz a real compute node with hostile HTTP requests generated from a grammar, while an honest
client generates through the same circuit.

Two real node processes (SmolLM2, 2 unquantized shards) start via node/server/launcher.py. The
fuzz talks raw HTTP/1.1 over keep-alive sockets to node 0 from three loopback addresses (three
callers), so it controls every byte: prefixes, frame headers built from a grammar of hostile
values (wrong types, huge/negative/non-ASCII values, bad dtypes, codecs, shapes, positions, junk
session capabilities, deep nesting, non-JSON constants), bodies (truncated, extended, oversize,
NaN/Inf), methods and paths, chunked bodies and a few requests that are not HTTP at all.

Every answer must arrive (no dropped connection, no timeout) and be 2xx, or a 4xx/503 with a
named JSON `{code, message}` (HTTP that aiohttp cannot parse gets aiohttp's own 400 and a closed
connection); never a 500. The honest client (127.0.0.1) must get the same greedy tokens as
before the fuzz, during it and after it.

Reproducible: PLANET_FUZZ_SEED (printed on failure) seeds one random.Random per worker;
PLANET_FUZZ_CASES sets the count (default 10,000).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import secrets
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.client.head import NumpyHead
from node.client.pipeline import Hop, PipelineClient
from node.server.launcher import (
    NodeProcess,
    free_ports,
    pid_alive,
    start_node,
    stop_pid,
    wait_healthy,
)
from protocol.frames import MAGIC, NonFiniteError, encode_body

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("PLANET_FUZZ_SEED", "1302"))
CASES = int(os.environ.get("PLANET_FUZZ_CASES", "10000"))
PORTS = (18400, 18500)  # this module's share of the test port range
FUZZ_PEERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
CONNECTIONS_PER_PEER = 3
MAX_REQUEST_MB = 1
H = 576
PROMPT = "Name three rivers in Europe."
NEW_TOKENS = 12
ANSWER_TIMEOUT_S = 60.0

NAMED_CODES = frozenset(
    {
        "bad_frame",
        "bad_magic",
        "bad_version",
        "bad_header",
        "bad_session_id",
        "bad_dtype",
        "bad_codec",
        "bad_shape",
        "bad_positions",
        "bad_body",
        "non_finite",
        "too_large",
        "unknown_session",
        "session_expired",
        "wrong_shard",
        "busy",
        "slow_request",
        "not_found",
        "method_not_allowed",
    }
)


# ----------------------------------------------------------------------------------- grammar
HOSTILE_INTS: list[Any] = [
    -1,
    -(2**63),
    2**31,
    2**53 + 1,
    2**63,
    10**40,
    10**400,
    True,
    False,
    1.5,
    -0.0,
    1e308,
    "0",
    "\uff11",  # fullwidth digit one
    None,
    [],
    {},
    [1],
]
HOSTILE_STRINGS: list[Any] = [
    "",
    " ",
    "FLOAT32",
    "float32\x00",
    "float32 ",
    "\u00e9" * 30,
    "\u202e",
    "\ud800",
    "a" * 5000,
    "../../etc/passwd",
    "%00",
    None,
    0,
    [],
    {"a": 1},
]
BAD_CAPABILITIES: list[Any] = [
    "short",
    "a" * 21,
    "a" * 65,
    "a" * 4000,
    "has/slash-has/slash-has/slash",
    "has+plus=equals+plus=equals++",
    "with space with space with space",
    "\u00e9" * 30,
    "line\nbreak-line-break-line-break",
    None,
    12345678901234567890123,
    ["a" * 30],
]


@dataclass
class Pool:
    """Sessions this worker opened on the node: capability → positions held (best guess)."""

    held: dict[str, int] = field(default_factory=dict)

    def pick(self, rng: random.Random) -> tuple[str, int] | None:
        if not self.held:
            return None
        cap = rng.choice(sorted(self.held))
        return cap, self.held[cap]


@dataclass(frozen=True)
class Case:
    kind: str
    request: bytes
    head: bool = False  # a HEAD request: no body in the answer
    raw_http: bool = False  # not valid HTTP: aiohttp's own 400 and a closed connection
    opens: tuple[str, int] | None = None  # (capability, positions) if it may open/extend one
    closes: str | None = None


class Grammar:
    """Hostile requests for one compute node (shard 0, hidden size H)."""

    def __init__(self, rng: random.Random, pool: Pool) -> None:
        self.rng = rng
        self.pool = pool

    # -------------------------------------------------------------------- values
    def cap(self) -> Any:
        r = self.rng.random()
        if r < 0.55:
            return secrets.token_urlsafe(self.rng.choice((16, 32, 48)))
        if r < 0.75 and self.pool.held:
            return self.pool.pick(self.rng)[0]  # type: ignore[index]
        if r < 0.82:
            return f"{self.rng.getrandbits(256):064x}"  # looks like a session tag
        return self.rng.choice(BAD_CAPABILITIES)

    def maybe(self, valid: Any, hostile: list[Any], p: float = 0.85) -> Any:
        return valid if self.rng.random() < p else self.rng.choice(hostile)

    def positions(self, start: int, count: int) -> Any:
        r = self.rng.random()
        if r < 0.8:
            return {"start": start, "count": count}
        if r < 0.85:
            return list(range(start, start + count))
        if r < 0.9:
            return {"start": self.rng.choice(HOSTILE_INTS), "count": count}
        if r < 0.94:
            return {"start": start, "count": self.rng.choice([*HOSTILE_INTS, 0, count + 1])}
        return self.rng.choice(
            [[], [3, 1], [start, start + 2], {"start": start}, {"a": 1}, "0-1", None, 7]
        )

    def shape(self, count: int) -> Any:
        r = self.rng.random()
        if r < 0.85:
            return [1, count, H]
        return self.rng.choice(
            [
                [1, count],
                [2, count, H],
                [1, count + 1, H],
                [1, count, H + 1],
                [1, count, 0],
                [1, count, -H],
                [1, count, 2**62],
                [1, count, 1.5],
                [1, count, H, 1],
                [[1], count, H],
                "1x1x576",
                None,
            ]
        )

    def header(self, cap: Any, start: int, count: int, dtype: str, codec: str) -> Any:
        rng = self.rng
        header: dict[str, Any] = {
            "session": cap,
            "step": self.maybe(rng.randrange(0, 1000), HOSTILE_INTS),
            "positions": self.positions(start, count),
            "dtype": self.maybe(dtype, [*HOSTILE_STRINGS, "float64", "bfloat16", "int8"]),
            "shape": self.shape(count),
            "codec": self.maybe(codec, [*HOSTILE_STRINGS, "zstd", "RAW", "hq8"]),
            "shard": self.maybe(0, [*HOSTILE_INTS, 1, 2, 65536]),
        }
        if rng.random() < 0.3:
            header["last_only"] = self.maybe(rng.random() < 0.5, ["yes", 1, 0, None, []])
        r = rng.random()
        if r < 0.05:
            del header[rng.choice(sorted(header))]
        elif r < 0.09:
            header[rng.choice(["extra", "Session", "session ", "\u00e9", "__proto__"])] = 1
        elif r < 0.11:
            return rng.choice([[], "header", 7, None, [header]])
        return header

    def header_bytes(self, header: Any) -> bytes:
        rng = self.rng
        text = json.dumps(header, ensure_ascii=rng.random() < 0.5, allow_nan=True)
        data = text.encode("utf-8", "surrogatepass")
        r = rng.random()
        if r < 0.9:
            return data
        mutations = [
            lambda d: d[: rng.randrange(0, max(1, len(d)))],
            lambda d: d + b"}",
            lambda d: b"\xef\xbb\xbf" + d,
            lambda d: d.replace(b'"step"', b'"step": NaN, "x"', 1),
            lambda d: d.replace(b"{", b"{" + b"[" * 1500 + b"]" * 1500 + b",", 1),
            lambda d: b"[" * rng.randrange(4, 4000),
            lambda d: d[:5] + b"\xff\xfe" + d[5:],
            lambda d: d.replace(b'"session"', b'"session": "x", "session"', 1),
            lambda d: d + b" " * 5000,
            lambda d: bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64))),
        ]
        return rng.choice(mutations)(data)

    def body(self, count: int, dtype: str, codec: str) -> bytes:
        rng = self.rng
        values = np.random.default_rng(rng.getrandbits(32)).standard_normal((1, count, H))
        values = values.astype(np.float32)
        if rng.random() < 0.04:
            values[0, rng.randrange(count), rng.randrange(H)] = rng.choice(
                [np.nan, np.inf, -np.inf, 1e38]
            )
        try:
            with np.errstate(all="ignore"):
                body = encode_body(values, dtype, codec)
        except NonFiniteError:  # float16 overflow of 1e38: send float32 bytes instead
            body = values.tobytes()
        r = rng.random()
        if r < 0.8:
            return body
        if r < 0.86:
            return body[: rng.randrange(0, len(body))]
        if r < 0.92:
            return body + bytes(rng.randrange(1, 65))
        if r < 0.95:
            return b""
        if r < 0.975 and codec in ("int8", "hq9"):
            scales = np.full(-(-count * H // 64), np.nan, dtype="<f4").tobytes()
            return scales + body[len(scales) :]
        if r < 0.985:
            return bytes([0xFF]) * len(body)  # hq9 codes out of range / NaN halfs
        return bytes(MAX_REQUEST_MB * 1024 * 1024 + rng.randrange(1, 4096))  # oversize

    def prefix(self, header_len: int) -> bytes:
        rng = self.rng
        magic = MAGIC if rng.random() < 0.95 else rng.choice([b"FALP", b"\x00" * 4, b"PLA\xff"])
        version = 1 if rng.random() < 0.95 else rng.choice([0, 2, 255, 65535])
        length = header_len
        if rng.random() < 0.07:
            length = rng.choice([0, header_len - 1, header_len + 1, 4097, 2**32 - 1])
            length = max(0, length)
        return struct.pack(">4sHI", magic, version, length)

    # -------------------------------------------------------------------- requests
    def case(self) -> Case:
        r = self.rng.random()
        if r < 0.70:
            return self.hostile_frame()
        if r < 0.74:
            return self.valid_open()
        if r < 0.78:
            return self.continuation()
        if r < 0.84:
            return self.delete()
        if r < 0.86:
            return self.get(self.rng.choice(["/info", "/health"]))
        if r < 0.95:
            return self.wrong_route()
        if r < 0.98:
            return self.hostile_frame(chunked=True)
        return self.not_http()

    def frame_bytes(self, cap: Any, start: int, count: int, *, hostile: bool) -> bytes:
        dtype = self.rng.choice(["float32", "float32", "float16"])
        codec = self.rng.choice(["raw", "raw", "int8", "hq9", "rq"])
        if not hostile:
            header = {
                "session": cap,
                "step": start,
                "positions": {"start": start, "count": count},
                "dtype": dtype,
                "shape": [1, count, H],
                "codec": codec,
                "shard": 0,
            }
            head = json.dumps(header).encode()
            values = np.random.default_rng(self.rng.getrandbits(32)).standard_normal((1, count, H))
            body = encode_body(values.astype(np.float32), dtype, codec)
            return struct.pack(">4sHI", MAGIC, 1, len(head)) + head + body
        header = self.header(cap, start, count, dtype, codec)
        head = self.header_bytes(header)
        return self.prefix(len(head)) + head + self.body(count, dtype, codec)

    def hostile_frame(self, chunked: bool = False) -> Case:
        count = self.rng.choice([1, 1, 2, 3])
        start = self.rng.choice([0, 0, 0, 1, 5, 2**20])
        data = self.frame_bytes(self.cap(), start, count, hostile=True)
        if self.rng.random() < 0.03:
            data = data[: self.rng.randrange(0, 12)]  # shorter than the prefix
        return Case("hostile_frame", post("/v1/forward", data, chunked=chunked))

    def valid_open(self) -> Case:
        cap = secrets.token_urlsafe(32)
        count = self.rng.choice([1, 2])
        data = self.frame_bytes(cap, 0, count, hostile=False)
        return Case("valid_open", post("/v1/forward", data), opens=(cap, count))

    def continuation(self) -> Case:
        picked = self.pool.pick(self.rng)
        if picked is None:
            return self.valid_open()
        cap, held = picked
        start = held if self.rng.random() < 0.6 else self.rng.choice([0, held + 1, held - 1])
        start = max(0, start)
        data = self.frame_bytes(cap, start, 1, hostile=False)
        return Case("continuation", post("/v1/forward", data), opens=(cap, start + 1))

    def delete(self) -> Case:
        picked = self.pool.pick(self.rng) if self.rng.random() < 0.3 else None
        if picked is not None:
            return Case("delete", request("DELETE", f"/v1/sessions/{picked[0]}"), closes=picked[0])
        junk = self.rng.choice(
            [
                secrets.token_urlsafe(32),
                "x",
                "a" * 65,
                "%C3%A9" * 30,
                "%00" * 30,
                "..%2F..%2Fetc",
                "a" * 1500,
                "%ff" * 25,
            ]
        )
        return Case("delete_junk", request("DELETE", f"/v1/sessions/{junk}"))

    def get(self, path: str) -> Case:
        return Case("get", request("GET", path))

    def wrong_route(self) -> Case:
        method = self.rng.choice(["GET", "PUT", "PATCH", "OPTIONS", "HEAD", "DELETE", "POST"])
        path = self.rng.choice(
            [
                "/",
                "/v1",
                "/v1/forward",
                "/v1/forward/",
                "/v1/forward/x",
                "/v1/sessions/",
                "/v1/sessions",
                "/%2e%2e/%2e%2e/etc/passwd",
                "/" + "a" * 2000,
                "/info?x=" + "%ff" * 20,
                "/health/../info",
            ]
        )
        body = bytes(self.rng.randrange(0, 64)) if method in ("POST", "PUT", "PATCH") else b""
        return Case("wrong_route", request(method, path, body), head=method == "HEAD")

    def not_http(self) -> Case:
        data = self.rng.choice(
            [
                b"BREW /v1/forward HTTP/1.1\r\nHost: n\r\n\r\n",
                b"GET /health HTTP/1.1\r\nHost: n\r\nX-J: a\x01b\r\n\r\n",
                b"POST /v1/forward HTTP/1.1\r\nHost: n\r\nContent-Length: -5\r\n\r\n",
                b"POST /v1/forward HTTP/1.1\r\nHost: n\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"ZZ\r\nabc\r\n0\r\n\r\n",
                b"GET /\xe9\xff HTTP/1.1\r\nHost: n\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40) + b"\r\n\r\n",
            ]
        )
        return Case("not_http", data, raw_http=True)


def request(method: str, path: str, body: bytes = b"", *, headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: node\r\n{headers}"
    if body or method in ("POST", "PUT", "PATCH"):
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def post(path: str, body: bytes, *, chunked: bool = False) -> bytes:
    ctype = "Content-Type: application/x-planet-frame\r\n"
    if not chunked:
        return request("POST", path, body, headers=ctype)
    chunks = b""
    for i in range(0, len(body), 4096):
        part = body[i : i + 4096]
        chunks += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    head = f"POST {path} HTTP/1.1\r\nHost: node\r\n{ctype}Transfer-Encoding: chunked\r\n\r\n"
    return head.encode() + chunks + b"0\r\n\r\n"


# ----------------------------------------------------------------------------------- raw HTTP
@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closes: bool


class RawConnection:
    """One keep-alive HTTP/1.1 connection from a chosen local address."""

    def __init__(self, port: int, local: str) -> None:
        self.port = port
        self.local = local
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self.port, local_addr=(self.local, 0), limit=1 << 20
        )

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def exchange(self, data: bytes, *, head: bool) -> Answer:
        if self.writer is None:
            await self._open()
        assert self.reader is not None and self.writer is not None
        self.writer.write(data)
        await self.writer.drain()
        status_line = await self.reader.readuntil(b"\r\n")
        version, status = status_line.split(b" ", 2)[:2]
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if head else int(headers.get("content-length", "0"))
        body = await self.reader.readexactly(length)
        closes = version == b"HTTP/1.0" or headers.get("connection", "").lower() == "close"
        if closes:
            await self.close()
        return Answer(int(status), headers, body, closes)


# ----------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def circuit(tmp_path_factory) -> Iterator[tuple[Path, list[NodeProcess]]]:
    from node.model.prepare import prepare

    manifest = Path(prepare(parts=2, quant="none", progress=lambda _msg: None))
    run_dir = tmp_path_factory.mktemp("fuzz-nodes")
    nodes: list[NodeProcess] = []
    try:
        for shard, port in enumerate(free_ports(2, *PORTS)):
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=port,
                    run_dir=run_dir,
                    extra_args=("--max-request-mb", str(MAX_REQUEST_MB)),
                )
            )
        wait_healthy(nodes, timeout_s=240)
        yield manifest, nodes
    finally:
        for node in nodes:
            stop_pid(node.pid, grace_s=5)


async def _honest(hops: list[Hop], head: NumpyHead, ids: list[int]) -> list[int]:
    async with PipelineClient(hops) as client:
        return [t async for t in client.generate(head, ids, max_new_tokens=NEW_TOKENS)]


@dataclass
class Tally:
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    done: int = 0


def _check(case: Case, answer: Answer) -> str | None:
    """None if `answer` is acceptable for `case`, else what is wrong."""
    if answer.status >= 500 and answer.status != 503:
        return f"status {answer.status}: {answer.body[:200]!r}"
    if case.raw_http:
        return None if answer.status == 400 and answer.closes else f"status {answer.status}"
    if answer.status < 400:
        if case.kind in ("hostile_frame", "valid_open", "continuation") and (
            answer.headers.get("content-type") != "application/x-planet-frame"
            or not answer.body.startswith(MAGIC)
        ):
            return f"status {answer.status} without a frame"
        return None
    if case.head:
        return None
    try:
        code = json.loads(answer.body)["code"]
    except (ValueError, KeyError, TypeError):
        return f"status {answer.status} without a JSON code: {answer.body[:200]!r}"
    if code not in NAMED_CODES:
        return f"status {answer.status} with unnamed code {code!r}"
    return None


async def _worker(
    port: int, local: str, worker: int, cases: list[int], tally: Tally, seed: int
) -> None:
    rng = random.Random(f"{seed}/{worker}")
    pool = Pool()
    grammar = Grammar(rng, pool)
    connection = RawConnection(port, local)
    try:
        for index in cases:
            case = grammar.case()
            label = f"seed={seed} worker={worker} case={index} kind={case.kind}"
            try:
                answer = await asyncio.wait_for(
                    connection.exchange(case.request, head=case.head), ANSWER_TIMEOUT_S
                )
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as error:
                tally.failures.append(
                    f"{label}: no answer ({type(error).__name__}: {error}); "
                    f"request {case.request[:160]!r}"
                )
                await connection.close()
                continue
            problem = _check(case, answer)
            if problem:
                tally.failures.append(f"{label}: {problem}; request {case.request[:160]!r}")
            code = ""
            if answer.status >= 400 and answer.body.startswith(b"{"):
                code = json.loads(answer.body).get("code", "")
            tally.answers[f"{answer.status} {code}".strip()] += 1
            tally.done += 1
            if case.opens and answer.status == 200:
                pool.held[case.opens[0]] = case.opens[1]
            elif case.opens and answer.status in (404, 410):
                pool.held.pop(case.opens[0], None)
            if case.closes:
                pool.held.pop(case.closes, None)
    finally:
        await connection.close()


def test_node_fuzz_hostile_requests_named_4xx_and_honest_client_unaffected(circuit):
    manifest, nodes = circuit
    head = NumpyHead(manifest)
    ids = head.chat_ids([{"role": "user", "content": PROMPT}])
    hops = [Hop(url=n.url, shard=n.shard) for n in nodes]

    async def run() -> tuple[list[int], list[list[int]], list[int], Tally, float]:
        baseline = await _honest(hops, head, ids)
        tally = Tally()
        workers = [(local, k) for local in FUZZ_PEERS for k in range(CONNECTIONS_PER_PEER)]
        fuzz = asyncio.gather(
            *(
                _worker(
                    nodes[0].port,
                    local,
                    w,
                    list(range(w, CASES, len(workers))),
                    tally,
                    SEED,
                )
                for w, (local, _k) in enumerate(workers)
            )
        )
        t0 = time.perf_counter()
        fuzz_task = asyncio.ensure_future(fuzz)
        during: list[list[int]] = []
        while not fuzz_task.done():
            during.append(await _honest(hops, head, ids))
        await fuzz_task
        elapsed = time.perf_counter() - t0
        after = await _honest(hops, head, ids)
        return baseline, during, after, tally, elapsed

    baseline, during, after, tally, elapsed = asyncio.run(run())
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(tally.answers.items()))
    print(f"\nfuzz seed={SEED} cases={tally.done} in {elapsed:.1f} s; answers {summary}")
    print(f"honest generations during the fuzz: {len(during)}")
    assert not tally.failures, f"seed={SEED}: {len(tally.failures)} bad answers, first: " + (
        "\n".join(tally.failures[:5])
    )
    assert tally.done == CASES, f"seed={SEED}: {tally.done} of {CASES} cases answered"
    assert len(baseline) > 0
    assert during, f"seed={SEED}: no honest generation ran during the fuzz"
    assert all(tokens == baseline for tokens in during), f"seed={SEED}: honest tokens changed"
    assert after == baseline, f"seed={SEED}: honest tokens changed after the fuzz"
    assert all(pid_alive(n.pid) for n in nodes)
    # the fuzz reached the compute path too, not only the parser
    assert tally.answers["200"] > 0 and tally.answers["400 bad_header"] > 0
