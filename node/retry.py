"""Retry with exponential backoff for long-running processes that must never crash on a peer.

    backoff = Backoff(initial_s=0.5, max_s=10)
    result = await retry(lambda: link.height(), "read height", backoff, stop)
    answer = await until_stopped(asker.ask(challenge), stop)

`retry` keeps calling until the call succeeds or `stop` is set (then `Stopped`); it retries
only on the transient errors given (`UnavailableError` by default), logs each failure with the
delay before the next try, and lets anything else propagate. `until_stopped` runs one long piece
of work (a challenge, an epoch's spot checks) that must not hold a SIGTERM up: when `stop` is
set first, the work is cancelled at its next await and `Stopped` is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from protocol.errors import PlanetError, UnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Stopped(PlanetError):
    """The process was asked to stop while waiting for a peer."""

    code = "stopped"


@dataclass
class Backoff:
    """Delays initial_s, initial_s·factor, … capped at max_s; `reset()` after a success."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 10.0
    _next: float = 0.0

    def next_delay(self) -> float:
        delay = self._next or self.initial_s
        self._next = min(delay * self.factor, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = 0.0


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True when `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def until_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T:
    """`await work`, unless `stop` is set before it finishes: then it is cancelled (it unwinds
    through its own `finally` blocks; a thread it awaits finishes on its own, its result
    dropped) and awaited, and `Stopped` is raised. Work that finished first keeps its result."""
    if stop.is_set():
        work.close()
        raise Stopped("stopped before it started")
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # let it unwind first
    if task.cancelled():
        raise Stopped("stopped while it ran")
    return task.result()


async def retry(
    call: Callable[[], Awaitable[T]],
    what: str,
    backoff: Backoff,
    stop: asyncio.Event,
    *,
    transient: tuple[type[BaseException], ...] = (UnavailableError,),
) -> T:
    """`await call()` until it succeeds; transient errors are logged and retried after a delay."""
    failures = 0
    while True:
        if stop.is_set():
            raise Stopped(f"stopped while trying to {what}")
        try:
            result = await call()
        except transient as error:
            failures += 1
            delay = backoff.next_delay()
            message = getattr(error, "message", str(error))
            log.warning(
                "%s failed attempt=%d retry_in_s=%.1f error=%s", what, failures, delay, message
            )
            if await sleep_or_stop(stop, delay):
                raise Stopped(f"stopped while trying to {what}") from None
            continue
        if failures:
            log.info("%s succeeded after attempts=%d", what, failures + 1)
        backoff.reset()
        return result
