"""How a compute node knows a credit pays it before it serves more than a bounded amount on it
(issue 42, attack 4; docs/credits.md "One credit pays one node").

A credit is bearer: a client can show one credit to every node of its circuit at once. So a node
takes a credit *provisionally*: its agent locks it on the committee (`credit_lock`, batched,
node/agent/credit_locker.py) and writes the outcome next to the spooled credit; the compute
process serves positions on credits whose lock is not yet won only up to `unlocked` credits'
worth per session, and stops the session by name when a lock is lost or does not come:

    marks = LockMarks(spool dir)
    marks.mark(spent id, won=True | False, reason)   the agent: `<spent id>.won` / `.lost`
    marks.status(spent id)                           "won" | "lost" | None (not decided yet)
    marks.prune(max_age_s)                           the agent: marks of credits gone from the
                                                     spool, older than `max_age_s`

The marks are the one channel between the two processes (they share the spool directory; the
agent holds the node's key, the compute process holds none). A mark is written to a dot-file,
fsynced and renamed, so a reader sees all of it or nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Literal

from protocol.stream import PaymentRequiredError

WON, LOST = "won", "lost"
LockStatus = Literal["won", "lost"]
MARK_TTL_S = 3600.0  # how long the mark of a credit gone from the spool is kept (it was read)
UNLOCKED_CREDITS = 1  # credits per session served on while their locks are in flight
# a session is stopped `credit_lock_timeout` when a credit's lock is not committed within this
# many committee blocks of the height the node took the credit at: the agent's pass (its
# heartbeat, commitments and redemptions each wait for a block or two, then `poll_s`), the
# lock's own block, a contested item sent again a block later, with room. Counted in blocks, so
# a slow chain (blocks of 20 s and more) stops no session: a lock cannot land faster than blocks
LOCK_WAIT_BLOCKS = 60
# the backstop for a chain that makes no block at all (or that the node cannot read): a session
# waiting for a lock is stopped once no new committed height was seen for this long
LOCK_STALL_S = 120.0
LOCK_HEIGHT_POLL_S = 1.0  # how often a node with sessions waiting for locks reads the height


class CreditDoubleSpentError(PaymentRequiredError):
    """A credit paid to this session was locked or redeemed by another node first: the client
    showed it to two nodes. The session is closed (the node served at most its bound on it)."""

    code = "credit_double_spent"
    http_status = 402


class CreditLockTimeoutError(PaymentRequiredError):
    """A credit paid to this session was not locked for this node in time (its agent or the
    committee is behind): the node serves no more on it, and the session is closed."""

    code = "credit_lock_timeout"
    http_status = 402


class LockMarks:
    """The lock outcomes of the spooled credits, as files beside them in the spool directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def _path(self, identifier: str, status: str) -> Path:
        return self.dir / f"{identifier}.{status}"

    def mark(self, identifier: str, *, won: bool, reason: str = "") -> None:
        final = self._path(identifier, WON if won else LOST)
        temporary = self.dir / f".{final.name}.{os.getpid()}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, reason.encode()[:1024])
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, final)

    def status(self, identifier: str) -> LockStatus | None:
        if self._path(identifier, LOST).exists():
            return LOST
        if self._path(identifier, WON).exists():
            return WON
        return None

    def reason(self, identifier: str) -> str:
        with contextlib.suppress(OSError):
            return self._path(identifier, LOST).read_text(errors="replace")
        return ""

    def prune(self, max_age_s: float = MARK_TTL_S) -> int:
        """Remove the marks of credits no longer spooled, older than `max_age_s`."""
        removed = 0
        now = time.time()
        for pattern in ("[0-9a-f]*.won", "[0-9a-f]*.lost"):
            for path in self.dir.glob(pattern):
                if (self.dir / f"{path.stem}.json").exists():
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if now - path.stat().st_mtime > max_age_s:
                        path.unlink()
                        removed += 1
        return removed
