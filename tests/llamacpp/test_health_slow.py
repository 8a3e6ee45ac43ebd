"""A /health that answers, but too slowly, is a failed check (a real HTTP server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from xpulaunch.llamacpp.health import health_status
from xpulaunch.supervisor.health import run_check

CHUNKS = 4
PAUSE_S = 0.3  # each pause is well within the socket timeout; all of them are not


class Trickle(BaseHTTPRequestHandler):
    """Answers 200, but dribbles the body out as an overloaded server does."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(CHUNKS))
        self.end_headers()
        for _ in range(CHUNKS):
            self.wfile.write(b"o")
            self.wfile.flush()
            time.sleep(PAUSE_S)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def trickle_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_slow_answer_is_a_failed_check(trickle_port: int) -> None:
    healthy, why = run_check(lambda: health_status("127.0.0.1", trickle_port, 0.5) == 200)
    assert not healthy
    assert why.startswith("TimeoutError: /health answered in") and "over 0.5 s" in why


def test_the_same_answer_within_the_timeout_is_healthy(trickle_port: int) -> None:
    assert health_status("127.0.0.1", trickle_port, 10.0) == 200
