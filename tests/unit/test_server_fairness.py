"""FairSlot: one compute slot, round-robin across callers, FIFO within one, cancel-safe."""

from __future__ import annotations

import asyncio

import pytest

from node.server.fairness import FairSlot

pytestmark = pytest.mark.unit


async def test_fair_slot_round_robin_across_callers_fifo_within_one():
    slot = FairSlot()
    order: list[str] = []
    gate = asyncio.Event()

    async def job(caller: str, name: str) -> None:
        async with slot.held(caller):
            order.append(name)
            await gate.wait()

    first = asyncio.ensure_future(job("a", "a0"))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(job("a", f"a{i}")) for i in range(1, 4)]
    rest.append(asyncio.ensure_future(job("b", "b0")))
    rest.append(asyncio.ensure_future(job("c", "c0")))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *rest)
    assert order == ["a0", "a1", "b0", "c0", "a2", "a3"]


async def test_fair_slot_cancelled_waiter_does_not_block_the_next():
    slot = FairSlot()
    release = asyncio.Event()

    async def holder() -> None:
        async with slot.held("a"):
            await release.wait()

    held = asyncio.ensure_future(holder())
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(slot._acquire("b"))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    release.set()
    await held
    async with asyncio.timeout(1):
        async with slot.held("c"):
            assert slot.waiting == 0
