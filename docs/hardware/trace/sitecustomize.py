"""A tracer for bench_router.py's bursts, for an experiment only (never installed): with this
folder on PYTHONPATH and XPULAUNCH_TRACE_DIR set, the router and each front write a JSON line
per forwarded model request to XPULAUNCH_TRACE_DIR/PID.jsonl: the client's port and, on the
one clock of the host (CLOCK_MONOTONIC), when the connection was made (accepted and set up by
this process's event loop), when the handler began (request parsed) and when the request was
about to be sent upstream (its replica acquired). analyse.py joins them with the bench's
--trace lines."""

import os

if os.environ.get("XPULAUNCH_TRACE_DIR"):
    import json
    import time

    from aiohttp import web_protocol

    from xpulaunch.llamacpp.router import proxy

    _OUT = open(f"{os.environ['XPULAUNCH_TRACE_DIR']}/{os.getpid()}.jsonl", "a", buffering=1)
    _MADE: dict[int, float] = {}
    _connection_made = web_protocol.RequestHandler.connection_made
    _forward = proxy.Forwarder.forward
    _send = proxy.Forwarder._send

    def connection_made(self, transport):  # type: ignore[no-untyped-def]
        _MADE[id(transport)] = time.monotonic()
        return _connection_made(self, transport)

    async def forward(self, request):  # type: ignore[no-untyped-def]
        row = {"pid": os.getpid(), "via": self._via.removeprefix("1.1 "),
               "port": request.transport.get_extra_info("peername")[1],
               "conn": _MADE.pop(id(request.transport), None), "start": time.monotonic()}
        request["trace"] = row
        try:
            return await _forward(self, request)
        finally:
            _OUT.write(json.dumps(row) + "\n")

    async def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        row = request.get("trace")
        if row is not None:
            row["send"] = time.monotonic()
        return await _send(self, request, *args, **kwargs)

    web_protocol.RequestHandler.connection_made = connection_made
    proxy.Forwarder.forward = forward
    proxy.Forwarder._send = send
