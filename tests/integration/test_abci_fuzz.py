"""Grammar fuzz of every ABCI entry point against real processes (issue #13).

Hostile values come from a small seeded grammar (not from mutating valid txs only): numbers in
every spelling JSON and Python disagree on (unicode digits, 5 000-digit integers, floats, NaN,
Infinity, -0), strings (lone surrogates, control characters, unicode digits, odd hex), nesting
up to 60 000 deep, duplicate keys, wrong types in every known field, random and non-UTF-8 bytes,
truncated protobufs and extended-commit txs with junk votes.

1. CheckTx through a real `cometbft` (`broadcast_tx_sync` RPC) and Query (`abci_query` RPC),
   CASES each: every answer carries a named result code (never INTERNAL), and afterwards both
   processes are alive and the chain keeps committing honest txs.
2. PrepareProposal, ProcessProposal, ExtendVote, VerifyVoteExtension and FinalizeBlock (plus
   CheckTx and Query) sent straight to a real app process over its ABCI socket, CASES each:
   every request gets its normal response type (no ResponseException, the connection stays
   open), junk is dropped/rejected with a named code, and the app hash is unchanged by it.

Reproduce a failure with the printed seed: `PLANET_FUZZ_SEED=<seed> pytest <this file>`;
`PLANET_FUZZ_CASES` changes the count (default 2 000 per entry point, 18 000 in all). Without
`PLANET_FUZZ_SEED` each run draws a new seed, so every run explores a new part of the grammar.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from abci_app import extensions
from abci_app.codes import Code
from abci_app.encoding import decode_uvarint
from abci_app.proto import abci_pb
from abci_app.server import frame
from harness.gateway_net import terminate
from node.procs import spawn_piped
from protocol import bls
from protocol.canonical import canonical_json
from protocol.committee.envelope import decode, sign
from protocol.committee.registry import Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.committee_chain import CHAIN_ID, seeded_evm_key, seeded_key, seeded_validators
from tests.integration.test_abci_cometbft import ROOT, Net, free_ports, open_net

pytestmark = pytest.mark.integration

# a new seed each run unless one is given (printed with every failure)
SEED = int(os.environ.get("PLANET_FUZZ_SEED") or secrets.randbelow(1_000_000))
CASES = int(os.environ.get("PLANET_FUZZ_CASES", "2000"))
NAMED = {int(code) for code in Code} - {int(Code.INTERNAL)}
RPC_WORKERS = 2
RPC_BATCH = 10  # CometBFT allows at most 10 requests in one JSON-RPC batch
RPC_BATCH_BYTES = 600_000
pb = abci_pb()
G1_HEX = bls.g1_bytes(bls.g1_generator()).hex()  # a compressed point a partial could be


# --- the grammar ---------------------------------------------------------------------------------

TX_TYPES = (
    "register_node",
    "heartbeat",
    "leave",
    "attest_stake",
    "commit",
    "reveal",
    "verdict_vote",
    "verdict_ratify",
    "work_report",
    "payout_vote",
    "seed_commit",
    "seed_reveal",
    "spot_check_report",
    "relay",
    "move_shards",
    "set_numerics",
    "verifier_numerics",
    "validator_change",
    "validator_approve",
    "mint_partials",
)
FIELDS = (
    "amount",
    "node",
    "commitments",
    "reveals",
    "session",
    "step",
    "shard",
    "commitment",
    "evm_address",
    "evm_signature",
    "role",
    "model",
    "shards",
    "endpoint",
    "capacity",
    "relay_key",
    "offence",
    "signature",
    "verdict_nonce",
    "epoch",
    "scores",
    "invalid",
    "height",
    "round",
    "votes",
    "work",
    "queries",
    "checks",
    "prepaid",
    "numerics",
    "verdict",
    "action",
    "pub_key",
    "power",
    "operator",
    "change",
    "mint",
    "partials",
)
ROUTES = (
    "/nodes",
    "/node",
    "/pool_health",
    "/commitments",
    "/evidence",
    "/reputations",
    "/epochs",
    "/verdicts",
    "/numerics",
    "/nonce",
    "/params",
    "/payouts",
    "/payouts/proof",
    "/credits",
    "/spot_reports",
    "/relays",
    "/mint_partials",
    "/validator_changes",
    "/credit_partials",
)
PARAMS = (
    "model",
    "shard",
    "status",
    "role",
    "key",
    "shards",
    "node",
    "session",
    "limit",
    "epoch",
    "id",
    "confirmed",
    "account",
    "account",
    "from",
    "mint",
)
NUMBERS = (
    "0",
    "-0",
    "1",
    "-1",
    "5",
    str((1 << 63) - 1),
    str(1 << 63),
    str(1 << 64),
    str(1 << 256),
    "1.0",
    "1.5",
    "-0.0",
    "1e3",
    "1E400",
    "-1e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    "01",
    "0x10",
    "1_000",
)
STRINGS = (
    "",
    "²",
    "١٢٣",
    "１２３",
    "𝟗",
    "٠",
    "\\ud800",
    "\\udfff\\ud800",
    "\\u0000",
    "\u202e",
    "0x",
    "0x0",
    "0X" + "ab" * 32,
    "ab" * 32,
    "AB" * 32,
    "0x" + "ab" * 32,
    "0x" + "ab" * 20,
    "0x" + "ab" * 65,
    "compute",
    "verifier",
    "true",
    "null",
    "SERVING",
    "heartbeat",
    '\\"',
    G1_HEX,
    G1_HEX[:-2] + "00",
)


class Grammar:
    """Seeded generator of hostile ABCI inputs (JSON text as str, everything else as bytes)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def number(self) -> str:
        if self.rng.random() < 0.1:
            return "9" * self.rng.choice((20, 80, 400, 5000))
        return self.rng.choice(NUMBERS)

    def string(self) -> str:
        r = self.rng.random()
        if r < 0.1:
            return '"' + "a" * self.rng.choice((257, 5000, 70_000)) + '"'
        if r < 0.2:
            return '"' + "".join(self.rng.choice("0123456789abcdefx²١") for _ in range(64)) + '"'
        return '"' + self.rng.choice(STRINGS) + '"'

    def deep(self) -> str:
        depth = self.rng.choice((20, 200, 3000, 30_000))
        if self.rng.random() < 0.5:
            return "[" * depth + "]" * depth
        return '{"a":' * depth + "1" + "}" * depth

    def value(self, depth: int = 0) -> str:
        r = self.rng.random()
        if r < 0.3:
            return self.number()
        if r < 0.6:
            return self.string()
        if r < 0.7:
            return self.rng.choice(("true", "false", "null"))
        if r < 0.75:
            return self.deep()
        if depth > 3:
            return "[]"
        if r < 0.88:
            return "[" + ",".join(self.value(depth + 1) for _ in range(self.rng.randrange(4))) + "]"
        return self.obj(FIELDS, depth + 1)

    def obj(self, keys: tuple[str, ...], depth: int = 0) -> str:
        chosen = [self.rng.choice(keys) for _ in range(self.rng.randrange(5))]
        if chosen and self.rng.random() < 0.2:
            chosen.append(chosen[0])  # duplicate key
        if self.rng.random() < 0.7:
            chosen.sort()
        return "{" + ",".join(f'"{k}":{self.value(depth)}' for k in chosen) + "}"

    def envelope(self) -> str:
        fields = {
            "body": self.obj(FIELDS) if self.rng.random() < 0.8 else self.value(),
            "nonce": self.number() if self.rng.random() < 0.7 else self.value(),
            "sig": '"' + "00" * 64 + '"' if self.rng.random() < 0.5 else self.value(),
            "signer": '"' + "ab" * 32 + '"' if self.rng.random() < 0.5 else self.value(),
            "type": f'"{self.rng.choice(TX_TYPES)}"' if self.rng.random() < 0.8 else self.value(),
        }
        names = sorted(fields)
        if self.rng.random() < 0.2:
            names.remove(self.rng.choice(names))
        if self.rng.random() < 0.1:
            names.append(self.rng.choice(names))
        return "{" + ",".join(f'"{k}":{fields[k]}' for k in names) + "}"

    def raw_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.randrange(300))

    def truncated_protobuf(self) -> bytes:
        message = pb.Request(
            finalize_block=pb.RequestFinalizeBlock(txs=[self.raw_bytes()], height=7, hash=b"x")
        ).SerializeToString()
        return message[: self.rng.randrange(1, len(message) + 1)]

    def mutated_tx(self) -> bytes:
        key = seeded_key(f"fuzz-{self.rng.randrange(8)}")
        raw = bytearray(sign(Heartbeat(), key, self.rng.randrange(1, 1000)).encode())
        r = self.rng.random()
        if r < 0.4:
            index = self.rng.randrange(len(raw))
            raw[index] ^= 1 << self.rng.randrange(8)
            if bytes(raw) == bytes(sign(Heartbeat(), key, 1).encode()):
                raw[0] = ord("[")
            return bytes(raw)
        if r < 0.6:
            return bytes(raw).replace(b'"nonce":', '"nonce":١'.encode(), 1)
        if r < 0.8:
            return bytes(raw).replace(b",", b", ", 1)
        return bytes(raw) + b" "

    def tx(self) -> bytes:
        r = self.rng.random()
        if r < 0.4:
            return self.envelope().encode("utf-8", "surrogatepass")
        if r < 0.5:
            return ('{"body":' + self.deep() + "}").encode()
        if r < 0.6:
            return self.raw_bytes()
        if r < 0.65:
            return self.truncated_protobuf()
        if r < 0.8:
            return self.mutated_tx()
        if r < 0.9:
            return extensions.VX_PREFIX + self.vx_doc().encode("utf-8", "surrogatepass")
        if r < 0.95:
            return b'{"body":{},"nonce":1,"sig":"\xff\xfe","signer":"' + b"a" * 64 + b'"}'
        return b"{" + self.value().encode("utf-8", "surrogatepass")

    def vx_doc(self) -> str:
        votes = []
        for _ in range(self.rng.randrange(5)):
            if self.rng.random() < 0.5:
                votes.append(self.obj(("address", "extension", "flag", "power", "signature")))
            else:
                votes.append(
                    '{"address":"'
                    + "AB" * 20
                    + '","extension":"'
                    + self.extension().hex()
                    + f'","flag":{self.number()},"power":{self.number()},"signature":""}}'
                )
        doc = {
            "height": self.number(),
            "round": self.number(),
            "votes": "[" + ",".join(votes) + "]",
        }
        if self.rng.random() < 0.2:
            doc["votes"] = self.value()
        return "{" + ",".join(f'"{k}":{doc[k]}' for k in sorted(doc)) + "}"

    def extension(self) -> bytes:
        r = self.rng.random()
        if r < 0.5:
            epoch = self.number() if self.rng.random() < 0.7 else self.value()
            scores = self.obj(("ab" * 32, "cd" * 32, "x")) if self.rng.random() < 0.7 else "{}"
            invalid = self.value() if self.rng.random() < 0.5 else "[]"
            text = f'{{"epoch":{epoch},"invalid":{invalid},"scores":{scores}}}'
            return text.encode("utf-8", "surrogatepass")
        if r < 0.6:
            return self.deep().encode()
        if r < 0.8:
            return self.raw_bytes() or b"\x00"
        return self.value().encode("utf-8", "surrogatepass")

    def query(self) -> tuple[str, bytes]:
        route = self.rng.choice(ROUTES) if self.rng.random() < 0.9 else self.string().strip('"')
        pairs = []
        for _ in range(self.rng.randrange(4)):
            value = self.rng.choice((self.number(), self.string().strip('"'), self.value()))
            pairs.append(f"{self.rng.choice(PARAMS)}={urllib.parse.quote(value[:300])}")
        if self.rng.random() < 0.05:
            pairs = [f"p{i}=1" for i in range(200)]
        path = route + ("?" + "&".join(pairs) if pairs else "")
        r = self.rng.random()
        if r < 0.5:
            data = b""
        elif r < 0.8:
            data = self.obj(PARAMS).encode("utf-8", "surrogatepass")
        elif r < 0.9:
            data = self.deep().encode()
        else:
            data = self.raw_bytes()
        return path, data

    def height(self) -> int:
        return self.rng.choice(
            (
                -(1 << 63),
                -1,
                0,
                1,
                4,
                5,
                6,
                10,
                (1 << 63) - 1,
                self.rng.randrange(-(1 << 63), 1 << 63),
            )
        )

    def junk_commit(self) -> Any:
        votes = [
            pb.ExtendedVoteInfo(
                validator=pb.Validator(
                    address=self.raw_bytes()[:40], power=self.rng.randrange(-5, 1 << 62)
                ),
                vote_extension=self.extension(),
                extension_signature=self.raw_bytes()[:80],
                block_id_flag=self.rng.randrange(4),
            )
            for _ in range(self.rng.randrange(6))
        ]
        return pb.ExtendedCommitInfo(round=self.rng.randrange(-5, 1 << 31), votes=votes)


