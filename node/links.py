"""TLS bound to the node key: the node's certificate, the server context, and the dialer's pin.

A node serves TLS 1.3 with a self-signed X.509 certificate whose key is its ed25519 node key
(the key registered on the committee chain). Nothing in the certificate is trusted but that key:
no CA, no host name, no dates (fixed, far apart: no wall clock). Built the same way every start,
so the same key gives the same certificate, byte for byte.

A dialer pins: `link_ssl(url, key)` gives aiohttp a `NodeKeyPin`, which aiohttp's connector
runs right after the TLS handshake and before any HTTP byte is sent; it refuses the connection
unless the peer's certificate key is `key` (NodeKeyMismatchError, `node_key_mismatch`). The
handshake itself proves possession: in TLS 1.3 the server signs the handshake transcript with
the certificate's key (CertificateVerify) and OpenSSL checks that signature even with chain
verification off (a server holding the certificate but not the key fails with "bad signature":
tests/unit/test_links.py). So "the peer's certificate key is K" means "the peer holds K".

The one key signs two kinds of things: Planet's own messages (canonical JSON, committee txs,
tickets) and TLS handshakes. TLS 1.3 signs "64 spaces ‖ context string ‖ 0 ‖ transcript hash",
the certificate's self-signature a DER TBSCertificate (0x30 …), and the node builds both itself;
neither can be read as one of Planet's messages, nor the other way round.

    context = server_context(signing_key)        # web.TCPSite / run_app(ssl_context=…)
    ssl = link_ssl("https://10.0.0.7:18100", key_hex, plaintext_ok=False)
    async with http.get(url + "/info", ssl=ssl) as answer: …   # or ws_connect(…, ssl=ssl)
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import ssl
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.client_exceptions import ServerFingerprintMismatch
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from protocol.links import NodeKeyMismatchError, check_link

# Fixed validity: a certificate valid "always" (X.509's own "no well-defined expiration" date
# is 9999-12-31 23:59:59, RFC 5280 4.1.2.5); nothing reads the clock.
_NOT_BEFORE = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
_SUBJECT = "planet node"


def _private_key(signing_key: Any) -> ed25519.Ed25519PrivateKey:
    """A PyNaCl SigningKey (or its 32-byte seed) as a `cryptography` ed25519 key."""
    return ed25519.Ed25519PrivateKey.from_private_bytes(bytes(signing_key)[:32])


def node_certificate(signing_key: Any) -> x509.Certificate:
    """The node's self-signed certificate: its key is the node key; the serial number comes
    from the key (so two nodes never share one); the same key gives the same bytes."""
    key = _private_key(signing_key)
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, _SUBJECT),
            x509.NameAttribute(NameOID.SERIAL_NUMBER, public.hex()),
        ]
    )
    serial = int.from_bytes(hashlib.sha256(b"planet/node-cert/v1\x00" + public).digest()[:16])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial >> 1 or 1)  # positive, at most 127 bits (RFC 5280: ≤ 20 octets)
        .not_valid_before(_NOT_BEFORE)
        .not_valid_after(_NOT_AFTER)
        .sign(key, None)  # ed25519 takes no separate hash
    )


def certificate_key(der: bytes | None) -> str | None:
    """The ed25519 public key (64 hex) of a DER certificate; None if it has none (or no
    certificate)."""
    if not der:
        return None
    try:
        public = x509.load_der_x509_certificate(der).public_key()
    except ValueError:
        return None
    if not isinstance(public, ed25519.Ed25519PublicKey):
        return None
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def server_context(signing_key: Any) -> ssl.SSLContext:
    """A TLS 1.3-only server context holding the node's certificate and key. `ssl` loads keys
    only from files: the key is written encrypted under a one-time random password to a
    private temporary directory and deleted right after loading."""
    key = _private_key(signing_key)
    password = secrets.token_bytes(32)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["http/1.1"])
    with tempfile.TemporaryDirectory(prefix="planet-tls-") as folder:
        cert_path, key_path = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert_path.write_bytes(
            node_certificate(signing_key).public_bytes(serialization.Encoding.PEM)
        )
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.BestAvailableEncryption(password),
                )
            )
        context.load_cert_chain(str(cert_path), str(key_path), password=password)
    return context


def probe_context() -> ssl.SSLContext:
    """An unauthenticated TLS client context for liveness probes of a node this process
    started itself on loopback (`/health` polling; nothing secret is sent or believed)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


class KeyPinMismatch(ServerFingerprintMismatch):
    """aiohttp's refusal carrying our pin's verdict (translated by `refusal`)."""


class NodeKeyPin(aiohttp.Fingerprint):
    """aiohttp's `ssl=` value for a link pinned to one node key. aiohttp calls `check` on the
    TLS transport before it writes the request (connector `_create_direct_connection`), and
    keys its connection pool by this object, so a pooled connection is reused only for the
    same key."""

    def __init__(self, key: str) -> None:
        super().__init__(hashlib.sha256(bytes.fromhex(key)).digest())
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeKeyPin) and other.key == self.key

    def __hash__(self) -> int:
        return hash(("node-key-pin", self.key))

    def check(self, transport: Any) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        got = None
        if ssl_object is not None and ssl_object.version() == "TLSv1.3":
            got = certificate_key(ssl_object.getpeercert(binary_form=True))
        if got != self.key:
            peer = transport.get_extra_info("peername") or ("?", 0)
            raise KeyPinMismatch(
                bytes.fromhex(self.key), bytes.fromhex(got or ""), peer[0], peer[1]
            )


def link_ssl(url: str, key: str | None, *, plaintext_ok: bool) -> NodeKeyPin | bool:
    """aiohttp's `ssl=` argument for a link to `url`: a NodeKeyPin for https (the key is
    required), True for a plaintext link the rule allows (protocol/links.py `check_link`:
    loopback, or `plaintext_ok`); MissingNodeKeyError / PlaintextLinkError otherwise."""
    pinned = check_link(url, key, plaintext_ok=plaintext_ok)
    return True if pinned is None else NodeKeyPin(pinned)


def refusal(error: BaseException, url: str) -> NodeKeyMismatchError | None:
    """The named refusal for an aiohttp connection error that a pin raised, else None."""
    if isinstance(error, KeyPinMismatch):
        got = error.got.hex() if error.got else None
        return NodeKeyMismatchError(url, error.expected.hex(), got)
    return None


__all__ = [
    "KeyPinMismatch",
    "NodeKeyPin",
    "certificate_key",
    "link_ssl",
    "node_certificate",
    "probe_context",
    "refusal",
    "server_context",
]
