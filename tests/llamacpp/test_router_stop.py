"""SIGTERM to ``xpulaunch llama serve`` while answers stream, with the REAL llama-server (CPU
build): the router stops accepting, lets the streams under way finish within ``--grace``,
ends those still running after it with an error event and a proper end (never a broken
body), then stops its servers; with front processes too. Clients: the official ``openai``
package, and aiohttp to see the bytes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from router_kit import chat, models_in
from test_router import servers

from helpers import inventory_path, wait_for

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(120)]

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def serve(
    tmp_path: Path, model: Path, slots: int, *options: str, ctx: int = 1024
) -> tuple[subprocess.Popen[str], str]:
    """The command on a free port, its model with ``slots`` parallel slots of ``ctx`` tokens
    each; its URL."""
    total = str(ctx * slots)
    table = models_in(tmp_path, model, m={})["models"]["m"]
    config = tmp_path / "models.toml"
    args = ["-c", total, "-np", str(slots), "-t", "1"]
    config.write_text(f'[models.m]\nmodel = "{table["model"]}"\nargs = {json.dumps(args)}\n')
    proc = subprocess.Popen(
        [
            XPULAUNCH,
            "llama",
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--inventory",
            str(inventory_path("cpu-only.json")),
            "--lock-dir",
            str(tmp_path / "locks"),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert " at " in line, line
    return proc, line.split(" at ")[1].split("/v1")[0]


@pytest.fixture
def ended(tmp_path: Path) -> Any:
    """Routers a test starts, killed at its end if still running (with their servers)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    for left in servers(tmp_path):
        left.kill()


def refused(url: str) -> bool:
    """Whether a new connection to the router is refused (it no longer listens). One that
    reached the listening socket's backlog just as it closed is reset by the kernel instead:
    not accepted either."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    return False


async def openai_streams(url: str, count: int, tokens: int, proc: subprocess.Popen[str]) -> Any:
    """``count`` streamed chat answers with the openai client; SIGTERM to the router once
    each has its first chunk. Each result: (chunks, finish reason) or the exception."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    first = asyncio.Semaphore(0)

    async def one() -> tuple[int, str | None]:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks, finish = 0, None
        async for chunk in stream:
            chunks += 1
            if chunks == 1:
                first.release()
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return chunks, finish

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    for _ in range(count):
        await asyncio.wait_for(first.acquire(), 60)
    proc.send_signal(signal.SIGTERM)
    return await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("fronts", ["0", "2"])
def test_sigterm_lets_every_stream_in_flight_finish(
    long_model: Path, tmp_path: Path, ended: list[subprocess.Popen[str]], fronts: str
) -> None:
    count = 6
    proc, url = serve(tmp_path, long_model, count, "--grace", "60", "--front-processes", fronts)
    ended.append(proc)
    results = asyncio.run(openai_streams(url, count, 1000, proc))
    for result in results:
        assert not isinstance(result, BaseException), results
        chunks, finish = result
        assert finish == "length" and chunks > 500, results
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    err = proc.stderr.read() if proc.stderr else ""
    said = re.search(r"SIGTERM: taking no new requests; (\d+) in flight get up to 60 s", err)
    assert said is not None and int(said[1]) >= 1, err
    assert "ended" not in err and "Traceback" not in err, err
    assert servers(tmp_path) == []


async def raw_streams(url: str, count: int, proc: subprocess.Popen[str]) -> Any:
    """``count`` streams far longer than the grace, read by aiohttp: SIGTERM once each has
    its first token; each result: the whole body and its Via header, or the exception (a
    body cut without its last chunk is ``ClientPayloadError``)."""
    import aiohttp

    first = asyncio.Semaphore(0)
    body = {"model": "m", "prompt": "hi", "max_tokens": 20000, "stream": True, "ignore_eos": True}

    async def one(session: aiohttp.ClientSession) -> tuple[bytes, str]:
        async with session.post(url + "/v1/completions", json=body) as answer:
            assert answer.status == 200
            data = b""
            while b"data: " not in data:  # past the comment lines while the model loads
                more = await answer.content.readany()
                assert more, data
                data += more
            first.release()
            async for chunk in answer.content.iter_any():
                data += chunk
            return data, answer.headers.get("Via", "")

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.ensure_future(one(session)) for _ in range(count)]
        for _ in range(count):
            await asyncio.wait_for(first.acquire(), 60)
        proc.send_signal(signal.SIGTERM)
        return await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("fronts", ["0", "2"])
def test_streams_longer_than_the_grace_end_with_an_error_and_a_proper_end(
    long_model: Path, tmp_path: Path, ended: list[subprocess.Popen[str]], fronts: str
) -> None:
    count = 6 if fronts != "0" else 2
    options = ("--grace", "1", "--front-processes", fronts)
    proc, url = serve(tmp_path, long_model, count, *options, ctx=16384)
    ended.append(proc)
    began = time.monotonic()
    results = asyncio.run(raw_streams(url, count, proc))
    status = proc.wait(timeout=60)
    took_s = time.monotonic() - began
    for result in results:
        assert not isinstance(result, BaseException), results
        data, _ = result
        events = [line for line in data.decode().splitlines() if line.startswith("data: ")]
        last = json.loads(events[-1].removeprefix("data: "))
        assert last["error"]["code"] == 503, last
        assert "the router stopped, and ended this answer" in last["error"]["message"], last
    if fronts != "0":  # some came through a front (6 over 3 sockets: all but surely)
        assert any(via.endswith("-front1") or via.endswith("-front2") for _, via in results)
    assert status == 128 + signal.SIGTERM
    assert took_s < 1 + 15, f"the router took {took_s:.1f} s to exit with --grace 1"
    err = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in err, err
    assert servers(tmp_path) == []


def ask(sock: socket.socket, host: str, method: str, path: str, body: bytes = b"") -> bytes:
    """One request on an open (kept-alive) connection; the answer's head and body."""
    sock.sendall(
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        got = sock.recv(65536)
        assert got, f"the connection was closed: {answer!r}"
        answer += got
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    while len(rest) < length:
        got = sock.recv(65536)
        assert got, f"the connection was closed: {head + rest!r}"
        rest += got
    return head + b"\r\n\r\n" + rest


def test_new_requests_are_refused_while_the_answers_finish(
    long_model: Path, tmp_path: Path, ended: list[subprocess.Popen[str]]
) -> None:
    """During the grace a new connection is refused, and a request on a connection kept
    open gets 503; once the last answer is over (its client left), the router ends."""
    from test_router import long_stream

    proc, url = serve(tmp_path, long_model, 1, "--grace", "60")
    ended.append(proc)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with (
        long_stream(url, "m") as stream,
        socket.create_connection((host, int(port)), timeout=30) as kept,
    ):
        assert b" 200 " in ask(kept, host, "GET", "/v1/models").split(b"\r\n")[0]
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: refused(url), "the router to stop accepting", timeout_s=20)
        answer = ask(kept, host, "POST", "/v1/chat/completions", json.dumps(chat("m")).encode())
        assert answer.startswith(b"HTTP/1.1 503 ") and b"the router is stopping" in answer
        later = b""
        while later.count(b"data: ") < 50:  # the stream is still answered, tokens go on
            got = stream.recv(65536)
            assert got and b'"error"' not in got, later + got
            later += got
        assert proc.poll() is None
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert servers(tmp_path) == []
