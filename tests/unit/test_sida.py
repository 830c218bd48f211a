"""(n, k) S-IDA (protocol.sida) and GF(2^8) Shamir (protocol.gf256): known answers, every
k-subset recovers, fewer do not, and hostile cloves are refused by name."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import zfec
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import gf256, sida
from protocol.errors import ProtocolError

pytestmark = pytest.mark.unit


# -- GF(2^8) -----------------------------------------------------------------------------------


def test_field_products_match_fips_197() -> None:
    # FIPS-197 section 4.2: {57} • {83} = {c1}, and section 4.2.1: {57} • {13} = {fe}
    assert gf256.mul(0x57, 0x83) == 0xC1
    assert gf256.mul(0x57, 0x13) == 0xFE
    assert gf256.mul(0x57, 0x02) == 0xAE  # xtime({57}), section 4.2.1
    assert all(gf256.mul(a, gf256.inverse(a)) == 1 for a in range(1, 256))
    assert gf256.scale(bytes(range(256)), 0x13) == bytes(gf256.mul(b, 0x13) for b in range(256))


def test_shamir_known_answer(monkeypatch) -> None:
    # f(x) = 0x01 + 0x02·x: f(1) = 0x03, f(2) = 0x01 ^ {02}•{02} = 0x05,
    # f(3) = 0x01 ^ {02}•{03} = 0x07
    monkeypatch.setattr(gf256.secrets, "token_bytes", lambda size: b"\x02" * size)
    assert gf256.split(b"\x01\x01", 3, 2) == [b"\x03\x03", b"\x05\x05", b"\x07\x07"]
    assert gf256.join([(2, b"\x05\x05"), (3, b"\x07\x07")]) == b"\x01\x01"


@settings(max_examples=40, deadline=None)
@given(secret=st.binary(min_size=1, max_size=40), n=st.integers(2, 8), data=st.data())
def test_any_threshold_shares_recover(secret: bytes, n: int, data) -> None:
    k = data.draw(st.integers(1, n))
    shares = gf256.split(secret, n, k)
    chosen = data.draw(st.permutations(range(n)))[:k]
    assert gf256.join([(i + 1, shares[i]) for i in chosen]) == secret


def test_fewer_shares_fit_every_secret() -> None:
    # k - 1 shares are consistent with any secret: for a share at x = 1 of a k = 2 sharing, each
    # candidate secret s has exactly one line through (0, s) and (1, share)
    [one, _two] = gf256.split(b"\x9a", 2, 2)
    candidates = {gf256.join([(1, one), (2, bytes([v]))]) for v in range(256)}
    assert len(candidates) == 256


# -- S-IDA --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(4, 3), (5, 2), (3, 3), (16, 11)])
def test_every_k_subset_recovers(n: int, k: int) -> None:
    message = b"the prompt: " + bytes(range(256)) * 3
    cloves = sida.disperse(message, n, k)
    subsets = list(itertools.combinations(cloves, k))[:60]
    for subset in subsets:
        assert sida.recover(list(subset)) == message
    with pytest.raises(sida.CloveMalformed, match="distinct"):
        sida.recover(cloves[: k - 1])


@settings(max_examples=30, deadline=None)
@given(message=st.binary(max_size=3000), order=st.permutations(range(4)))
def test_collector_gives_the_message_once_in_any_order(message: bytes, order) -> None:
    cloves = [sida.Clove.from_bytes(c.to_bytes()) for c in sida.disperse(message, 4, 3)]
    collector = sida.Collector()
    results = [collector.add(cloves[i]) for i in order[:3]]
    assert results == [None, None, message]
    with pytest.raises(sida.CloveReplayed):  # the fourth, late clove
        collector.add(cloves[order[3]])


def test_the_ida_is_systematic_and_the_first_blocks_are_ciphertext() -> None:
    cloves = sida.disperse(b"x" * 100, 4, 3)
    blocks = [c.block for c in cloves]
    again = zfec.Encoder(3, 4).encode(tuple(blocks[:3]))
    assert [bytes(b) for b in again] == blocks
    assert b"x" * 10 not in b"".join(blocks)  # encrypted before it is dispersed


def test_cloves_reveal_only_the_bucket() -> None:
    sizes = {len(sida.disperse(b"a" * size, 4, 3)[0].to_bytes()) for size in (0, 1, 59, 60)}
    assert len(sizes) == 1
    assert len(sida.disperse(b"a" * 61, 4, 3)[0].to_bytes()) > sizes.pop()
    assert sida.padded_length(0) == 64 and sida.padded_length(61) == 256


def test_an_altered_clove_is_named_and_the_others_still_recover() -> None:
    message = b"what is the capital of France?"
    cloves = sida.disperse(message, 4, 3)
    bad = replace(cloves[1], block=bytes([cloves[1].block[0] ^ 1]) + cloves[1].block[1:])
    with pytest.raises(sida.CloveAltered, match="clove 1"):
        sida.recover([cloves[0], bad, cloves[2]])
    collector = sida.Collector()
    with pytest.raises(sida.CloveAltered):
        collector.add(bad)
    assert [collector.add(c) for c in (cloves[0], cloves[2], cloves[3])] == [None, None, message]


def test_a_clove_with_a_forged_digest_list_joins_no_one() -> None:
    message = b"hello"
    cloves = sida.disperse(message, 4, 3)
    block = bytes([cloves[1].block[0] ^ 1]) + cloves[1].block[1:]
    liar = replace(cloves[1], block=block)
    digests = list(liar.digests)
    digests[1] = sida._digest(liar.message_id, 1, liar.body)
    liar = replace(liar, digests=tuple(digests))
    collector = sida.Collector()
    assert collector.add(liar) is None  # consistent with itself only: its own group
    assert [collector.add(c) for c in (cloves[0], cloves[2], cloves[3])] == [None, None, message]


def test_spliced_cloves_never_combine() -> None:
    a, b = sida.disperse(b"message A", 4, 3), sida.disperse(b"message B", 4, 3)
    with pytest.raises(sida.CloveMalformed, match="different messages"):
        sida.recover([a[0], a[1], b[2]])
    moved = replace(b[2], message_id=a[2].message_id, digests=a[2].digests)
    with pytest.raises(sida.CloveAltered):
        sida.recover([a[0], a[1], moved])
    collector = sida.Collector()
    assert collector.add(a[0]) is None and collector.add(b[1]) is None
    assert collector.add(a[1]) is None and collector.add(b[2]) is None
    assert collector.add(a[3]) == b"message A" and collector.add(b[0]) == b"message B"


def test_a_consistent_forgery_does_not_decrypt() -> None:
    # what a sender (or k colluding relays) would have to do: change a block and every digest
    cloves = sida.disperse(b"secret", 4, 3)
    block = bytes([cloves[0].block[0] ^ 1]) + cloves[0].block[1:]
    forged = replace(cloves[0], block=block)
    digests = list(forged.digests)
    digests[0] = sida._digest(forged.message_id, 0, forged.body)
    group = [replace(c, digests=tuple(digests)) for c in (forged, cloves[1], cloves[2])]
    with pytest.raises(sida.CloveUndecryptable):
        sida.recover(group)
    collector = sida.Collector()
    collector.add(group[0])
    collector.add(group[1])
    with pytest.raises(sida.CloveUndecryptable):
        collector.add(group[2])
    with pytest.raises(sida.CloveReplayed):  # that message is over: nothing retries it
        collector.add(cloves[3])


def test_a_clove_delivered_twice_is_a_replay() -> None:
    cloves = sida.disperse(b"x", 4, 3)
    collector = sida.Collector()
    collector.add(cloves[0])
    with pytest.raises(sida.CloveReplayed, match="twice"):
        collector.add(cloves[0])


def test_the_collector_bounds_what_it_holds() -> None:
    collector = sida.Collector(max_pending=2, remember=1)
    first, second, third = (sida.disperse(bytes([i]), 4, 3) for i in range(3))
    for cloves in (first, second, third):
        collector.add(cloves[0])
    assert len(collector._pending) == 2  # the oldest (first) was dropped
    assert collector.add(first[1]) is None and collector.add(first[2]) is None
    assert collector.add(first[3]) == bytes([0])  # a dropped message starts over from its cloves


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (lambda b: b[:10], "shorter than its header"),
        (lambda b: b + b"\x00", "its header says"),
        (lambda b: b[:-1], "its header says"),
        (lambda b: b"\x02" + b[1:], "version"),
        (lambda b: b[:1] + b"\x11" + b[2:], "clove count"),
        (lambda b: b[:2] + b"\x01" + b[3:], "clove count"),
        (lambda b: b[:3] + b"\x04" + b[4:], "index"),
        (lambda b: b[:20] + (1000).to_bytes(4, "big") + b[24:], "bucket"),
    ],
)
def test_malformed_cloves_are_refused_by_name(edit, what: str) -> None:
    raw = sida.disperse(b"hi", 4, 3)[0].to_bytes()
    with pytest.raises(sida.CloveMalformed, match=what):
        sida.Clove.from_bytes(edit(raw))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_parse_or_are_refused_by_name(data: bytes) -> None:
    try:
        clove = sida.Clove.from_bytes(data)
    except sida.CloveError:
        return
    assert clove.to_bytes() == data


def test_shapes_and_sizes_are_bounded() -> None:
    for n, k in ((4, 1), (2, 3), (17, 3)):
        with pytest.raises(sida.CloveMalformed):
            sida.disperse(b"x", n, k)
    with pytest.raises(sida.CloveMalformed, match="over"):
        sida.padded_length(sida.MAX_MESSAGE_BYTES + 1)
    assert issubclass(sida.CloveError, ProtocolError)
