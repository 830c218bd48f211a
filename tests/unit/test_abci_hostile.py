"""One test per hostile input class of issue #13: each went through the ABCI app's entry points
as a raised exception (ResponseException: CometBFT stops the validator) before the strict input
boundary; each must now be a named rejection code and leave the state untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from abci_app import extensions
from abci_app.app import CommitteeApp
from abci_app.codes import Code
from abci_app.proto import abci_pb
from protocol.canonical import canonical_json
from protocol.committee.registry import AttestStake, Heartbeat
from tests.committee_chain import CHAIN_ID, Chain, seeded_key

pytestmark = pytest.mark.unit

pb = abci_pb()
NODE = "ab" * 32


def handle(app: CommitteeApp, method: str, **fields: Any) -> Any:
    """One request through the app's real dispatcher; fails the test on ResponseException."""
    request_type = getattr(pb, "Request" + "".join(p.title() for p in method.split("_")))
    response = app.handle(pb.Request(**{method: request_type(**fields)}))
    assert response.WhichOneof("value") == method, response
    return getattr(response, method)


def envelope(body: Any, kind: str, nonce: Any = 1) -> bytes:
    """Canonical tx bytes (the shape `decode` expects) with a junk signature."""
    return canonical_json(
        {"body": body, "nonce": nonce, "sig": "00" * 64, "signer": NODE, "type": kind}
    )


@pytest.fixture
def app() -> CommitteeApp:
    chain = Chain()
    chain.advance_to(3)
    return CommitteeApp(chain.machine)


# --- non-ASCII digits in number fields ----------------------------------------------------------


@pytest.mark.parametrize("amount", ["²", "١٢٣", "𝟗", "٠"])
def test_abci_hostile_non_ascii_digits_in_amount_are_malformed(
    app: CommitteeApp, amount: str
) -> None:
    raw = envelope({"amount": amount, "node": NODE}, "attest_stake")
    assert handle(app, "check_tx", tx=raw).code == Code.MALFORMED_TX
    ok, reason = app.machine.process_proposal(app.state.height + 1, [raw])
    assert not ok and "decimal" in reason


@pytest.mark.parametrize("value", ["²", "١٢", "9" * 5000])
def test_abci_hostile_non_ascii_or_huge_digits_in_query_params(
    app: CommitteeApp, value: str
) -> None:
    for path in (f"/evidence?limit={value}", f"/epochs?epoch={value}", f"/nodes?shard={value}"):
        assert handle(app, "query", path=path).code == Code.BAD_QUERY


# --- deep JSON nesting --------------------------------------------------------------------------


def test_abci_hostile_deep_nesting_in_tx_query_and_extension(app: CommitteeApp) -> None:
    deep_tx = b'{"body":' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    assert handle(app, "check_tx", tx=deep_tx).code == Code.MALFORMED_TX
    assert app.machine.process_proposal(app.state.height + 1, [deep_tx])[0] is False
    deep_data = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert handle(app, "query", path="/nodes", data=deep_data).code == Code.BAD_QUERY
    reject = pb.ResponseVerifyVoteExtension.REJECT
    deep_ext = b"[" * 100_000
    assert handle(app, "verify_vote_extension", height=5, vote_extension=deep_ext).status == reject


# --- floats in a vote extension -----------------------------------------------------------------


@pytest.mark.parametrize(
    "extension",
    [
        b'{"epoch":1.0,"invalid":[],"scores":{}}',
        b'{"epoch":1,"invalid":[],"scores":{"' + NODE.encode() + b'":5e5}}',
        b'{"epoch":NaN,"invalid":[],"scores":{}}',
        b'{"epoch":1,"epoch":1,"invalid":[],"scores":{}}',
        b'{"epoch":1,"invalid":[],"scores":{"\\ud800":1}}',
    ],
)
def test_abci_hostile_float_and_odd_values_in_vote_extension_rejected(
    app: CommitteeApp, extension: bytes
) -> None:
    reject = pb.ResponseVerifyVoteExtension.REJECT
    answer = handle(app, "verify_vote_extension", height=5, vote_extension=extension)
    assert answer.status == reject


