"""The client's book of one ring session's vouches: the digests its last hop sent, on the client's
own link to it, of the rows it produced (protocol/ring_vouch.py; docs/overlay.md, *The ring*).

    book = VouchBook(first=N - 1, last=spec.last_position, wait_s=...)
    book.take(vouch)                      a parsed vouch message of the session (VouchError)
    await book.check(position, row)       before a ring token is accepted (RingMismatchError)

Positions must increase from message to message and lie within 0 … `last` (the last hop also
vouches for the prompt's chunks: those below `first` are not kept); anything else is
`VouchError` (`bad_vouch`), the last hop's fault. A row whose digest differs from the last hop's,
or for which no digest came within `wait_s`, is `RingMismatchError`: the first hop relayed a row
the last hop did not vouch for, the last hop lied about it, or (K ≥ 3) a middle hop altered
it on its way back up — the client cannot tell which (node/client/ring.py `check_vouched`
blames every hop).
"""

from __future__ import annotations

import asyncio

from protocol.frames.errors import FrameError
from protocol.ring import RingMismatchError
from protocol.ring_vouch import RingVouch, VouchError, row_digest


class VouchBook:
    """One ring session's vouches (module docstring)."""

    def __init__(self, *, first: int, last: int, wait_s: float) -> None:
        self.first = first  # the first row a token is chosen from (the prompt's last)
        self.last = last  # the last row the loop may compute
        self.wait_s = wait_s
        self.next = 0  # every later vouch's position is at least this
        self._digests: dict[int, bytes] = {}  # position ≥ first → digest, not yet checked
        self._came = asyncio.Event()
        self.failed: FrameError | None = None  # the last hop sent a bad vouch: no more taken

    def fail(self, error: FrameError) -> None:
        """The last hop sent a vouch this session refuses: every check from now raises it."""
        self.failed = error
        self._came.set()

    def take(self, vouch: RingVouch) -> None:
        """Keep a vouch message's digests, or VouchError (nothing of it kept)."""
        if self.failed is not None:
            raise self.failed
        if vouch.positions[0] < self.next or vouch.positions[-1] > self.last:
            raise VouchError(
                f"ring vouch for positions {vouch.positions[0]}..{vouch.positions[-1]}, "
                f"outside {self.next}..{self.last}"
            )
        for position, digest in zip(vouch.positions, vouch.digests, strict=True):
            if position >= self.first:
                self._digests[position] = digest
        self.next = vouch.positions[-1] + 1
        self._came.set()

    async def check(self, position: int, row: bytes, who: str) -> None:
        """The row a ring token came with at `position` is the one the last hop vouched for,
        within `wait_s`; else RingMismatchError naming `who` (the circuit's hops)."""
        if self.failed is not None:
            raise self.failed
        try:
            async with asyncio.timeout(self.wait_s):
                while position not in self._digests:
                    if self.failed is not None:
                        raise self.failed
                    if self.next > position:  # vouched past it, never for it
                        break
                    self._came.clear()
                    await self._came.wait()
        except TimeoutError:
            raise RingMismatchError(
                f"{who}: no vouch for the row at position {position} within {self.wait_s:g} s"
            ) from None
        digest = self._digests.pop(position, None)
        if digest != row_digest(row):
            raise RingMismatchError(
                f"{who}: the row at position {position} is not the one the last hop vouched for"
            )
