"""`dev_wallet`: an eth-account keystore of a given key for a test's throwaway account, sealed
with a cheap KDF (PBKDF2, 1,000 rounds; `node.keys.create_dev_wallet` for a fresh key).

`node.keys.create_wallet` seals with scrypt (n = 2^18): ~1.2 CPU-s to write a keystore and
~1.8 CPU-s for every process that opens it (`planet credits buy --wallet`, an agent, `planet ask
--pay`). The tests' wallets guard nothing, and `load_wallet` opens either kind the same way, so
what the tests check is unchanged; test_paid_nodes alone spent ~30 CPU-s in scrypt (issue 41).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROUNDS = 1000  # what node.keys.create_dev_wallet uses


def dev_wallet(path: Path, password: str, private_key: str | bytes) -> Any:
    """Write a new keystore of `private_key` at `path` (mode 0600, never over an existing
    file); its `LocalAccount`."""
    from eth_account import Account  # lazy: eth-account

    account = Account.from_key(private_key)
    keystore = Account.encrypt(account.key, password, kdf="pbkdf2", iterations=ROUNDS)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(keystore))
    return account
