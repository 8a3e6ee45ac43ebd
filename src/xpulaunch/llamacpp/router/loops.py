"""The event loop of the router and of each of its front processes: uvloop's where installed."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (the serve extra has it): it forwards a
    streamed token in about half the CPU time of asyncio's own loop; else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_loop(
    main: Coroutine[Any, Any, None], factory: Callable[[], asyncio.AbstractEventLoop] | None
) -> None:
    """``asyncio.run`` with the loop of ``factory`` (``asyncio.Runner`` from Python 3.11)."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main)
        return
    loop = factory() if factory is not None else asyncio.new_event_loop()  # pragma: no cover
    try:  # pragma: no cover - Python 3.10
        loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:  # pragma: no cover
        loop.close()
