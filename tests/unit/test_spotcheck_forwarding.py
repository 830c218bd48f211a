"""Forwarded tickets (protocol/tickets.py `forward` / `open_forwarded`): a finder hands the
node's signed ticket and its own signed request to a peer verifier; the peer checks both
signatures itself, so nothing the finder (or anyone) alters gets through, and only that peer
opens it."""

from __future__ import annotations

import struct

import pytest
from nacl.public import SealedBox
from nacl.signing import SigningKey

from protocol.tickets import (
    FORWARD_MAGIC,
    SIGNATURE_BYTES,
    TicketMagicError,
    TicketRequest,
    TicketRequestError,
    TicketSealError,
    TicketTruncatedError,
    decode_ticket,
    forward,
    open_forwarded,
    seal,
    unseal,
)
from tests.unit.test_spotcheck_tickets import NODE, OTHER, VERIFIER, _request, _ticket

pytestmark = pytest.mark.unit

PEER = SigningKey(b"\x04" * 32)


def _hex(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


def _statement() -> tuple[TicketRequest, bytes, bytes]:
    """The finder's request, the node's statement it unsealed, and the plain ticket bytes."""
    plain, _ = _ticket()
    request = _request()
    statement = unseal(seal(plain, request, NODE), request, VERIFIER)
    return request, statement, plain


def _sealed_to(peer: SigningKey, plain: bytes) -> bytes:
    return SealedBox(peer.verify_key.to_curve25519_public_key()).encrypt(plain)


def test_a_forwarded_ticket_opens_for_its_peer_with_both_signatures_checked() -> None:
    request, statement, plain = _statement()
    assert statement[SIGNATURE_BYTES:] == plain
    sealed = forward(request, statement, _hex(PEER))
    got_request, got_statement, ticket = open_forwarded(sealed, PEER)
    assert got_request == request and got_statement == statement
    expected = decode_ticket(plain)
    assert (ticket.block, ticket.salt, ticket.fingerprint) == (
        expected.block, expected.salt, expected.fingerprint,
    )  # fmt: skip
    assert ticket.inputs.tobytes() == expected.inputs.tobytes()


def test_only_the_addressed_peer_opens_it() -> None:
    request, statement, _ = _statement()
    sealed = forward(request, statement, _hex(PEER))
    with pytest.raises(TicketSealError):
        open_forwarded(sealed, OTHER)


def test_the_finder_cannot_forward_bytes_the_node_did_not_sign() -> None:
    request, statement, _ = _statement()
    altered = statement[:-1] + bytes([statement[-1] ^ 1])
    with pytest.raises(TicketSealError, match="not signed by the node"):
        forward(request, altered, _hex(PEER))
    # sealed by hand, past `forward`'s own check: the peer refuses it too
    encoded = request.encode()
    plain = FORWARD_MAGIC + struct.pack(">H", len(encoded)) + encoded + altered
    with pytest.raises(TicketSealError, match="not signed by the node"):
        open_forwarded(_sealed_to(PEER, plain), PEER)


def test_a_request_the_finder_did_not_sign_or_another_requests_statement_is_refused() -> None:
    request, statement, _ = _statement()
    forged = TicketRequest(request.triple, request.seed, request.verifier, "00" * 64)
    encoded = forged.encode()
    plain = FORWARD_MAGIC + struct.pack(">H", len(encoded)) + encoded + statement
    with pytest.raises(TicketRequestError):
        open_forwarded(_sealed_to(PEER, plain), PEER)
    # the statement is bound to the request it answered: not reusable for another block
    other = _request(verifier=OTHER)
    encoded = other.encode()
    plain = FORWARD_MAGIC + struct.pack(">H", len(encoded)) + encoded + statement
    with pytest.raises(TicketSealError, match="not signed by the node"):
        open_forwarded(_sealed_to(PEER, plain), PEER)


@pytest.mark.parametrize(
    ("plain", "error"),
    [
        (b"PTK\x01" + b"\x00" * 80, TicketMagicError),
        (FORWARD_MAGIC + b"\x00", TicketMagicError),
        (FORWARD_MAGIC + struct.pack(">H", 900) + b"{}", TicketTruncatedError),
    ],
)
def test_malformed_forwarded_bytes_are_refused_by_name(plain: bytes, error: type) -> None:
    with pytest.raises(error):
        open_forwarded(_sealed_to(PEER, plain), PEER)
    with pytest.raises(TicketSealError):
        open_forwarded(b"not sealed at all" * 8, PEER)
