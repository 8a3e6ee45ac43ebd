"""``max_concurrency``/``max_queue`` of one model (``Slot.take_turn``/``pass_turn``): turns in
order, a bounded line, and a request that leaves while it waits takes no turn with it."""

from __future__ import annotations

import asyncio

import pytest

from xpulaunch.llamacpp.router.config import ModelConfig
from xpulaunch.llamacpp.router.slot import Busy, Slot


def slot(limit: int | None, queue: int = 0) -> Slot:
    return Slot(ModelConfig("m", "m.gguf", max_concurrency=limit, max_queue=queue))


def test_turns_are_given_in_order_and_the_line_is_bounded() -> None:
    async def main() -> None:
        s = slot(1, queue=2)
        await s.take_turn()
        second = asyncio.ensure_future(s.take_turn())
        third = asyncio.ensure_future(s.take_turn())
        await asyncio.sleep(0)
        assert len(s.queue) == 2 and not second.done()
        with pytest.raises(Busy) as refused:
            await s.take_turn()
        assert refused.value.status == 429 and refused.value.retry_after_s == 1.0
        s.pass_turn()
        await second
        assert not third.done() and s.seated == 1
        s.pass_turn()
        await third
        s.pass_turn()
        assert s.seated == 0 and not s.queue

    asyncio.run(main())


def test_a_request_that_leaves_takes_no_turn_with_it() -> None:
    async def main() -> None:
        s = slot(1, queue=2)
        await s.take_turn()
        leaving = asyncio.ensure_future(s.take_turn())
        staying = asyncio.ensure_future(s.take_turn())
        await asyncio.sleep(0)
        leaving.cancel()  # while it waits: it leaves the line
        await asyncio.gather(leaving, return_exceptions=True)
        assert len(s.queue) == 1
        s.pass_turn()
        await staying
        # Given the turn, but cancelled before it ran: the turn goes on to the next one.
        late = asyncio.ensure_future(s.take_turn())
        after = asyncio.ensure_future(s.take_turn())
        await asyncio.sleep(0)
        s.pass_turn()  # late's future is done now; its task has not run yet
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
        await asyncio.wait_for(after, 5)
        assert s.seated == 1 and not s.queue

    asyncio.run(main())


def test_without_a_limit_nothing_is_counted() -> None:
    async def main() -> None:
        s = slot(None)
        for _ in range(100):
            await s.take_turn()
        s.pass_turn()
        assert s.seated == 0 and not s.queue

    asyncio.run(main())
