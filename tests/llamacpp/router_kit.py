"""What the model router's tests share: routers over tiny models, HTTP calls, and a CUDA
build's stand-in that really serves.

``cuda_shim(dir, llama_server)`` writes a ``llama-server`` that answers ``--list-devices``
like a CUDA build (``fake_cuda_server.py``, GPUs of ``$FAKE_LLAMA_INVENTORY``) and otherwise
runs the real CPU llama-server with its ``--device`` turned into ``none``: the router then
plans, pins and leases GPUs as on a CUDA host while every model really answers. ``--help``
is the real one (a build with ``--fit``). Each server it starts writes its
``CUDA_VISIBLE_DEVICES`` and the arguments it was given to ``$SHIM_RECORD_DIR/PID``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xpulaunch
from helpers import load_inventory
from xpulaunch.events import Event
from xpulaunch.llamacpp.router.router import Router
from xpulaunch.llamacpp.server import HealthOptions
from xpulaunch.model import Inventory

FAKE = Path(__file__).with_name("fake_cuda_server.py")
FAST = HealthOptions(ready_interval_s=0.05, interval_s=0.5, timeout_s=2.0)
SMALL = ["-c", "256", "-t", "1"]


@dataclass
class Seen:
    """What a router reported: its lines and its events (with the model of each)."""

    messages: list[str] = field(default_factory=list)
    events: list[tuple[Event, str | None]] = field(default_factory=list)

    def on_event(self, event: Event, model: str | None) -> None:
        self.events.append((event, model))

    def of(self, kind: type) -> list[Any]:
        return [e for e, _ in self.events if isinstance(e, kind)]


def models_in(folder: Path, tiny_model: Path, **tables: dict[str, Any]) -> dict[str, Any]:
    """A config document whose models are the tiny model under paths unique to ``folder``
    (so a test finds its own servers by their command line)."""
    models: dict[str, Any] = {}
    for name, table in tables.items():
        path = folder / f"{name}.gguf"
        if not path.exists():
            path.symlink_to(tiny_model)
        models[name] = {"model": str(path), "args": SMALL, **table}
    return {"models": models}


@contextmanager
def router(
    config: dict[str, Any],
    binary: str,
    tmp_path: Path,
    *,
    inventory: Inventory | None = None,
    env: dict[str, str] | None = None,
    **options: Any,
) -> Iterator[tuple[Router, Seen]]:
    """A started router on a free port, stopped at the end of the block."""
    import os

    seen = Seen()
    started = xpulaunch.serve_models(
        config, binary=binary, inventory=inventory or load_inventory("cpu-only.json"),
        lock_dir=tmp_path / "locks", health=options.pop("health", FAST), grace_s=5.0,
        parent_env={**os.environ, **(env or {})}, on_event=seen.on_event,
        on_message=seen.messages.append, **options,
    )  # fmt: skip
    try:
        yield started, seen
    finally:
        started.stop()


def call(
    url: str,
    path: str,
    body: dict[str, Any] | bytes | None = None,
    *,
    timeout_s: float = 60,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """One request (POST when there is a body): status, decoded JSON (or text), headers."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url + path, data=data, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            status, raw, headers = answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        status, raw, headers = error.code, error.read(), dict(error.headers)
    try:
        return status, json.loads(raw), headers
    except ValueError:
        return status, raw.decode(errors="replace"), headers


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            **extra}  # fmt: skip


def cuda_shim(folder: Path, llama_server: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "llama-server"
    path.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = "--list-devices" ] && exec {shlex.quote(sys.executable)} '
        f'{shlex.quote(str(FAKE))} "$@"\n'
        f'[ "$1" = "--help" ] && exec {shlex.quote(llama_server)} --help\n'
        '[ -n "$SHIM_RECORD_DIR" ] && printf "%s\\n%s\\n" "$CUDA_VISIBLE_DEVICES" "$*" '
        '> "$SHIM_RECORD_DIR/$$"\n'
        "prev=\n"
        'for a do\n  shift\n  case "$prev" in --device|-dev) a=none ;; esac\n'
        '  set -- "$@" "$a"\n  prev=$a\ndone\n'
        f'exec {shlex.quote(llama_server)} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def shim_records(folder: Path) -> list[tuple[str, str]]:
    """(CUDA_VISIBLE_DEVICES, arguments) of every server the shim started."""
    found = []
    for record in sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        mask, args = record.read_text().splitlines()[:2]
        found.append((mask, args))
    return found


IMPOSTOR = """
import http.server, sys, time

class Answer(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = b'{"model": "IMPOSTOR"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def log_message(self, *args):
        pass

while True:  # bind the moment the port is free
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Answer)
        break
    except OSError:
        time.sleep(0.005)
print("listening", flush=True)
server.serve_forever()
"""


class Impostor:
    """Another program on ``port`` that answers every request, ``/health`` too, with 200 and
    ``{"model": "IMPOSTOR"}`` (a plain Python HTTP server). It binds the port the moment it is
    free (trying every few milliseconds), and is killed at the end of the block."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", IMPOSTOR, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid

    def listening(self, timeout_s: float = 20.0) -> Impostor:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        assert ready and self.proc.stdout.readline() == b"listening\n", "it never bound"
        return self

    def __enter__(self) -> Impostor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def slow_binder(folder: Path, llama_server: str, delay_s: float = 2.0) -> str:
    """A llama-server behind a wrapper that waits before it starts it (as a SYCL build's
    ``setvars.sh`` does): its port stays free for ``delay_s`` after each start."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "slow-llama-server"
    path.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --list-devices|--help) exec {shlex.quote(llama_server)} "$@" ;; esac\n'
        f'sleep {delay_s}\nexec {shlex.quote(llama_server)} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)
