"""A stand-in llama-server that stamps every streamed chunk with the moment it was written.

    stamped_upstream.py --host H --port P [...]   (the rest of llama-server's options ignored)

For ``bench_router.py --upstream stamped`` only: the router starts it as its model's
llama-server (``--binary``, ``--llama-backend cpu``). A real llama-server decides how to batch
by when requests arrive, so a burst sent straight to it and one sent through the router are
not served alike and their latencies differ for reasons of its own (on a GPU host the router's
burst came out 41 ms *faster*). This one serves every burst alike, so what a client sees
through the router, less what it sees straight, is what the router adds:

* ``POST /v1/chat/completions`` with ``"stream": true``: a first event at once, then one event
  per ``$STAMPED_TICK_MS`` tick (default 20) to every open stream at the same moment, as a
  decode step of llama-server does for every busy slot, ``max_tokens`` in all, then
  ``data: [DONE]``. Each event carries ``recv`` (CLOCK_MONOTONIC when the request reached this
  process) and ``sent`` (taken just before the event is written to its socket); one clock
  for every process of the host.
* ``GET /health``: ``{"status": "ok"}``; ``GET /metrics``: the two gauges the bench reads.
* ``--help`` exits 1 (no ``--fit``: the router passes its old offload flags, ignored here).

aiohttp on uvloop, like the router, so that the stand-in is no slower than what it measures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time

from aiohttp import web

TICK_S = float(os.environ.get("STAMPED_TICK_MS", "20")) / 1e3
OPEN = {"streams": 0}  # streams being answered


class Ticker:
    """One future per tick, resolved for every waiting stream at once."""

    def __init__(self) -> None:
        self._next: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        if self._next is None or self._next.done():
            self._next = asyncio.get_running_loop().create_future()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return self._next

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if self._next is not None and not self._next.done():
                self._next.set_result(None)


TICKER = Ticker()


def event(index: int, recv: float) -> bytes:
    delta = {"index": 0, "delta": {"content": "x"}}
    chunk = {"object": "chat.completion.chunk", "index": index, "recv": recv,
             "sent": time.monotonic(), "choices": [delta]}  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    recv = time.monotonic()
    body = await request.json()
    tokens = int(body.get("max_tokens", 16))
    if not body.get("stream"):
        message = {"index": 0, "message": {"content": "x" * tokens}}
        return web.json_response({"object": "chat.completion", "recv": recv,
                                  "sent": time.monotonic(), "choices": [message]})  # fmt: skip
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    OPEN["streams"] += 1
    try:
        await response.write(event(0, recv))
        for index in range(1, tokens):
            await TICKER.wait()
            await response.write(event(index, recv))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    finally:
        OPEN["streams"] -= 1
    return response


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    text = f"llamacpp:requests_processing {OPEN['streams']}\nllamacpp:requests_deferred 0\n"
    return web.Response(text=text)


def main(argv: list[str]) -> int:
    if "--help" in argv or "--list-devices" in argv:
        return 1
    options = dict(itertools.pairwise(argv))
    host, port = options.get("--host", "127.0.0.1"), int(options.get("--port", "8080"))
    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", chat), web.get("/health", health),
                    web.get("/metrics", metrics)])  # fmt: skip
    print(f"main: server is listening on http://{host}:{port}", file=sys.stderr, flush=True)
    import uvloop

    web.run_app(
        app, host=host, port=port, print=None, access_log=None, loop=uvloop.new_event_loop()
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
