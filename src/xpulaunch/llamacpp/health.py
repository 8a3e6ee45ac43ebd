"""Talking to a llama-server over HTTP, and finding ports for it. Standard library only.

``GET /health`` answers 503 ``{"error": {"message": "Loading model", ...}}`` while the model
loads (the HTTP server binds first, so it answers early) and 200 ``{"status": "ok"}`` once
ready (tools/server/server.cpp). Every call has a short timeout: a stopped or
wedged server accepts connections (the kernel queues them) but never answers.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from xpulaunch.llamacpp.plan import url_host
from xpulaunch.processes import ports

HEALTH_PATH = "/health"


def health_status(host: str, port: int, timeout_s: float, path: str = HEALTH_PATH) -> int:
    """The HTTP status of ``GET /health`` (or ``path``); raises ``OSError`` when there is no
    answer, or when the whole answer took longer than ``timeout_s``."""
    began = time.monotonic()
    status, _ = _request(url_host(host), port, "GET", path, timeout_s=timeout_s)
    took_s = time.monotonic() - began
    if took_s > timeout_s:
        # The socket timeout bounds each read, not the answer: a server too busy to serve
        # /health promptly trickles it out. Slow is unhealthy too.
        raise TimeoutError(f"{path} answered in {took_s:.1f} s, over {timeout_s:g} s")
    return status


def answers_checks(host: str, port: int, timeout_s: float, paths: Sequence[str]) -> bool:
    """Whether the first of ``paths`` the server has answers 200: a 404 moves on to the
    next (an engine without ``/health`` has ``/v1/models``). No paths: whether the port
    accepts a connection (raises ``OSError`` when it does not)."""
    if not paths:
        import socket

        socket.create_connection((url_host(host).strip("[]"), port), timeout=timeout_s).close()
        return True
    for index, path in enumerate(paths):
        status = health_status(host, port, timeout_s, path)
        if status != 404 or index == len(paths) - 1:
            return status == 200
    return False


def fetch_metrics(url: str, timeout_s: float) -> str:
    """``GET /metrics`` of a llama-server started with ``--metrics`` (raises ``OSError``)."""
    status, data = _request(*_host_port(url), "GET", "/metrics", timeout_s=timeout_s)
    if status != 200:
        raise ConnectionError(f"{url}/metrics: HTTP {status}")
    return data.decode(errors="replace")


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


def _request(
    host: str, port: int, method: str, path: str, body: str | None = None, *, timeout_s: float
) -> tuple[int, bytes]:
    """One HTTP request: (status, the whole answer). A malformed or cut-off answer is no
    answer: ``ConnectionError``, an ``OSError``, which is what the supervisor's health
    check runner counts as a failed check."""
    # Imported here: http.client pulls in ssl and email, which only a llama run needs.
    import http.client

    connection = http.client.HTTPConnection(host.strip("[]"), port, timeout=timeout_s)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, response.read()
    except http.client.HTTPException as exc:
        raise ConnectionError(f"bad HTTP answer from {host}:{port}{path}: {exc!r}") from exc
    finally:
        connection.close()


def free_port(host: str, exclude: Collection[int] = (), start: int | None = None) -> int:
    """A free port for a replica on ``host``. If another process takes it first, llama-server
    fails with ``couldn't bind HTTP server socket`` and the runner moves that replica to
    another port (:mod:`xpulaunch.llamacpp.server`)."""
    hint = "give an address or name of this host"
    return ports.free_port(host, option="host", hint=hint, exclude=exclude, start=start)
