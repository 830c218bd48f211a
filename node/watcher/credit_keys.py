"""`CreditKeyPublisher`: a validator's credit keys on the chain, epoch after epoch.

A validator blind-signs the credits of epoch e with its RSA key of e (abci_app/credits.py,
docs/credits.md): the private key lives in `<home>/credit_keys/` (`protocol.credit_keys`), where
the ABCI app reads it to answer `/credit_signatures`; the public key goes on chain in a
`credit_key` tx signed with the consensus key. A mint of epoch e needs the keys of validators
holding ≥ 2/3 of the power, so the watcher publishes them: it runs for every validator, with or
without a verifier or an operator key. It is the one process that writes keys into that
directory: two writers racing `CreditKeyStore.ensure` could each generate one, and the app
would sign with a key the chain does not know.

One `step()`:
1. `/params`, until read once: a committee without genesis `credits` (or without an escrow)
   mints nothing, so nothing is published (the chain would take a `credit_key`, uselessly);
2. `/epochs`: when the current epoch c was handled already, that is all (one query a pass);
   else for e in (c, c + 1) — the chain takes c ≤ e ≤ c + 2 — `/credit_keys?epoch=e`, and when
   this validator has no key there, the store's key of e (generated on first use, RSA keygen
   off the event loop) in a `credit_key` tx. A key of this validator on chain that the store
   does not hold is logged as an error: this validator cannot sign that epoch's credits.

A failure (no validator answers, a tx not committed in time or refused) is logged and the epoch
handled again after a backoff (0.5 s, doubling up to 60 s). A key is sent only when the chain
shows none of this validator for e, and only once this process's earlier send returned, so
DUPLICATE_CREDIT_KEY does not happen in normal operation. After a send whose answer was lost
(the tx landed late) it can; the store gives the same key again, so that counts as published.
CREDIT_KEY_EPOCH for c means c ended while the tx waited: nothing left to do for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.retry import Backoff
from node.watcher.payouts import Committee
from protocol.committee.credits import CreditKey
from protocol.credit_keys import CREDIT_KEYS_DIR, CreditKeyStore, key_id
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

CREDIT_KEY_EPOCH = 71  # abci_app/codes.py: the epoch is over (or more than 2 ahead)
DUPLICATE_CREDIT_KEY = 72  # abci_app/codes.py: this validator's key of that epoch is on chain


class CreditKeyRefused(PlanetError):
    """The chain refused this validator's `credit_key` tx."""

    code = "credit_key_refused"

    def __init__(self, epoch: int, tx_code: int, text: str) -> None:
        super().__init__(f"credit_key of epoch {epoch} refused (code {tx_code}): {text}")
        self.epoch = epoch
        self.tx_code = tx_code


def validator_address(consensus_public_key: bytes) -> str:
    """The validator address `/credit_keys` names a key by: sha256(ed25519 key)[:20], upper hex."""
    return hashlib.sha256(consensus_public_key).digest()[:20].hex().upper()


def credits_on(genesis: dict[str, Any]) -> bool:
    """Whether the committee mints credits (`/params` genesis: `credits` and an escrow)."""
    return bool(genesis.get("credits")) and bool((genesis.get("evm") or {}).get("escrow_address"))


@dataclass
class CreditKeyPublisher:
    committee: Committee  # signs with the validator's consensus key
    store: CreditKeyStore  # `<home>/credit_keys/`: the keys the ABCI app signs with
    validator: str  # this validator's address (`validator_address`)
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.5, max_s=60.0))
    clock: Callable[[], float] = time.monotonic
    enabled: bool | None = None  # genesis credits on (None: `/params` not read yet)
    handled: int = 0  # the last epoch whose keys and the next epoch's are on chain
    retry_at: float = 0.0  # after a failure: no pass before this `clock()` time

    @classmethod
    def of_validator(
        cls, committee: Committee, consensus_public_key: bytes, home: Path
    ) -> CreditKeyPublisher:
        return cls(
            committee=committee,
            store=CreditKeyStore(home / CREDIT_KEYS_DIR),
            validator=validator_address(consensus_public_key),
        )

    async def step(self) -> list[int]:
        """One pass; returns the epochs whose keys it published. Never raises on a committee
        failure: logged, and the epoch handled again after the backoff."""
        if self.clock() < self.retry_at:
            return []
        published: list[int] = []
        try:
            await self._pass(published)
        except PlanetError as error:
            self._retry_later(error.message)
        except (KeyError, TypeError, ValueError) as error:  # an odd answer
            self._retry_later(f"unexpected answer: {error!r}")
        else:
            self.backoff.reset()
            self.retry_at = 0.0
        return published

    def _retry_later(self, why: str) -> None:
        delay = self.backoff.next_delay()
        self.retry_at = self.clock() + delay
        log.warning("credit keys: %s; retry_in_s=%.1f", why, delay)

    async def _pass(self, published: list[int]) -> None:
        if self.enabled is None:
            self.enabled = credits_on((await self.committee.query("/params"))["genesis"])
            if not self.enabled:
                log.info("genesis sells no credits: no credit keys to publish")
        if not self.enabled:
            return
        current = int((await self.committee.query("/epochs"))["current"])
        if current <= self.handled:
            return
        for epoch in (current, current + 1):
            if await self._publish(epoch, current):
                published.append(epoch)
        self.handled = current

    async def _publish(self, epoch: int, current: int) -> bool:
        """Make sure this validator's key of `epoch` is on chain; True when sent now."""
        keys = (await self.committee.query("/credit_keys", epoch=epoch))["keys"]
        mine = [k for k in keys if k["validator"] == self.validator]
        if mine:
            der = bytes.fromhex(str(mine[0]["key"]))
            if await asyncio.to_thread(self.store.private_for, der) is None:
                log.error(
                    "credit key of epoch %d on chain (id %s) is not in %s: this validator "
                    "cannot sign that epoch's credits",
                    epoch,
                    key_id(der),
                    self.store.directory,
                )
            return False
        private = await asyncio.to_thread(self.store.ensure, epoch)  # RSA keygen the first time
        der = private.public.to_der()
        code, text = await self.committee.send(CreditKey(epoch, der))
        if code == DUPLICATE_CREDIT_KEY:
            log.warning("credit key of epoch %d was on chain already (a late send landed)", epoch)
            return False
        if code == CREDIT_KEY_EPOCH and epoch == current:
            log.info("credit key of epoch %d not published: the epoch ended meanwhile", epoch)
            return False
        if code != 0:
            raise CreditKeyRefused(epoch, code, text)
        log.info("published credit key epoch=%d id=%s", epoch, key_id(der))
        return True
