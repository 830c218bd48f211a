"""fp16 activations on the wire by default (issue 46): one named default on every client path,
`--wire-dtype` on `planet ask` and `planet gateway serve`, values beyond fp16's range refused by
name, and a node on fp16 frames commits to what it sent, so honest spot checks pass and a
cheating node still fails."""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from nacl.signing import SigningKey

from node.client.circuit import CircuitClient
from node.client.replicas import ReplicaCircuits
from node.client.types import Hop
from node.gateway.circuits import CircuitPool
from node.gateway.config import GatewayConfig
from node.server.app import STATE_KEY, create_app
from node.server.config import ServerConfig
from node.server.tickets import StaticPolicy, TicketBook, install, topk_rows_np
from node.verifier.tickets import judge_ticket
from protocol.errors import ConfigError, UsageError
from protocol.fingerprint import Tolerance, decode_block
from protocol.frames.codecs import DTYPES, decode_values, encode_body, wire_values
from protocol.frames.dtypes import WIRE_DTYPE, WIRE_DTYPES
from protocol.frames.errors import Fp16OverflowError, NonFiniteError
from protocol.frames.sessions import session_tag
from protocol.spotcheck import Outcome, Triple
from protocol.tickets import TicketRequest, open_sealed
from tests.doubles.fake_shard import FakeShard
from tests.unit.stream_link import Link, Refused

pytestmark = pytest.mark.unit

H = 16
HOP = Hop(url="http://127.0.0.1:1", shard=0)


# ------------------------------------------------------------------------- one named default


def test_the_default_is_float16_and_names_the_header_dtypes() -> None:
    assert WIRE_DTYPE == "float16"
    assert tuple(DTYPES) == WIRE_DTYPES  # the header's dtype index is their order


async def test_every_client_path_sends_the_default_unless_asked() -> None:
    """CircuitClient (ask, benches), ReplicaCircuits (ask's failover leases), CircuitPool (the
    hosted and the personal gateway) and the gateway's config all default to WIRE_DTYPE."""
    assert CircuitClient([HOP], hidden_size=H).dtype == "float16"
    assert CircuitClient([HOP], hidden_size=H, dtype="float32").dtype == "float32"
    expected = {0: ("sha256:" + "0" * 64, (0, 2))}
    assert ReplicaCircuits(None, [HOP], expected=expected, hidden_size=H).dtype == "float16"  # type: ignore[arg-type]
    assert CircuitPool(None, hidden_size=H).dtype == "float16"  # type: ignore[arg-type]
    assert _gateway_config().wire_dtype == "float16"
    with pytest.raises(ConfigError, match="wire dtype"):
        CircuitClient([HOP], hidden_size=H, dtype="bfloat16")


def _gateway_config(**over: object) -> GatewayConfig:
    fields: dict[str, object] = {"deployment": Path(), "manifest": Path(), "wallet": Path()}
    return GatewayConfig(evm_rpc="", committee_rpc="", **{**fields, **over})  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_gateway_dials_its_circuits_in_its_configured_dtype(dtype: str) -> None:
    from node.gateway.app import Gateway, ModelInfo

    head = SimpleNamespace(hidden_size=H)
    config = _gateway_config(wire_dtype=dtype)
    model = ModelInfo("m", "sha256:" + "0" * 64, bytes(32), 1)
    gateway = Gateway(config, model, head, None, None, None, None, 1, "")  # type: ignore[arg-type]
    assert gateway.circuits.dtype == dtype


