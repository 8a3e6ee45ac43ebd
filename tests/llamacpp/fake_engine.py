"""A stand-in OpenAI-compatible engine for the router's ``cmd`` tests (standard library only):
``python fake_engine.py --port N|--listen HOST:N [--name ID] [--no-health] [--start-after S]
[--record DIR] [--hold FILE]``.

It answers ``GET /health`` (404 with ``--no-health``), ``GET /v1/models``, and ``POST
/v1/chat/completions`` streamed (server-sent events, one word a chunk) and not. ``--record
DIR`` writes its environment as JSON to ``DIR/PID.json``; ``--start-after S`` listens only
after S seconds (a slow load); ``--hold FILE``: a streamed answer begins once FILE exists.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import time

WORDS = ["hello", " from", " the", " engine"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--listen", help="HOST:PORT, in place of --port")
    parser.add_argument("--name", default="engine")
    parser.add_argument("--no-health", action="store_true")
    parser.add_argument("--start-after", type=float, default=0.0)
    parser.add_argument("--record")
    parser.add_argument("--hold")
    options = parser.parse_args()
    if options.record:
        with open(os.path.join(options.record, f"{os.getpid()}.json"), "w") as out:
            json.dump(dict(os.environ), out)
    time.sleep(options.start_after)

    class Answer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _json(self, status: int, document: object) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health" and not options.no_health:
                self._json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": options.name}]})
            elif self.path.startswith("/echo"):
                self._json(200, {"path": self.path, "auth": self.headers.get("Authorization")})
            else:
                self._json(404, {"error": {"message": f"no {self.path}", "code": 404}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no {self.path}", "code": 404}})
            elif request.get("stream"):
                self._stream()
            else:
                message = {"role": "assistant", "content": "".join(WORDS)}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                self._json(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": options.name,
                        "choices": [choice],
                    },
                )

        def _stream(self) -> None:
            deadline = time.monotonic() + 60
            while options.hold and not os.path.exists(options.hold):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for word in WORDS:
                delta = {"index": 0, "delta": {"content": word}, "finish_reason": None}
                chunk = {
                    "id": "x",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": options.name,
                    "choices": [delta],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    port = options.port if options.listen is None else int(options.listen.rsplit(":", 1)[1])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Answer)
    server.serve_forever()


if __name__ == "__main__":
    main()