def test_abci_hostile_byzantine_float_extension_in_extended_commit_rejects_proposal() -> None:
    """A Byzantine validator signs a float extension; the proposer's extended commit carries
    it: ProcessProposal must REJECT (it raised before), FinalizeBlock must refuse the tx."""
    chain = Chain()
    chain.advance_to(5)
    honest = extensions.decode_vx_tx(chain.extended_commit(5))
    bad = b'{"epoch":1.0,"invalid":[],"scores":{}}'
    signer = chain.validators[0]
    signature = signer.key.sign(extensions.vote_extension_sign_bytes(CHAIN_ID, 5, 0, bad))
    votes = tuple(
        extensions.ExtVote(v.address, v.power, bad, signature.signature, v.flag)
        if v.address == signer.address
        else v
        for v in honest.votes
    )
    vx = extensions.ExtendedCommit(5, 0, votes).encode()
    app = CommitteeApp(chain.machine)
    answer = handle(app, "process_proposal", height=6, txs=[vx])
    assert answer.status == pb.ResponseProcessProposal.REJECT
    done = handle(app, "finalize_block", height=6, hash=b"\x01" * 32, txs=[vx])
    assert done.tx_results[0].code == Code.BAD_VOTE_EXTENSIONS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("round", 1 << 70),  # overflowed the sfixed64 sign bytes (struct.error) before
        ("round", -1),
        ("height", "5"),
        ("votes", {}),
        ("votes", [{"address": 1}]),
        ("votes", [[]] * 3),
    ],
)
def test_abci_hostile_malformed_extended_commit_rejected(field: str, value: Any) -> None:
    chain = Chain()
    chain.advance_to(5)
    app = CommitteeApp(chain.machine)
    doc = json.loads(chain.extended_commit(5)[len(extensions.VX_PREFIX) :])
    doc[field] = value
    vx = extensions.VX_PREFIX + canonical_json(doc)
    answer = handle(app, "process_proposal", height=6, txs=[vx])
    assert answer.status == pb.ResponseProcessProposal.REJECT
    done = handle(app, "finalize_block", height=6, hash=b"\x01" * 32, txs=[vx])
    assert done.tx_results[0].code == Code.BAD_VOTE_EXTENSIONS


# --- query parameters of the wrong type ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/nodes", {"status": 5}),
        ("/nodes", {"model": ["m"]}),
        ("/nodes", {"shard": 1.5}),
        ("/nodes", {"shard": True}),
        ("/node", {"key": []}),
        ("/node", {"key": {"a": 1}}),
        ("/verdicts", {"id": [1]}),
        ("/verdicts", {"confirmed": 3}),
        ("/nonce", {"account": {}}),
        ("/commitments", {"node": 7}),
        ("/evidence", {"limit": "-1"}),
        ("/commitments", {"limit": -5}),
        ("/pool_health", {"model": 1}),
        ("/epochs", {"epoch": None, "x": 1e400}),
    ],
)
def test_abci_hostile_query_params_of_wrong_type_are_bad_query(
    app: CommitteeApp, path: str, data: dict[str, Any]
) -> None:
    raw = json.dumps(data).encode()
    assert handle(app, "query", path=path, data=raw).code == Code.BAD_QUERY


# --- a query that allocated per requested item ---------------------------------------------------


def test_abci_hostile_pool_health_shard_count_is_bounded(app: CommitteeApp) -> None:
    answer = handle(app, "query", path="/pool_health?model=m&shards=2000000")
    assert answer.code == Code.BAD_QUERY
    ok = handle(app, "query", path="/pool_health?model=m&shards=65536")
    assert ok.code == Code.OK
    assert len(json.loads(ok.value)["routable_per_shard"]) == 65536


# --- invalid UTF-8 in a query path (Go sends it; upb refuses to parse it) ------------------------


def test_abci_hostile_non_utf8_query_path_gets_bad_query_over_the_socket() -> None:
    from abci_app.encoding import decode_uvarint, encode_uvarint
    from abci_app.server import AbciServer

    server = AbciServer(CommitteeApp(Chain().machine), "tcp://127.0.0.1:0")
    good = pb.Request(query=pb.RequestQuery(path="/nodes")).SerializeToString()
    bad = good.replace(b"/nodes", b"/n\xff\xfees")
    buf = bytearray(encode_uvarint(len(bad)) + bad + encode_uvarint(len(good)) + good)
    out, _, consumed = server._process(buf, 1)
    assert consumed == len(buf)
    answers = []
    pos = 0
    while pos < len(out):
        length, start = decode_uvarint(out, pos)  # type: ignore[misc]
        response = pb.Response()
        response.ParseFromString(bytes(out[start : start + length]))
        answers.append(response)
        pos = start + length
    assert [a.query.code for a in answers] == [Code.BAD_QUERY, Code.OK]


# --- a fresh key's refused tx writes nothing ----------------------------------------------------


