"""Operator keys on disk: an EVM wallet (encrypted eth-account keystore) and an ed25519 node key.

Both are created on first use and never printed. The wallet is the standard Web3 Secret Storage
JSON (scrypt), so any Ethereum tool opens it. The node key (the committee-chain identity of a
compute node or verifier) is a 32-byte ed25519 seed sealed with a key derived by scrypt from the
same password (pynacl `SecretBox`), in a small JSON file that also shows the public key. A
committee validator also has a secp256k1 operator key (`config/operator_key.json` in its home).

Password sources, first match wins: an explicit file (`--password-file`), the `PLANET_PASSWORD`
environment variable, then an interactive prompt; without a terminal and without either source
the call fails with a `KeyFileError` that says how to pass one.

    wallet = load_or_create_wallet(home / "wallet.json", password)
    node_key = load_or_create_node_key(home / "node_key.json", password)

eth-account (~0.4 s to import) is imported by the wallet and operator-key functions that use it,
so a compute node that only opens its node key never loads it.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nacl.exceptions
import nacl.pwhash
import nacl.secret
import nacl.signing
import nacl.utils

from protocol.errors import ConfigError, PlanetError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

PASSWORD_ENV = "PLANET_PASSWORD"
NODE_KEY_FORMAT = "planet-node-key/v1"
OPERATOR_KEY_FILE = "operator_key.json"  # under a validator home's config/
# scrypt cost of the node key file (pynacl's "interactive" limits: ~0.1 s, 64 MiB).
_OPSLIMIT = nacl.pwhash.scrypt.OPSLIMIT_INTERACTIVE
_MEMLIMIT = nacl.pwhash.scrypt.MEMLIMIT_INTERACTIVE


class KeyFileError(PlanetError):
    """A key file is missing, unreadable, or the password does not open it."""

    code = "key"
    http_status = 400
    exit_status = 2


@dataclass(frozen=True)
class PasswordSource:
    """Where a password comes from; `read()` resolves it once."""

    file: Path | None = None
    env: str = PASSWORD_ENV
    prompt: str = "password: "
    interactive: bool | None = None  # None: only when stdin is a terminal

    def read(self, *, confirm: bool = False) -> str:
        if self.file is not None:
            try:
                text = self.file.read_text(encoding="utf-8")
            except OSError as error:
                raise KeyFileError(
                    f"cannot read the password file {self.file}: {error.strerror}",
                    hint="pass an existing file to --password-file",
                ) from None
            return _non_empty(text.rstrip("\r\n"), f"the password file {self.file}")
        value = os.environ.get(self.env)
        if value is not None:
            return _non_empty(value, f"${self.env}")
        interactive = sys.stdin.isatty() if self.interactive is None else self.interactive
        if not interactive:
            raise KeyFileError(
                "a password is needed to open or create the key files and there is no terminal",
                hint=f"set {self.env} or pass --password-file FILE",
            )
        first = getpass.getpass(self.prompt)
        if confirm and getpass.getpass("repeat " + self.prompt) != first:
            raise KeyFileError("the two passwords differ", hint="run the command again")
        return _non_empty(first, "the password")


def _non_empty(value: str, where: str) -> str:
    if not value:
        raise KeyFileError(f"{where} is empty", hint="use a non-empty password")
    return value


# --- EVM wallet ---------------------------------------------------------------------------------


def load_wallet(path: Path, password: str) -> LocalAccount:
    """Open an existing keystore; a wrong password or a damaged file is a `KeyFileError`."""
    from eth_account import Account  # lazy: eth-account (~0.4 s)

    data = _read_json(path, "wallet keystore")
    try:
        secret = Account.decrypt(data, password)
    except ValueError:
        raise KeyFileError(
            f"the password does not open the wallet {path}",
            hint=f"check {PASSWORD_ENV} / --password-file; the keystore itself is unchanged",
        ) from None
    except (KeyError, TypeError):
        raise KeyFileError(f"{path} is not an Ethereum keystore file") from None
    return Account.from_key(secret)


def create_wallet(
    path: Path, password: str, private_key: str | bytes | None = None
) -> LocalAccount:
    """Write a new keystore (a fresh key, or `private_key` imported); never overwrites a file."""
    from eth_account import Account  # lazy: eth-account (~0.4 s)

    account = Account.from_key(private_key) if private_key is not None else Account.create()
    _write_new(path, json.dumps(Account.encrypt(account.key, password)))
    return account


def create_dev_wallet(
    path: Path, password: str, private_key: str | bytes | None = None
) -> LocalAccount:
    """A keystore (a fresh key, or `private_key` imported) with a cheap KDF (PBKDF2, 1,000
    rounds) instead of scrypt's ~2 s: only for throwaway accounts on a local devnet or in tests,
    whose keys guard nothing of value (scrypt also costs ~1.8 CPU-s in every process that opens
    one). Opens with `load_wallet` like any other keystore; never overwrites a file."""
    from eth_account import Account  # lazy: eth-account (~0.4 s)

    account = Account.from_key(private_key) if private_key is not None else Account.create()
    keystore = Account.encrypt(account.key, password, kdf="pbkdf2", iterations=1000)
    _write_new(path, json.dumps(keystore))
    return account


def load_or_create_wallet(path: Path, password: str) -> LocalAccount:
    return load_wallet(path, password) if path.exists() else create_wallet(path, password)


def wallet_address(path: Path) -> str:
    """The checksummed address a keystore holds, read without the password."""
    from eth_utils import to_checksum_address  # lazy: eth-utils

    data = _read_json(path, "wallet keystore")
    raw = data.get("address") if isinstance(data, dict) else None
    if not isinstance(raw, str) or len(raw.removeprefix("0x")) != 40:
        raise KeyFileError(f"{path} does not name its address")
    return str(to_checksum_address("0x" + raw.removeprefix("0x")))


# --- a validator's operator key -----------------------------------------------------------------
#
# Each committee validator has a secp256k1 operator key next to its CometBFT keys: its address is
# the validator's member of the `Committee` contract, and it signs payout roots and verdicts. It is
# an eth-account keystore with an empty password (a devnet or test validator's key guards nothing
# the validator home does not already hold), written by `planet committee init`.


def operator_key_path(home: Path) -> Path:
    """Where a validator home keeps its operator key."""
    return home / "config" / OPERATOR_KEY_FILE


def write_operator_key(path: Path) -> str:
    """A fresh secp256k1 operator key as an eth-account keystore (empty password), mode 0600;
    returns its address."""
    from eth_account import Account  # lazy: eth-account (~0.4 s)

    account = Account.create()
    keystore = Account.encrypt(account.key, "", kdf="pbkdf2", iterations=2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(keystore, handle)
    return str(account.address)


def read_operator_key(path: Path) -> bytes:
    """The private key of an operator key file (`write_operator_key`); `ConfigError` when the
    file cannot be read or is not such a keystore."""
    from eth_account import Account  # lazy: eth-account (~0.4 s)

    try:
        return bytes(Account.decrypt(json.loads(path.read_text()), ""))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot read the operator key {path}: {error}") from None


# --- ed25519 node key ---------------------------------------------------------------------------


def create_node_key(path: Path, password: str) -> nacl.signing.SigningKey:
    key = nacl.signing.SigningKey.generate()
    salt = nacl.utils.random(nacl.pwhash.scrypt.SALTBYTES)
    box = nacl.secret.SecretBox(_derive(password, salt))
    record = {
        "format": NODE_KEY_FORMAT,
        "public_key": key.verify_key.encode().hex(),
        "salt": salt.hex(),
        "sealed_seed": box.encrypt(bytes(key)).hex(),
    }
    _write_new(path, json.dumps(record, indent=2))
    return key


def load_node_key(path: Path, password: str) -> nacl.signing.SigningKey:
    data = _read_json(path, "node key")
    try:
        if data["format"] != NODE_KEY_FORMAT:
            raise ValueError(data["format"])
        salt = bytes.fromhex(data["salt"])
        sealed = bytes.fromhex(data["sealed_seed"])
        public = bytes.fromhex(data["public_key"])
    except (KeyError, TypeError, ValueError):
        raise KeyFileError(f"{path} is not a {NODE_KEY_FORMAT} file") from None
    try:
        seed = nacl.secret.SecretBox(_derive(password, salt)).decrypt(sealed)
    except nacl.exceptions.CryptoError:
        raise KeyFileError(
            f"the password does not open the node key {path}",
            hint=f"check {PASSWORD_ENV} / --password-file",
        ) from None
    key = nacl.signing.SigningKey(seed)
    if key.verify_key.encode() != public:
        raise KeyFileError(f"{path}: the sealed seed does not match its public key")
    return key


def load_or_create_node_key(path: Path, password: str) -> nacl.signing.SigningKey:
    return load_node_key(path, password) if path.exists() else create_node_key(path, password)


def node_public_key(path: Path) -> str:
    """The node key's public half (64 hex), read without the password."""
    data = _read_json(path, "node key")
    value = data.get("public_key") if isinstance(data, dict) else None
    if not isinstance(value, str) or len(value) != 64:
        raise KeyFileError(f"{path} is not a {NODE_KEY_FORMAT} file")
    return value


def _derive(password: str, salt: bytes) -> bytes:
    return nacl.pwhash.scrypt.kdf(
        nacl.secret.SecretBox.KEY_SIZE,
        password.encode("utf-8"),
        salt,
        opslimit=_OPSLIMIT,
        memlimit=_MEMLIMIT,
    )


# --- files --------------------------------------------------------------------------------------


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KeyFileError(
            f"no {what} at {path}", hint="create it first (it is made on first use)"
        ) from None
    except OSError as error:
        raise KeyFileError(f"cannot read the {what} {path}: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise KeyFileError(f"{path} is not a valid {what} (not JSON)") from None


def _write_new(path: Path, text: str) -> None:
    """Create `path` with mode 0600; refuse to replace an existing key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path} already exists", hint="keys are never overwritten") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
