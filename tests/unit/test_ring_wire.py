"""The ring's wire (protocol/ring.py, protocol/stream.py's `ring` and `back`) and the first
node's loop against hostile outputs (node/server/ring.py): every input from a peer parsed at
the boundary or refused by a named error."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import numpy as np
import pytest

from node.server.ring import RingLoop
from protocol.errors import PlanetError
from protocol.frames.codecs import encode_body
from protocol.frames.errors import FrameError
from protocol.frames.header import FrameHeader, pack_frame, parse_frame
from protocol.ring import RingSpec, parse_ring_spec
from protocol.ring_tokens import MAX_BATCH, is_ring_tokens, pack_ring_tokens, parse_ring_tokens
from protocol.stream import open_message, parse_control

pytestmark = pytest.mark.unit

H = 8
SPEC = {"prompt": 5, "max_new": 4, "stop": [2], "temperature": 0, "top_p": 1, "seed": None}
CAP = "c" * 43
FEED = "f" * 43


def test_ring_spec_round_trips_through_an_open():
    spec = RingSpec(5, 4, frozenset({2, 9}), 0.7, 0.9, 123)
    body = open_message(1, CAP, 0, None, None, ring=spec)
    parsed = parse_control(json.dumps(body), frozenset({"open"}))
    assert parsed.ring == spec and not parsed.back
    later = parse_control(
        json.dumps(open_message(1, CAP, 1, FEED, None, back=True)), frozenset({"open"})
    )
    assert later.back and later.ring is None
    plain = parse_control(json.dumps(open_message(1, CAP, 0, None, None)), frozenset({"open"}))
    assert plain.ring is None and not plain.back  # the open of before, unchanged


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"prompt": 0}, "ring.prompt"),
        ({"prompt": True}, "ring.prompt"),
        ({"max_new": 9000}, "ring.max_new"),
        ({"stop": [-1]}, "ring.stop"),
        ({"stop": list(range(65))}, "ring.stop"),
        ({"stop": "2"}, "ring.stop"),
        ({"temperature": 11}, "ring.temperature"),
        ({"temperature": "0"}, "ring.temperature"),
        ({"top_p": 0}, "ring.top_p"),
        ({"seed": -1}, "ring.seed"),
        ({"seed": 2**63}, "ring.seed"),
        ({"extra": 1}, "exactly the fields"),
    ],
)
def test_ring_spec_out_of_grammar_is_refused_bad_control(change, words):
    with pytest.raises(FrameError) as refused:
        parse_ring_spec({**SPEC, **change})
    assert refused.value.code == "bad_control" and words in refused.value.message


def test_ring_spec_missing_field_or_not_an_object_refused():
    for raw in (None, [], "ring", {k: v for k, v in SPEC.items() if k != "seed"}):
        with pytest.raises(FrameError) as refused:
            parse_ring_spec(raw)
        assert refused.value.code == "bad_control"


@pytest.mark.parametrize(
    "body",
    [
        {"op": "open", "sid": 1, "session": CAP, "shard": 1, "feed": FEED, "next": None,
         "ring": SPEC},  # a ring on a fed hop
        {"op": "open", "sid": 1, "session": CAP, "shard": 0, "feed": None, "next": None,
         "back": True},  # back on the first hop
        {"op": "open", "sid": 1, "session": CAP, "shard": 1, "feed": FEED, "next": None,
         "back": 1},
        {"op": "open", "sid": 1, "session": CAP, "shard": 1, "feed": FEED, "next": None,
         "back": "yes"},
    ],
)  # fmt: skip
def test_ring_and_back_on_the_wrong_hop_or_malformed_are_refused(body):
    with pytest.raises(FrameError) as refused:
        parse_control(json.dumps(body), frozenset({"open"}))
    assert refused.value.code == "bad_control"


def _row(value: float) -> bytes:
    return encode_body(np.full((1, 1, H), value, dtype=np.float32), "float32", "raw")


def test_ring_tokens_round_trip_and_are_told_from_frames():
    message = pack_ring_tokens(7, 40, "float32", "raw", [(3, _row(1.0)), (5, _row(2.0))])
    assert is_ring_tokens(message)
    parsed = parse_ring_tokens(message, H)
    assert (parsed.sid, parsed.start, parsed.tokens) == (7, 40, (3, 5))
    assert parsed.rows == (_row(1.0), _row(2.0))
    frame = pack_frame(FrameHeader(7, 40, 1, "float32", "raw", True), _row(1.0))
    assert not is_ring_tokens(frame)
    with pytest.raises(FrameError):  # the frame parser refuses ring tokens by name
        parse_frame(message, H, 64)


@pytest.mark.parametrize(
    ("mangle", "code"),
    [
        (lambda m: m[:10], "bad_header"),
        (lambda m: b"\x02\x09" + m[2:], "bad_header"),  # version
        (lambda m: m[:16] + b"\x01" + m[17:], "bad_header"),  # flags
        (lambda m: m[:14] + b"\x07" + m[15:], "bad_header"),  # dtype
        (lambda m: m[:-1], "bad_body"),  # a row cut short
        (lambda m: m + b"\x00", "bad_body"),  # bytes after the last token
        (lambda m: m[:10] + (0).to_bytes(4, "big") + m[14:], "too_large"),  # no token
        (lambda m: m[:10] + (MAX_BATCH + 1).to_bytes(4, "big") + m[14:], "too_large"),
        (lambda m: m[:10] + (3).to_bytes(4, "big") + m[14:], "bad_body"),  # more than sent
        (lambda m: m[:17] + (2**32 - 1).to_bytes(4, "big") + m[21:], "bad_body"),  # token id
        (lambda m: m[:21] + (H * 4 - 4).to_bytes(4, "big") + m[25:], "bad_body"),  # row size
    ],
)
def test_ring_tokens_out_of_shape_are_refused_by_name(mangle, code):
    message = pack_ring_tokens(7, 40, "float32", "raw", [(3, _row(1.0)), (5, _row(2.0))])
    with pytest.raises(FrameError) as refused:
        parse_ring_tokens(mangle(message), H)
    assert refused.value.code == code


class _Head:
    """Logits that pick token (first value of the row) % 4; embeddings of value token."""

    def logits_np(self, hidden: np.ndarray) -> np.ndarray:
        logits = np.zeros(4, dtype=np.float32)
        logits[int(hidden[0]) % 4] = 1.0
        return logits

    def embed_np(self, ids: list[int]) -> np.ndarray:
        return np.full((1, len(ids), H), float(ids[0]), dtype=np.float32)


def _loop(spec: RingSpec) -> tuple[RingLoop, list[bytes], list[bytes], list[PlanetError]]:
    submitted: list[bytes] = []
    sent: list[bytes] = []
    refused: list[PlanetError] = []

    async def submit(frame: bytes) -> None:
        submitted.append(frame)

    async def to_client(data: bytes) -> None:
        sent.append(data)

    async def refuse(error: PlanetError) -> None:
        refused.append(error)

    loop = RingLoop(
        spec,
        _Head(),
        hidden_size=H,
        max_tokens=64,
        executor=concurrent.futures.ThreadPoolExecutor(1),
        reply_sid=9,
        submit=submit,
        to_client=to_client,
        refuse=refuse,
    )
    return loop, submitted, sent, refused


def _output(start: int, value: float) -> bytes:
    return pack_frame(FrameHeader(3, start, 1, "float32", "raw", True), _row(value))


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


async def test_ring_loop_feeds_each_token_and_batches_them_to_the_client():
    loop, submitted, sent, refused = _loop(RingSpec(prompt=5, max_new=3))
    await loop.deliver(_output(2, 0.0))  # a prompt chunk's output: passed on as a frame
    await loop.deliver(_output(4, 1.0))  # the prompt's last position: token 1
    await _settle()
    await loop.deliver(_output(5, 2.0))  # after feeding token 1 at 5: token 2
    await _settle()
    await loop.deliver(_output(6, 3.0))  # token 3: the last asked for, not fed
    await _settle()
    assert refused == []
    frames = [parse_frame(f, H, 64)[0] for f in submitted]
    assert [(f.sid, f.start, f.count) for f in frames] == [(9, 5, 1), (9, 6, 1)]
    passed = [parse_frame(m, H, 64)[0] for m in sent if not is_ring_tokens(m)]
    assert [(p.sid, p.start) for p in passed] == [(9, 2), (9, 4)]
    tokens = [t for m in sent if is_ring_tokens(m) for t in parse_ring_tokens(m, H).tokens]
    assert tokens == [1, 2, 3] and loop.done
    loop.stop()


async def test_ring_loop_stops_at_a_stop_id():
    loop, submitted, sent, _ = _loop(RingSpec(prompt=5, max_new=8, stop=frozenset({2})))
    await loop.deliver(_output(4, 2.0))
    await _settle()
    assert submitted == [] and loop.done  # the stop id is sent, never fed
    assert [parse_ring_tokens(m, H).tokens for m in sent if is_ring_tokens(m)] == [(2,)]


@pytest.mark.parametrize(
    ("output", "code"),
    [
        (b"\x01" * 5, "bad_header"),  # not a frame
        (pack_frame(FrameHeader(3, 4, 1, "float32", "raw", True), b"\x00" * 3), "bad_body"),
        (_output(7, 1.0), "bad_positions"),  # not the position the loop waits for
        (
            pack_frame(
                FrameHeader(3, 4, 1, "float32", "raw", True),
                np.full((1, 1, H), np.nan, dtype=np.float32).tobytes(),
            ),
            "non_finite",
        ),
    ],
)
async def test_ring_loop_refuses_a_bad_output_by_name_and_stops(output, code):
    loop, submitted, _, refused = _loop(RingSpec(prompt=5, max_new=3))
    await loop.deliver(output)
    await _settle()
    assert [error.code for error in refused] == [code]
    assert submitted == [] and loop.done
    await loop.deliver(_output(4, 1.0))  # nothing more runs
    await _settle()
    assert submitted == []
    loop.stop()


def test_gateway_ring_with_speculate_is_a_usage_error(tmp_path) -> None:
    from node.gateway.config import GatewayConfig
    from protocol.errors import UsageError

    config = GatewayConfig(
        evm_rpc="http://x",
        deployment=tmp_path / "d.json",
        committee_rpc="http://x",
        manifest=tmp_path / "m.json",
        wallet=tmp_path / "w.json",
        speculate=4,
        ring=True,
    )
    with pytest.raises(UsageError, match="--ring and --speculate"):
        config.validate()


@pytest.mark.parametrize("extra", [["--speculate", "4"], ["--pay"], ["--voucher"]])
def test_planet_ask_ring_with_speculate_or_a_gateway_exits_2(capsys, extra) -> None:
    from planet.main import main

    assert main(["ask", "hi", "--ring", *extra]) == 2
    err = capsys.readouterr().err
    assert "error: --ring is for the nodes you ask directly" in err and "hint:" in err


@pytest.mark.parametrize(
    ("given", "relays", "speculate", "ring"),
    [
        (None, True, 0, True),  # over the overlay: the first node's loop by default
        (None, False, 0, False),  # direct links: the loop stays with the client
        (None, True, 4, False),  # --speculate is the other way past round trips
        (False, True, 0, False),  # --no-ring
        (True, False, 0, True),  # --ring on direct links
    ],
)
def test_ring_is_on_by_default_over_relays_only(given, relays, speculate, ring) -> None:
    from node.cli.overlay_args import ring_default

    assert ring_default(given, relays=relays, speculate=speculate) is ring


def test_planet_ask_takes_no_ring() -> None:
    import argparse

    from node.cli import ask

    parser = argparse.ArgumentParser()
    ask.register(parser.add_subparsers())
    assert parser.parse_args(["ask", "hi", "--no-ring"]).ring is False
    assert parser.parse_args(["ask", "hi"]).ring is None


async def test_ring_loop_batches_the_tokens_ready_while_a_send_is_on_its_way():
    """The client's link is slow (its first ring tokens message takes a while to leave): the
    tokens chosen meanwhile leave together, in one message (one per path over the overlay)."""
    loop, submitted, sent, refused = _loop(RingSpec(prompt=5, max_new=4))
    gate = asyncio.Event()
    inner = loop.to_client

    async def slow(data: bytes) -> None:
        if is_ring_tokens(data) and not gate.is_set():
            await gate.wait()
        await inner(data)

    loop.to_client = slow
    await loop.deliver(_output(4, 1.0))
    await _settle()
    for position, value in ((5, 2.0), (6, 3.0), (7, 0.0)):
        await loop.deliver(_output(position, value))
        await _settle()
    gate.set()
    await _settle()
    batches = [parse_ring_tokens(m, H) for m in sent if is_ring_tokens(m)]
    assert [(b.start, b.tokens) for b in batches] == [(4, (1,)), (5, (2, 3, 0))]
    assert refused == [] and len(submitted) == 3 and loop.done


def test_ring_prompt_bound_is_the_frame_position_bound() -> None:
    """protocol/ring.py keeps its own copy of the bound (the frame header's module imports
    numpy, which light entry points that parse an open must not)."""
    from protocol.frames.header import MAX_POSITION
    from protocol.ring import MAX_PROMPT

    assert MAX_PROMPT == MAX_POSITION
