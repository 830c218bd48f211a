"""`verifier_endpoint` (abci_app/verifier_endpoints.py): a validator publishes where its
verifier forwards its findings; strangers cannot, malformed URLs never reach the state."""

from __future__ import annotations

import json

import pytest

from abci_app.codes import Code
from protocol.committee.envelope import decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.verification import VerifierEndpoint
from tests.committee_chain import Chain, seeded_key
from tests.unit.test_abci_state import ask

pytestmark = pytest.mark.unit


def test_a_validators_latest_endpoint_is_published_by_its_key() -> None:
    chain = Chain()
    first, second = chain.validators[0], chain.validators[1]
    txs = [
        chain.tx(VerifierEndpoint("http://127.0.0.1:8701"), first.key),
        chain.tx(VerifierEndpoint("https://verifier.example:443"), second.key),
    ]
    assert [r.code for r in chain.block(txs)] == [Code.OK, Code.OK]
    moved = chain.tx(VerifierEndpoint("http://10.77.0.5:26690"), first.key)
    assert chain.block([moved])[0].code == Code.OK
    assert ask(chain, "/verifier_endpoints")["endpoints"] == {
        first.key.verify_key.encode().hex(): "http://10.77.0.5:26690",
        second.key.verify_key.encode().hex(): "https://verifier.example:443",
    }


def test_a_stranger_cannot_publish_a_verifier_endpoint() -> None:
    chain = Chain()
    stranger = seeded_key("not-a-validator")
    tx = chain.tx(VerifierEndpoint("http://127.0.0.1:8701"), stranger)
    assert chain.block([tx])[0].code == Code.NOT_VALIDATOR
    assert ask(chain, "/verifier_endpoints")["endpoints"] == {}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8701/",  # not canonical: the trailing slash
        "HTTP://127.0.0.1:8701",  # not canonical: the scheme's case
        "http://127.0.0.1:8701/findings",  # a path
        "ftp://127.0.0.1:8701",
        "http://user@127.0.0.1:8701",
        "http://127.1:8701",  # another spelling of an address
        "http://127.0.0.1:\uff18\uff17\uff10\uff11",  # full-width digits
        "http://v\u00e9rifier.example:8701",  # a non-ASCII host name
        "http://" + "a" * 10_000 + ".example",  # huge
        {"url": {"url": {"url": "http://127.0.0.1:8701"}}},  # nested
        17,
    ],
)
def test_a_malformed_or_non_canonical_url_is_refused_at_decoding(url: object) -> None:
    key = seeded_key("validator-0")
    raw = sign(VerifierEndpoint("http://127.0.0.1:8701"), key, 1).encode()
    forged = raw.replace(b'"http://127.0.0.1:8701"', json.dumps(url).encode())
    with pytest.raises(TxDecodeError):
        decode(forged)
    with pytest.raises(TxDecodeError):
        VerifierEndpoint.from_json({"url": url})
    with pytest.raises(TxDecodeError):
        VerifierEndpoint.from_json({"url": "http://127.0.0.1:8701", "extra": 1})