def test_abci_hostile_fresh_key_refused_tx_writes_no_account_entry() -> None:
    chain, reference = Chain(), Chain()
    ghosts = [seeded_key(f"ghost-{i}") for i in range(20)]
    txs = [chain.tx(Heartbeat(), k, nonce=7) for k in ghosts]
    txs += [chain.tx(AttestStake(NODE, 5), k, nonce=3) for k in ghosts]
    results = chain.block(txs)
    assert {r.code for r in results} == {Code.UNKNOWN_NODE, Code.NOT_VALIDATOR}
    reference.block()
    assert chain.state.app_hash == reference.state.app_hash
    assert chain.state.store.size_bytes() == reference.state.store.size_bytes()
    for key in ghosts:
        assert chain.state.committed("acct", key.verify_key.encode().hex()) is None


# --- the parsed-tx cache is bounded in bytes ----------------------------------------------------


def test_abci_hostile_tx_cache_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from abci_app import machine
    from protocol.committee.commitments import CommitBatch, CommitmentRecord

    monkeypatch.setattr(machine, "TX_CACHE_BYTES", 1 << 20)
    chain = Chain()
    key = seeded_key("spammer")
    records = tuple(
        CommitmentRecord("0x" + "11" * 32, step, 0, "0x" + "22" * 32) for step in range(300)
    )
    for nonce in range(1, 41):
        raw = chain.tx(CommitBatch(records), key, nonce=nonce)
        assert len(raw) > 50_000
        assert chain.machine.check_tx(raw).code == Code.OK
    assert 0 < chain.machine.tx_cache_bytes <= 1 << 20


# --- the Byzantine test app (tests/byzantine_app.py) --------------------------------------------


def test_abci_hostile_byzantine_app_proposes_and_extends_junk_the_honest_app_refuses() -> None:
    from tests.byzantine_app import ByzantineApp

    chain = Chain()
    chain.advance_to(5)
    byzantine, honest = ByzantineApp(chain.machine), CommitteeApp(chain.machine)
    txs = [chain.tx(Heartbeat(), seeded_key("n1"))]
    accept, reject = pb.ResponseProcessProposal.ACCEPT, pb.ResponseProcessProposal.REJECT
    for height in (7, 8, 9, 10):  # no extended-commit tx due
        assert handle(honest, "process_proposal", height=height, txs=txs).status == accept
        request = {"height": height, "max_tx_bytes": 1 << 20, "txs": txs}
        proposal = list(handle(byzantine, "prepare_proposal", **request).txs)
        assert proposal[:-1] == txs and proposal[-1] not in txs
        assert handle(honest, "process_proposal", height=height, txs=proposal).status == reject
    own = handle(honest, "extend_vote", height=10).vote_extension
    junk = handle(byzantine, "extend_vote", height=10).vote_extension
    verify = pb.ResponseVerifyVoteExtension
    for extension, status in ((own, verify.ACCEPT), (junk, verify.REJECT)):
        answer = handle(honest, "verify_vote_extension", height=10, vote_extension=extension)
        assert answer.status == status


def test_abci_hostile_late_junk_vote_in_local_commit_is_dropped_by_the_proposer() -> None:
    """CometBFT adds late precommits to the last commit without VerifyVoteExtension: an honest
    proposer must drop a Byzantine validator's junk extension so its proposal is accepted (the
    e2e chain stopped at the first epoch end before this)."""
    chain = Chain()
    chain.advance_to(5)
    app = CommitteeApp(chain.machine)
    bad = b'{"epoch":1.5,"invalid":[],"scores":{}}'
    votes = []
    for index, validator in enumerate(chain.validators):
        extension = bad if index == 3 else extensions.encode_extension(1, {})
        sign_bytes = extensions.vote_extension_sign_bytes(CHAIN_ID, 5, 0, extension)
        votes.append(
            pb.ExtendedVoteInfo(
                validator=pb.Validator(address=bytes.fromhex(validator.address), power=10),
                vote_extension=extension,
                extension_signature=validator.key.sign(sign_bytes).signature,
                block_id_flag=2,
            )
        )
    commit = pb.ExtendedCommitInfo(round=0, votes=votes)
    proposal = handle(
        app, "prepare_proposal", height=6, max_tx_bytes=1 << 20, local_last_commit=commit
    )
    [vx] = proposal.txs
    flags = [v.flag for v in extensions.decode_vx_tx(vx).votes]
    assert sorted(flags) == [1, 2, 2, 2]
    answer = handle(app, "process_proposal", height=6, txs=[vx])
    assert answer.status == pb.ResponseProcessProposal.ACCEPT