def seeded(name: str) -> Grammar:
    seed = SEED * 1000 + sum(name.encode())  # one reproducible stream per entry point
    print(f"fuzz {name}: seed {seed} (PLANET_FUZZ_SEED={SEED}), {CASES} cases", file=sys.stderr)
    return Grammar(seed)


# --- 1. CheckTx and Query through a real CometBFT ------------------------------------------------


class Rpc:
    """Keep-alive JSON-RPC client for one CometBFT RPC address."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

    def post(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        self.conn.request("POST", "/", body, {"Content-Type": "application/json"})
        return json.loads(self.conn.getresponse().read())

    def get(self, target: str) -> dict[str, Any]:
        self.conn.request("GET", target)
        return json.loads(self.conn.getresponse().read())

    def batch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.conn.request("POST", "/", json.dumps(requests), {"Content-Type": "application/json"})
        return json.loads(self.conn.getresponse().read())


@pytest.fixture(scope="module")
def chain_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    with open_net(tmp_path_factory.mktemp("fuzz-net")) as network:
        network.start_app()
        network.start_node()
        network.wait_height(2)
        yield network


def assert_alive_and_committing(network: Net) -> None:
    assert network.app is not None and network.app.poll() is None, "app process died"
    assert network.node is not None and network.node.poll() is None, "cometbft died"
    network.wait_height(network.height() + 3, timeout=30)


def over_rpc(url: str, calls: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Send `calls` ((method, params) or ("GET", target)) over RPC_WORKERS keep-alive
    connections, POSTs as JSON-RPC batches of RPC_BATCH; answers in order."""
    local = threading.local()

    def chunk(part: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        if not hasattr(local, "rpc"):
            local.rpc = Rpc(url)
        answers: list[dict[str, Any] | None] = [None] * len(part)
        batch = []
        for index, (method, params) in enumerate(part):
            if method == "GET":
                answers[index] = local.rpc.get(params)
            else:
                batch.append({"jsonrpc": "2.0", "id": index, "method": method, "params": params})
        if batch:
            replies = local.rpc.batch(batch)
            if isinstance(replies, dict) and len(batch) == 1 and "id" in replies:
                replies = [replies]  # CometBFT answers a one-request batch unbatched
            elif isinstance(replies, dict) and len(batch) == 1 and "error" in replies:
                # one generated tx over CometBFT's 1 MB body limit (alone in its batch: its
                # cost is over RPC_BATCH_BYTES): CometBFT's own refusal, as an empty tx's
                replies = [{"id": batch[0]["id"], "error": replies["error"]}]
            assert isinstance(replies, list), f"batch refused: {str(replies)[:300]}"
            for reply in replies:
                answers[reply["id"]] = reply
        assert all(a is not None for a in answers), "a batched call got no answer"
        return answers  # type: ignore[return-value]

    parts: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for call in calls:  # CometBFT refuses request bodies over 1 MB (rpc.max_body_bytes)
        cost = len(json.dumps(call[1]))
        if len(parts[-1]) == RPC_BATCH or (parts[-1] and size + cost > RPC_BATCH_BYTES):
            parts.append([])
            size = 0
        parts[-1].append(call)
        size += cost
    with ThreadPoolExecutor(RPC_WORKERS) as pool:
        return [answer for answers in pool.map(chunk, parts) for answer in answers]


def test_abci_fuzz_check_tx_through_cometbft_rpc(chain_net: Net) -> None:
    grammar = seeded("check_tx")
    txs = [grammar.tx() for _ in range(CASES)]
    calls = [("broadcast_tx_sync", {"tx": base64.b64encode(raw).decode()}) for raw in txs]
    answered: dict[int, int] = {}
    refused_by_cometbft = 0
    for case, (raw, reply) in enumerate(zip(txs, over_rpc(chain_net.rpc, calls), strict=True)):
        if "error" in reply:  # CometBFT's own refusals (e.g. an empty tx); never the app's
            refused_by_cometbft += 1
            continue
        code = reply["result"]["code"]
        assert code in NAMED and code != Code.OK, (
            f"seed {SEED} case {case}: {raw[:200]!r} → {reply}"
        )
        answered[code] = answered.get(code, 0) + 1
    print(f"check_tx codes {answered}, refused by cometbft {refused_by_cometbft}", file=sys.stderr)
    assert sum(answered.values()) >= CASES * 0.95
    assert_alive_and_committing(chain_net)
    # an honest tx still goes through
    key, evm = seeded_key("fuzz-honest"), seeded_evm_key("fuzz-honest")
    node = key.verify_key.encode().hex()
    body = RegisterNode(address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "e", 1)
    assert chain_net.submit(sign(body, key, 1).encode()).get("code", 0) == 0


def test_abci_fuzz_query_through_cometbft_rpc(chain_net: Net) -> None:
    grammar = seeded("query")
    cases: list[tuple[str, bytes]] = []
    calls: list[tuple[str, Any]] = []
    for case in range(CASES):
        path, data = grammar.query()
        if case % 50 == 0:  # raw bytes in the path through the URI form (not UTF-8)
            junk = urllib.parse.quote(grammar.raw_bytes()[:40], safe="")
            path = f'/abci_query?path="/nodes%3F{junk}"'
            calls.append(("GET", path))
        else:
            calls.append(("abci_query", {"path": path, "data": data.hex()}))
        cases.append((path, data))
    answered: dict[int, int] = {}
    refused_by_cometbft = 0
    for case, ((path, data), reply) in enumerate(
        zip(cases, over_rpc(chain_net.rpc, calls), strict=True)
    ):
        if "error" in reply:
            refused_by_cometbft += 1
            continue
        code = reply["result"]["response"].get("code", 0)
        assert code in NAMED, f"seed {SEED} case {case}: {path[:200]!r} {data[:200]!r} → {reply}"
        answered[code] = answered.get(code, 0) + 1
    print(f"query codes {answered}, refused by cometbft {refused_by_cometbft}", file=sys.stderr)
    assert sum(answered.values()) >= CASES * 0.95
    assert_alive_and_committing(chain_net)
    assert chain_net.query("/params")["height"] > 0


# --- 2. every other entry point straight over the app's ABCI socket ------------------------------


class Socket:
    """Blocking, pipelining ABCI client for one connection to the app process."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = bytearray()

    def call(self, requests: list[Any]) -> list[Any]:
        self.sock.sendall(b"".join(frame(r) for r in requests))
        out = []
        while len(out) < len(requests):
            header = decode_uvarint(self.buf, 0)
            if header is not None and header[1] + header[0] <= len(self.buf):
                length, start = header
                response = pb.Response()
                response.ParseFromString(bytes(self.buf[start : start + length]))
                del self.buf[: start + length]
                out.append(response)
                continue
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the app closed the ABCI connection")
            self.buf += chunk
        return out

    def one(self, **request: Any) -> Any:
        [response] = self.call([pb.Request(**request)])
        return response


@pytest.fixture(scope="module")
def app_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Socket, bytes]]:
    """A real app process at height 5 (an epoch close: height 6 needs the extended commit);
    yields the connection and the app hash FinalizeBlock(6) answers for an empty block."""
    home = tmp_path_factory.mktemp("fuzz-app")
    [port] = free_ports(1)
    log = open(home / "app.log", "wb")  # noqa: SIM115
    process = spawn_piped(
        [
            sys.executable,
            "-m",
            "abci_app",
            "--home",
            str(home),
            "--listen",
            f"tcp://127.0.0.1:{port}",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, "app exited early"
            try:
                client = Socket(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "app did not listen"
                time.sleep(0.05)
        validators = seeded_validators((10, 10, 10, 10))
        init = pb.RequestInitChain(
            chain_id=CHAIN_ID,
            validators=[
                pb.ValidatorUpdate(pub_key={"ed25519": v.pubkey}, power=v.power) for v in validators
            ],
            app_state_bytes=json.dumps({"epoch_length": 5}).encode(),
        )
        init.consensus_params.abci.vote_extensions_enable_height = 1
        assert client.one(init_chain=init).WhichOneof("value") == "init_chain"
        for height in range(1, 6):
            done = client.one(
                finalize_block=pb.RequestFinalizeBlock(height=height, hash=bytes([height]) * 32)
            )
            assert done.WhichOneof("value") == "finalize_block"
            assert client.one(commit=pb.RequestCommit()).WhichOneof("value") == "commit"
        baseline = client.one(
            finalize_block=pb.RequestFinalizeBlock(height=6, hash=b"\x06" * 32)
        ).finalize_block.app_hash
        yield client, baseline
        assert process.poll() is None, "the app process died"
    finally:
        terminate(process)
        log.close()


def run_cases(
    client: Socket, name: str, make: Callable[[Grammar], Any], check: Callable[[Any, Any], None]
) -> None:
    grammar = seeded(name)
    batch: list[tuple[int, Any]] = []
    for case in range(CASES):
        batch.append((case, make(grammar)))
        if len(batch) == 100 or case == CASES - 1:
            responses = client.call([request for _, request in batch])
            for (index, request), response in zip(batch, responses, strict=True):
                method = request.WhichOneof("value")
                context = f"seed {SEED} {name} case {index}: {str(request)[:300]}"
                assert response.WhichOneof("value") == method, f"{context} → {response}"
                check(getattr(request, method), getattr(response, method))
            batch = []


def valid_tx(raw: bytes) -> bool:
    try:
        decode(raw).verify()
    except Exception:
        return False
    return True


def test_abci_fuzz_socket_every_entry_point(app_socket: tuple[Socket, bytes]) -> None:
    client, baseline = app_socket
    info_before = client.one(info=pb.RequestInfo()).info
    assert info_before.last_block_height == 5

    def txs(g: Grammar) -> list[bytes]:
        return [g.tx() for _ in range(g.rng.randrange(1, 4))]

    def prepare(g: Grammar) -> Any:
        return pb.Request(
            prepare_proposal=pb.RequestPrepareProposal(
                height=g.rng.choice((6, 7, g.height())),
                txs=txs(g),
                max_tx_bytes=g.rng.choice((-1, 0, 100, 1 << 20, (1 << 63) - 1)),
                local_last_commit=g.junk_commit(),
            )
        )

    def check_prepare(request: Any, response: Any) -> None:
        for index, raw in enumerate(response.txs):
            if index == 0 and raw.startswith(extensions.VX_PREFIX) and raw not in request.txs:
                continue  # the extended commit the app built from local_last_commit
            assert raw in request.txs and valid_tx(raw), raw[:200]

    run_cases(client, "prepare_proposal", prepare, check_prepare)

    def process(g: Grammar) -> Any:
        return pb.Request(
            process_proposal=pb.RequestProcessProposal(
                height=g.rng.choice((6, 7, g.height())), txs=txs(g), hash=g.raw_bytes()[:32]
            )
        )

    reject = pb.ResponseProcessProposal.REJECT
    run_cases(client, "process_proposal", process, lambda q, r: assert_eq(r.status, reject))

    def extend(g: Grammar) -> Any:
        return pb.Request(extend_vote=pb.RequestExtendVote(height=g.height(), hash=g.raw_bytes()))

    def check_extend(request: Any, response: Any) -> None:
        if response.vote_extension:
            extensions.parse_extension(response.vote_extension, request.height, 5)

    run_cases(client, "extend_vote", extend, check_extend)

    def verify(g: Grammar) -> Any:
        return pb.Request(
            verify_vote_extension=pb.RequestVerifyVoteExtension(
                height=g.rng.choice((5, 10, g.height())),
                vote_extension=g.extension(),
                validator_address=g.raw_bytes()[:20],
            )
        )

    def check_verify(request: Any, response: Any) -> None:
        if response.status == pb.ResponseVerifyVoteExtension.ACCEPT:
            doc = json.loads(request.vote_extension)  # only canonical, float-free JSON passes
            assert canonical_json(doc) == request.vote_extension
        else:
            assert response.status == pb.ResponseVerifyVoteExtension.REJECT

    run_cases(client, "verify_vote_extension", verify, check_verify)

    def finalize(g: Grammar) -> Any:
        return pb.Request(
            finalize_block=pb.RequestFinalizeBlock(height=6, hash=b"\x06" * 32, txs=txs(g))
        )

    def check_finalize(request: Any, response: Any) -> None:
        assert len(response.tx_results) == len(request.txs)
        for result in response.tx_results:
            assert result.code in NAMED and result.code != Code.OK, result
        assert response.app_hash == baseline

    run_cases(client, "finalize_block", finalize, check_finalize)

    def check(g: Grammar) -> Any:
        return pb.Request(check_tx=pb.RequestCheckTx(tx=g.tx()))

    run_cases(
        client, "check_tx_socket", check, lambda q, r: assert_eq(r.code in NAMED and r.code != 0)
    )

    def ask(g: Grammar) -> Any:
        path, data = g.query()
        return pb.Request(
            query=pb.RequestQuery(path=path.encode("utf-8", "replace").decode(), data=data)
        )

    run_cases(client, "query_socket", ask, lambda q, r: assert_eq(r.code in NAMED))

    # nothing above changed the committed state; the app still finalizes and commits
    info_after = client.one(info=pb.RequestInfo()).info
    assert (info_after.last_block_height, info_after.last_block_app_hash) == (
        5,
        info_before.last_block_app_hash,
    )
    done = client.one(finalize_block=pb.RequestFinalizeBlock(height=6, hash=b"\x06" * 32))
    assert done.finalize_block.app_hash == baseline
    client.one(commit=pb.RequestCommit())
    assert client.one(info=pb.RequestInfo()).info.last_block_height == 6


def assert_eq(actual: Any, expected: Any = True) -> None:
    assert actual == expected, actual
