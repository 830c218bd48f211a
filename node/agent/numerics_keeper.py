"""`NumericsKeeper`: after an upgrade, the node agent announces this release's numerics by
itself (`set_numerics`), so its verifiers are the ones that can judge it.

A registration announces the numerics version the node computed with when it registered
(`numerics` of `register_node`); a node upgraded to a release whose `NUMERICS` differs keeps
announcing the old one — verifiers on the new version then skip its checks, and the old
version's verifiers fail its honest blocks. One `step(view, height)` (the agent calls it each
time it reads its node's view):

- nothing to do when the version the registration will announce once any pending change took
  effect (`announced_at(view, ∞)`) is this release's, or while a change is pending (one at a
  time, abci_app/numerics.py);
- nothing when the chain's genesis `numerics` (`/params`, read once) does not list this
  release's version: the chain would refuse it (105), and the agent logs once how things stand;
- nothing before the first epoch the chain accepts a change in: a record whose version took
  effect in epoch S may change again from epoch S + NUMERICS_COOLDOWN_EPOCHS − 1 (the change
  takes effect one epoch later), so the cooldown (108) is waited out, not spammed;
- else `set_numerics(NUMERICS)`, once: OK or NUMERICS_UNCHANGED (107) are done; TOO_SOON (108)
  waits for the next epoch (the record may have changed meanwhile); any other refusal is logged
  and tried again no sooner than the next epoch.

Off with `python -m node.agent --no-auto-numerics` or `PLANET_AUTO_NUMERICS=0` (the operator
then runs `planet node numerics --set`, as the agent's warning says).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.committee.registry import SetNumerics
from protocol.numerics import (
    NUMERICS,
    NUMERICS_COOLDOWN_EPOCHS,
    NumericsError,
    announced_at,
    parse_numerics,
)

log = logging.getLogger(__name__)

OK, NUMERICS_UNCHANGED, NUMERICS_TOO_SOON = 0, 107, 108  # abci_app/codes.py
FOREVER = 1 << 62  # an epoch after any pending change


class Agent(Protocol):
    async def send(self, body: Any) -> tuple[int, str]: ...


class Link(Protocol):
    async def params(self) -> dict[str, Any]: ...


def epoch_of(height: int, epoch_length: int) -> int:
    """The epoch of a block height (heights (e−1)·L+1 … e·L are epoch e; abci_app/rules.py)."""
    return max(1, (height - 1) // epoch_length + 1)


def first_send_epoch(view: dict[str, Any]) -> int:
    """The first epoch the chain accepts a change of this record in (1: any)."""
    since = view.get("numerics_epoch")
    return 1 if type(since) is not int else since + NUMERICS_COOLDOWN_EPOCHS - 1


@dataclass
class NumericsKeeper:
    agent: Agent
    link: Link
    release: int = NUMERICS
    accepted: tuple[int, ...] | None = None  # genesis `numerics` (read once)
    epoch_length: int = 0
    not_before: int = 0  # the first epoch to try again in after a refusal
    done: bool = False
    _noted_refused: bool = False

    async def step(self, view: dict[str, Any], height: int) -> bool:
        """One look at the node's view at committed `height`; True when this call's
        `set_numerics` committed."""
        if self.done:
            return False
        try:
            soon = announced_at(view, FOREVER)
        except NumericsError as error:
            log.warning("numerics of the registration unreadable: %s", error.message)
            return False
        if soon == self.release:
            return False
        if view.get("numerics_next") is not None:
            return False  # a change to another version is pending: one at a time
        if self.accepted is None and not await self._read_params():
            return False
        if self.release not in (self.accepted or ()):
            if not self._noted_refused:
                self._noted_refused = True
                log.warning(
                    "the chain accepts numerics %s, not this release's %d: the registration "
                    "keeps announcing %s",
                    list(self.accepted or ()),
                    self.release,
                    soon,
                )
            return False
        epoch = epoch_of(height + 1, self.epoch_length)  # the tx's block: the next at the earliest
        if epoch < max(first_send_epoch(view), self.not_before):
            return False
        code, text = await self.agent.send(SetNumerics(self.release))
        if code in (OK, NUMERICS_UNCHANGED):
            self.done = True
            log.info("announced numerics %d (was %s): in effect from the next epoch", self.release,
                     soon)  # fmt: skip
            return code == OK
        self.not_before = epoch + 1
        level = logging.INFO if code == NUMERICS_TOO_SOON else logging.WARNING
        log.log(level, "set_numerics %d refused code=%d %s; again from epoch %d", self.release,
                code, text, self.not_before)  # fmt: skip
        return False

    async def _read_params(self) -> bool:
        params = await self.link.params()
        genesis = params.get("genesis") if isinstance(params, dict) else None
        if not isinstance(genesis, dict):
            return False
        length, listed = genesis.get("epoch_length"), genesis.get("numerics")
        if type(length) is not int or not 0 < length < 2**31 or not isinstance(listed, list):
            log.warning("no usable epoch_length/numerics in /params: numerics not announced")
            return False
        try:
            self.accepted = tuple(parse_numerics(v, "genesis.numerics") for v in listed)
        except NumericsError as error:
            log.warning("%s: numerics not announced", error.message)
            return False
        self.epoch_length = length
        return True
