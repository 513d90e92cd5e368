"""The server's byte budget for request bodies (no server needed)."""

from __future__ import annotations

import asyncio

import pytest

from chunktune.sim.serving.server import ByteBudget

pytestmark = pytest.mark.asyncio


async def test_waits_for_room_first_come_first_served() -> None:
    budget = ByteBudget(10)
    assert await budget.acquire(6) == 6 and budget.free == 4
    order: list[str] = []

    async def take(name: str, n: int) -> None:
        await budget.acquire(n)
        order.append(name)

    big = asyncio.create_task(take("big", 8))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 2))  # fits now, but waits behind "big"
    await asyncio.sleep(0)
    assert order == [] and budget.free == 4
    budget.release(6)
    await asyncio.wait_for(asyncio.gather(big, small), 5)
    assert order == ["big", "small"] and budget.free == 0


async def test_a_request_larger_than_the_budget_takes_all_of_it() -> None:
    budget = ByteBudget(10)
    assert await budget.acquire(100) == 10 and budget.free == 0
    budget.release(10)
    assert budget.free == 10


async def test_a_cancelled_wait_gives_nothing_away() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await budget.acquire(5)
    waiter = asyncio.create_task(budget.acquire(3))
    await asyncio.sleep(0)
    budget.release(10)
    assert await asyncio.wait_for(waiter, 5) == 3
    assert budget.free == 7  # the cancelled request's 5 bytes were never taken