def test_gateway_config_refuses_an_unknown_wire_dtype(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text("{}")
    with pytest.raises(UsageError, match="--wire-dtype"):
        _gateway_config(wire_dtype="bf16", manifest=manifest, deployment=manifest).validate()


# ---------------------------------------------------------------------------------- the flag


@pytest.mark.parametrize(
    "argv",
    [["ask", "hello"], ["gateway", "serve"]],
)
def test_wire_dtype_flag_defaults_parses_and_refuses_bad_values(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from planet.main import build_parser, main

    parser = build_parser()
    assert parser.parse_args(argv).wire_dtype == "float16"
    assert parser.parse_args([*argv, "--wire-dtype", "float32"]).wire_dtype == "float32"
    with pytest.raises(SystemExit) as caught:
        main([*argv, "--wire-dtype", "bf16"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--wire-dtype" in errors[0] and "'bf16'" in errors[0]


# ---------------------------------------------------------------------------------- overflow


@pytest.mark.parametrize("value", [65504.5, 7e4, -1e6, np.inf])
def test_values_beyond_fp16_range_are_refused_by_name_never_sent_as_inf(value: float) -> None:
    x = np.ones((1, 2, 4), dtype=np.float32)
    x[0, 1, 2] = value
    for convert in (encode_body, wire_values):
        with pytest.raises(Fp16OverflowError) as caught:
            convert(x, "float16", "raw")
        assert isinstance(caught.value, NonFiniteError) and caught.value.code == "non_finite"
        assert "float16" in caught.value.message and "--wire-dtype float32" in caught.value.message
    if np.isfinite(value):  # float32 frames carry it as it is
        fp32 = encode_body(x, "float32", "raw")
        assert np.array_equal(decode_values("float32", "raw", x.shape, fp32), x)


def test_the_largest_fp16_value_goes_through_exactly() -> None:
    x = np.array([[[65504.0, -65504.0, 1.0 / 3.0, 1e-8]]], dtype=np.float32)
    sent = decode_values("float16", "raw", x.shape, encode_body(x, "float16", "raw"))
    assert np.array_equal(sent, wire_values(x, "float16", "raw"))
    assert sent[0, 0, 0] == 65504.0 and sent[0, 0, 2] != x[0, 0, 2]  # rounded, not clipped
    assert wire_values(x, "float32", "raw") is x and wire_values(x, "float16", "hq9") is x


def _node_config(shard: int = 1) -> ServerConfig:
    return ServerConfig(manifest_path=Path("unused.json"), shard_id=shard)  # type: ignore[call-arg]


async def test_a_node_whose_output_overflows_fp16_refuses_by_name_and_closes_the_session(
    aiohttp_client,
) -> None:
    client = await aiohttp_client(create_app(_node_config(), FakeShard(shard_id=1, hidden_size=H)))
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, "session-0001-capability-a", 1)
    edge = np.full((1, 1, H), 65503.0, dtype=np.float32)  # + 2 on this shard: beyond fp16
    with pytest.raises(Refused) as refused:
        await link.forward(1, 0, edge, dtype="float16")
    assert refused.value.code == "non_finite" and "float16" in refused.value.body["message"]
    await link.open(2, "session-0002-capability-b", 1)  # the same values in float32 frames
    header, out = await link.forward(2, 0, edge, dtype="float32")
    assert header.dtype == "float32" and out[0, 0, 0] == 65505.0


# ------------------------------------------------------------ commitments and spot checks


NODE = SigningKey(b"\x41" * 32)
VERIFIER = SigningKey(b"\x42" * 32)
SEED = "0x" + hashlib.sha256(b"fp16 wire seed").hexdigest()
CAP = "session-fp16-wire-capability"
TAG = session_tag(CAP)
TOLERANCE = Tolerance(max_ulp=2, min_match_per_mille=900, max_mean_ulp_milli=500)
WEIGHT = np.random.default_rng(7).standard_normal((H, H)).astype(np.float32)


class TanhShard(FakeShard):
    """A node's shard: tanh(h @ W) * 50, position-independent (decode = prefill); `cheat`
    scales every 4th position's output by 1.01 (a cheaper, wrong computation)."""

    def __init__(self, cheat: bool = False) -> None:
        super().__init__(shard_id=1, hidden_size=H)
        self.cheat = cheat

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache) -> np.ndarray:  # type: ignore[no-untyped-def]
        super().forward(hidden, positions, cache)
        out = np.tanh(hidden @ WEIGHT) * np.float32(50)
        if self.cheat:
            out[:, [i for i, p in enumerate(positions) if p % 4 == 0]] *= np.float32(1.01)
        return out.astype(np.float32)


class VerifierShard:
    """The verifier's recomputation of the same shard (torch, one prefill)."""

    hidden_size = H

    def new_cache(self) -> None:
        return None

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache: None) -> torch.Tensor:
        return torch.tanh(hidden @ torch.from_numpy(WEIGHT)) * 50


async def _served_fp16(aiohttp_client, shard: TanhShard):
    """32 positions served on fp16 frames (a prefill of 8, then one position a frame); the
    frames the client sent and received, decoded, and what the forward hooks were given."""
    app = create_app(_node_config(), shard)
    book = TicketBook(shard=1)
    install(app, book, NODE, StaticPolicy({SEED}, [VERIFIER.verify_key.encode().hex()], 10**6))
    hooked: list[np.ndarray] = []
    app[STATE_KEY].forward_hooks.append(lambda _t, _p, _h, out: hooked.append(np.array(out)))
    client = await aiohttp_client(app)
    link = Link(await client.ws_connect("/v1/stream"), H)
    await link.open(1, CAP, 1)
    x = np.random.default_rng(3).standard_normal((1, 32, H)).astype(np.float32)
    sent, received = [], []
    for start, end in [(0, 8), *((p, p + 1) for p in range(8, 32))]:
        header, out = await link.forward(1, start, x[:, start:end], dtype="float16")
        assert header.dtype == "float16"
        sent.append(wire_values(x[:, start:end], "float16", "raw"))
        received.append(out)
    return client, book, np.concatenate(sent, 1), np.concatenate(received, 1), hooked


async def _spot_check(client, book: TicketBook):
    triple = Triple(NODE.verify_key.encode().hex(), "0x" + TAG, 0, 1)
    request = TicketRequest(triple, SEED, VERIFIER.verify_key.encode().hex()).signed(VERIFIER)
    answer = await client.post("/v1/tickets", data=request.encode())
    assert answer.status == 200, await answer.text()
    ticket = open_sealed(await answer.read(), request, VERIFIER)
    commitment = book.block_commitments(TAG)[0].commitment
    result = judge_ticket(
        ticket, request, shard=VerifierShard(), commitment=commitment, tolerance=TOLERANCE
    )
    return ticket, result


async def test_an_honest_node_on_fp16_frames_commits_what_it_sent_and_passes(aiohttp_client):
    """Inputs: the ticket carries the fp16 values as they came off the wire. Outputs: the
    fingerprint's fp16 values are, bit for bit, the fp16 values the node sent; its channels are
    chosen by the computed (fp32) magnitudes, as the verifier's recomputation chooses them."""
    client, book, sent, received, hooked = await _served_fp16(aiohttp_client, TanhShard())
    computed = np.concatenate(hooked, axis=1)
    assert np.array_equal(wire_values(computed, "float16", "raw"), received)
    ticket, result = await _spot_check(client, book)
    assert np.array_equal(ticket.inputs, sent)
    (block, _), *_ = [decode_block(ticket.fingerprint)]
    wire_bits = received[0].astype(np.float16).view(np.uint16)
    for position, row in enumerate(topk_rows_np(computed)):
        for channel, _ in row:
            assert block.value_at(position, channel) == wire_bits[position, channel]
    assert result.outcome is Outcome.PASSED, result.reason


async def test_a_cheating_node_on_fp16_frames_still_fails_its_spot_check(aiohttp_client):
    client, book, *_ = await _served_fp16(aiohttp_client, TanhShard(cheat=True))
    _, result = await _spot_check(client, book)
    assert result.outcome is Outcome.FAILED and result.bad_positions


# ------------------------------------------------------------------ the verifier's reference


class _RecordingShard:
    """Multiplies by 1/3 (no fp16 value stays one) and records what it was given."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []

    def new_cache(self) -> None:
        return None

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache: None) -> torch.Tensor:
        self.inputs.append(hidden)
        return hidden / 3


class _Head:
    def __init__(self) -> None:
        self.final: list[torch.Tensor] = []

    def embed(self, ids) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return torch.tensor([[[i / 7 for _ in range(H)] for i in ids]], dtype=torch.float32)

    def all_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.final.append(hidden)
        return hidden[0]


def _is_fp16(t: torch.Tensor) -> bool:
    return bool(torch.equal(t, t.to(torch.float16).to(torch.float32)))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_verifiers_reference_rounds_every_boundary_as_its_gateways_frames(dtype: str) -> None:
    """An honest circuit on float16 frames computes from fp16-rounded embeddings and shard
    outputs: the reference rounds the same boundaries (its sampled replay needs the same
    logits), and only when its wire dtype says so."""
    from node.verifier.reference import Reference

    head, shards = _Head(), [_RecordingShard(), _RecordingShard()]
    reference = Reference("m", "sha256:" + "0" * 64, (), head, shards, {}, [], frozenset(), dtype)
    reference.logits([1, 2, 3])
    seen = [*shards[0].inputs, *shards[1].inputs, *head.final]
    assert [_is_fp16(t) for t in seen] == [dtype == "float16"] * 3
    loaded = inspect.signature(Reference.load).parameters["wire_dtype"].default
    assert loaded == "float16"  # the clients' default


def test_verifier_serve_takes_the_gateways_wire_dtype() -> None:
    from planet.main import build_parser

    serve = ["verifier", "serve", "--home", "h", "--manifest", "m", "--gateway", "http://g"]
    serve += ["--deployment", "d", "--wallet", "w"]
    parser = build_parser()
    assert parser.parse_args(serve).wire_dtype == "float16"
    assert parser.parse_args([*serve, "--wire-dtype", "float32"]).wire_dtype == "float32"


def test_a_sampled_answer_is_replayed_on_the_schedule_nodes_serve_it() -> None:
    """The prompt in one prefill, then one position per forward, each boundary rounded like the
    gateway's frames: one prefill over prompt + answer differs by rounding, which flips the
    sorted draw (docs/verification.md §1c)."""
    from node.verifier.reference import Reference

    head, shards = _Head(), [_RecordingShard(), _RecordingShard()]
    reference = Reference("m", "sha256:" + "0" * 64, (), head, shards, {}, [], frozenset())
    rows = reference.served_logits([1, 2, 3], [4, 5])
    assert [tuple(t.shape[:2]) for t in shards[0].inputs] == [(1, 3), (1, 1), (1, 1)]
    assert all(_is_fp16(t) for t in [*shards[1].inputs, *head.final])  # float16 by default
    assert rows.shape == (2 + 3, H) and not rows[:2].any() and rows[2:].all()
