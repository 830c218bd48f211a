"""A validator's credit keys on disk: one RSA blind-signing key per epoch, generated, never derived.

    store = CreditKeyStore(home / "credit_keys")
    private = store.generate(epoch)        a fresh 2048-bit key (`RsaPrivateKey.generate`), written
                                           as PKCS#8 PEM `<epoch, 12 digits>-<key id>.pem`, 0600
    store.save(epoch, private)             the same for a key made elsewhere
    store.ensure(epoch)                    the epoch's key on disk, else a fresh one
    store.private_for(public_der)          the private key whose public key is `public_der`, or
                                           None (what the ABCI app signs a mint's messages with)

The key id is the first 16 hex digits of sha256(DER public key). The public key goes on chain in
a `credit_key` tx; the private key never leaves the directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from protocol.blindrsa import RsaPrivateKey
from protocol.errors import ConfigError

CREDIT_KEYS_DIR = "credit_keys"  # under a validator's home: its watcher writes, its ABCI app reads


def key_id(public_der: bytes) -> str:
    return hashlib.sha256(public_der).hexdigest()[:16]


class CreditKeyStore:
    """The directory of one validator's credit keys (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, RsaPrivateKey] = {}

    def generate(self, epoch: int) -> RsaPrivateKey:
        """A fresh key for `epoch`, saved."""
        private = RsaPrivateKey.generate()
        self.save(epoch, private)
        return private

    def save(self, epoch: int, private: RsaPrivateKey) -> None:
        """Write `private` as the key of `epoch` (refuses to overwrite a file)."""
        der = private.public.to_der()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.directory / f"{epoch:012d}-{key_id(der)}.pem"
        pem = private.to_cryptography().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        self._cache[key_id(der)] = private

    def ensure(self, epoch: int) -> RsaPrivateKey:
        """The key of `epoch` already in the directory (the first by file name), else a new one:
        a crash between generating and publishing does not waste a key."""
        for path in sorted(self.directory.glob(f"{epoch:012d}-*.pem")):
            return self._load(path)
        return self.generate(epoch)

    def _load(self, path: Path) -> RsaPrivateKey:
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as error:
            raise ConfigError(f"credit key {path}: {error}") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ConfigError(f"credit key {path}: not an RSA key")
        private = RsaPrivateKey.from_cryptography(key)
        self._cache[key_id(private.public.to_der())] = private
        return private

    def private_for(self, public_der: bytes) -> RsaPrivateKey | None:
        wanted = key_id(public_der)
        if wanted in self._cache:
            return self._cache[wanted]
        for path in sorted(self.directory.glob(f"*-{wanted}.pem")):
            private = self._load(path)
            if private.public.to_der() == public_der:
                return private
        return None
