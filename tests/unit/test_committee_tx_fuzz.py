"""Hostile bytes at the committee chain's door: mutated txs never raise out of decode or CheckTx.

CheckTx and FinalizeBlock run on bytes anyone can broadcast. An exception escaping the app
becomes a ResponseException, which stops that validator's CometBFT node: one crafted tx would
take validators down. Every mutation of a valid tx of every type must therefore end in a typed
`ProtocolError` (decode) or a named non-OK result code (CheckTx, FinalizeBlock), with a log that
protobuf can serialise (valid UTF-8).

The mutations are drawn from a seeded generator, so a failure reproduces exactly.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable

import pytest

from abci_app.app import CommitteeApp
from abci_app.codes import Code
from abci_app.proto import abci_pb
from abci_app.testing import Chain, seeded_evm_key, seeded_key
from protocol.committee import (
    AttestStake,
    CommitBatch,
    CommitmentRecord,
    Heartbeat,
    Leave,
    RegisterNode,
    RevealBatch,
    RevealRecord,
    ShareBlockTx,
    VerdictVote,
    decode,
    sign,
    sign_registration,
)
from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from shares.block import GENESIS_PREV_HASH, ShareBlock

pytestmark = pytest.mark.unit

KEY = seeded_key("fuzz-node")
NODE = KEY.verify_key.encode().hex()
EVM = seeded_evm_key("fuzz-node")
H32 = "0x" + "5a" * 32
MUTATIONS_PER_TX = 300

BODIES = [
    RegisterNode(
        evm_address=address_of(EVM),
        evm_signature=sign_registration(EVM, NODE),
        role="compute",
        model="smollm2-135m",
        shards=(0, 2),
        endpoint="http://127.0.0.1:8100",
        capacity=4,
    ),
    Heartbeat(),
    Leave(),
    AttestStake(node=NODE, amount=10**18),
    CommitBatch((CommitmentRecord(H32, 1, 0, H32), CommitmentRecord(H32, 2, 1, H32))),
    RevealBatch((RevealRecord(H32, 1, 0, H32, H32),)),
    ShareBlockTx(ShareBlock(GENESIS_PREV_HASH, 1, 3, ((NODE, 12),))),
    VerdictVote(address_of(EVM), 3, H32, address_of(EVM), 7, "0x" + "ab" * 65),
]

# Values a hostile sender would try in place of any JSON value.
NASTY_VALUES: list[object] = [
    None,
    True,
    -1,
    0,
    2**63,
    2**64,
    2**256,
    10**400,
    1.5,
    "",
    "\ud800",
    "\u2028",
    "\x00",
    "0x" + "zz" * 32,
    "9" * 100,
    [],
    [1] * 3,
    {},
    {"a": 1},
]


def _flip_byte(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _drop_slice(raw: bytes, rng: random.Random) -> bytes:
    start = rng.randrange(len(raw))
    return raw[:start] + raw[start + rng.randrange(1, 16) :]


def _insert_bytes(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw) + 1)
    junk = rng.choice([b"\\ud800", b"\\u0000", b'"', b"\\", b"\xff", b"\xc3", b",", b"{}", b" "])
    return raw[:at] + junk + raw[at:]


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


def _replace_value(raw: bytes, rng: random.Random) -> bytes:
    """Swap one JSON value (anywhere in the tree) for a nasty one, canonically re-encoded."""
    doc = json.loads(raw)
    path = rng.choice(_paths(doc)[1:])
    target = doc
    for step in path[:-1]:
        target = target[step]  # type: ignore[index]
    target[path[-1]] = rng.choice(NASTY_VALUES)  # type: ignore[index]
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


MUTATORS: list[Callable[[bytes, random.Random], bytes]] = [
    _flip_byte,
    _drop_slice,
    _insert_bytes,
    _replace_value,
]


def _mutants(raw: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.choice(MUTATORS)(raw, rng) for _ in range(MUTATIONS_PER_TX)]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.TYPE)
def test_committee_tx_fuzz_decode_raises_only_protocol_errors(body: object) -> None:
    raw = sign(body, KEY, 3).encode()
    refused = 0
    for index, mutant in enumerate(_mutants(raw, seed=zlib.crc32(body.TYPE.encode()))):  # type: ignore[attr-defined]
        try:
            decode(mutant).verify()
        except ProtocolError as error:
            error.message.encode("utf-8")  # the log must be serialisable
            refused += 1
        except Exception as error:  # the point of the test
            pytest.fail(f"mutant {index} {mutant[:200]!r} raised {type(error).__name__}: {error}")
    # a mutation may be harmless (e.g. replacing a value by an equal one), but not many are
    assert refused >= MUTATIONS_PER_TX * 0.9


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.TYPE)
def test_committee_tx_fuzz_check_tx_and_finalize_answer_with_codes(body: object) -> None:
    chain = Chain()
    app = CommitteeApp(chain.state)
    pb = abci_pb()
    raw = sign(body, KEY, 3).encode()
    mutants = _mutants(raw, seed=7 + len(body.TYPE))  # type: ignore[attr-defined]
    for mutant in mutants:
        response = app.handle(pb.Request(check_tx=pb.RequestCheckTx(tx=mutant)))
        response.SerializeToString()  # valid UTF-8 log, well-formed message
        assert response.check_tx.code != Code.OK or decode(mutant).encode() == mutant
    # a byzantine proposer could put them straight into a block: ProcessProposal answers (it
    # does not raise), and FinalizeBlock gives each a named code
    state = chain.state
    height = state.height + 1
    ok, reason = state.process_proposal(height, mutants[:50])
    assert isinstance(ok, bool) and isinstance(reason, str)
    state.begin_block(height, bytes(32))
    codes = [state.deliver_tx(mutant, i).code for i, mutant in enumerate(mutants[:50])]
    state.end_block()
    assert all(code in set(Code) for code in codes)
