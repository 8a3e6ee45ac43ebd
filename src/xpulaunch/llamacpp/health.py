"""Talking to a llama-server over HTTP, and finding ports for it. Standard library only.

``GET /health`` answers 503 ``{"error": {"message": "Loading model", ...}}`` while the model
loads (the HTTP server binds first, so it answers early) and 200 ``{"status": "ok"}`` once
ready (reference 3.4; tools/server/server.cpp). Every call has a short timeout: a stopped or
wedged server accepts connections (the kernel queues them) but never answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any

from xpulaunch.llamacpp.plan import url_host
from xpulaunch.proc import ports

HEALTH_PATH = "/health"


def health_status(host: str, port: int, timeout_s: float) -> int:
    """The HTTP status of ``GET /health``; raises ``OSError`` when there is no answer, or
    when the whole answer took longer than ``timeout_s``."""
    # Imported here: http.client pulls in ssl and email, which only a llama run needs.
    import http.client

    began = time.monotonic()
    connection = http.client.HTTPConnection(url_host(host).strip("[]"), port, timeout=timeout_s)
    try:
        connection.request("GET", HEALTH_PATH)
        response = connection.getresponse()
        response.read()
        took_s = time.monotonic() - began
        if took_s > timeout_s:
            # The socket timeout bounds each read, not the answer: a server too busy to
            # serve /health promptly trickles it out. Slow is unhealthy too.
            raise TimeoutError(f"/health answered in {took_s:.1f} s, over {timeout_s:g} s")
        return response.status
    except http.client.HTTPException as exc:
        # A malformed or cut-off answer is no answer; OSError is what the supervisor's
        # probe runner counts as an unhealthy check.
        raise ConnectionError(f"bad HTTP answer from {host}:{port}: {exc!r}") from exc
    finally:
        connection.close()


def is_healthy(host: str, port: int, timeout_s: float) -> bool:
    """True when ``/health`` says 200; False for 503 (loading) or any other status."""
    return health_status(host, port, timeout_s) == 200


def complete(url: str, prompt: str, *, n_predict: int = 8, timeout_s: float = 30.0) -> Any:
    """``POST /completion`` and return the decoded JSON answer (raises ``OSError``)."""
    host_port = url.removeprefix("http://")
    host, _, port = host_port.rpartition(":")
    import http.client

    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    body = json.dumps({"prompt": prompt, "n_predict": n_predict})
    try:
        connection.request("POST", "/completion", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
    except http.client.HTTPException as exc:
        raise ConnectionError(f"bad HTTP answer from {url}: {exc!r}") from exc
    finally:
        connection.close()
    if response.status != 200:
        raise ConnectionError(f"{url}/completion: HTTP {response.status}: {data[:200]!r}")
    return json.loads(data)


def fetch_metrics(url: str, timeout_s: float) -> str:
    """``GET /metrics`` of a llama-server started with ``--metrics`` (raises ``OSError``)."""
    import http.client

    host, _, port = url.removeprefix("http://").rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        data = response.read()
    except http.client.HTTPException as exc:
        raise ConnectionError(f"bad HTTP answer from {url}/metrics: {exc!r}") from exc
    finally:
        connection.close()
    if response.status != 200:
        raise ConnectionError(f"{url}/metrics: HTTP {response.status}")
    return data.decode(errors="replace")


def free_port(host: str, exclude: Collection[int] = ()) -> int:
    """A free port for a replica on ``host``. If another process takes it first, llama-server
    fails with ``couldn't bind HTTP server socket`` and the runner moves that replica to
    another port (:mod:`xpulaunch.llamacpp.server`)."""
    hint = "give an address or name of this host"
    return ports.free_port(host, option="host", hint=hint, exclude=exclude)
