"""The router with front processes (``--front-processes N``): N more processes accept on the
router's port (``SO_REUSEPORT``) and forward, while the router keeps every decision. With the
REAL llama-server (CPU build) and tiny models. Each answer's ``Via`` header names the process
that forwarded it, so the tests see that the fronts really serve."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from router_kit import call, chat, cuda_shim, models_in, router
from test_router import long_stream, metric_samples, processing, servers

from helpers import inventory_path, process_gone, wait_for
from xpulaunch.errors import UsageError
from xpulaunch.leases import LeaseManager
from xpulaunch.llamacpp.plan import Replica
from xpulaunch.llamacpp.router import fronts
from xpulaunch.llamacpp.router.models import ModelManager
from xpulaunch.llamacpp.router.slot import Slot

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(120)]

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
FRONT = "xpulaunch.llamacpp.router.fronts"
TWO = inventory_path("2x-h200.json")


def fronts_of(pid: int) -> list[psutil.Process]:
    """The front processes among ``pid``'s children (others may end while they are read)."""
    found = []
    for child in psutil.Process(pid).children():
        try:
            if FRONT in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def via(url: str, path: str, body: dict[str, object]) -> tuple[int, str]:
    """One request on a new connection: its status and its Via header."""
    status, _, headers = call(url, path, body)
    return status, headers.get("Via", "")


def test_fronts_share_the_port_and_the_routers_decisions(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, tiny_model, a={"aliases": ["alpha"]}, b={})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, _):
        fronts = fronts_of(os.getpid())
        assert len(fronts) == 2, [p.cmdline() for p in psutil.Process().children()]
        # 60 connections over 3 listening sockets: each process forwards some of them.
        answers = [via(served.url, "/v1/chat/completions", chat(m)) for m in ("a", "alpha") * 30]
        assert {status for status, _ in answers} == {200}
        assert {name for _, name in answers} == {
            "1.1 xpulaunch", "1.1 xpulaunch-front1", "1.1 xpulaunch-front2",
        }  # fmt: skip
        # One load for all of them, wherever they arrived; b was never asked for.
        models = {m["id"]: m for m in call(served.url, "/models/status")[1]["models"]}
        assert models["a"]["state"] == "ready" and models["b"]["state"] == "unloaded"
        assert len(servers(tmp_path)) == 1
        key = ("xpulaunch_requests_total", (("code", "200"), ("model", "a"), ("replica", "0")))
        assert metric_samples(served.url)[key] == 60  # counted wherever they were forwarded
        # The router's own routes and its errors, the same from every process.
        for _ in range(12):
            assert call(served.url, "/health")[:2] == (200, {"status": "ok"})
            assert sorted(m["id"] for m in call(served.url, "/v1/models")[1]["data"]) == ["a", "b"]
            status, body, _ = call(served.url, "/v1/chat/completions", b"{not json")
            assert status == 400 and "not valid JSON" in body["error"]["message"]
            status, body, _ = call(served.url, "/v1/chat/completions", chat("nope"))
            assert status == 404 and body["error"]["type"] == "model_not_found"
            status, body, _ = call(served.url, "/v2/nothing")
            assert status == 404 and "no route GET /v2/nothing" in body["error"]["message"]
            # A compressed body: the process that reads it decodes it, and sends it on so.
            status, body, _ = call(served.url, "/models/load", gzip.compress(b'{"model": "a"}'),
                                   headers={"Content-Encoding": "gzip"})  # fmt: skip
            assert status == 200 and body["state"] == "ready", body
    assert all(process_gone(p) for p in fronts)  # stopped with the router
    assert servers(tmp_path) == []


def test_a_request_held_by_a_front_keeps_its_model_and_leaving_cancels_it(
    llama_server: str, long_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, long_model, m={"args": ["-c", "131072", "-t", "1", "-np", "12"]})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, _):
        upstream = call(served.url, "/models/load", {"model": "m"})[1]["replicas"][0]["url"]
        streams = [long_stream(served.url, "m") for _ in range(12)]
        held = [s for s in streams if b"xpulaunch-front" in s.head]
        assert held, [s.head for s in streams]  # 12 connections, 3 sockets: some reached a front
        for stream in streams:
            if stream not in held:
                stream.sock.close()
        wait_for(lambda: processing(upstream) == len(held), "the other streams to be dropped")
        status, body, _ = call(served.url, "/models/unload", {"model": "m"})
        assert status == 409 and f"{len(held)} request(s) in flight" in body["error"]["message"]
        for stream in held:
            stream.sock.close()  # the clients leave: the fronts cancel, and release
        wait_for(lambda: processing(upstream) == 0, "llama-server to drop the requests", 10)
        wait_for(lambda: call(served.url, "/models/status")[1]["models"][0]["in_flight"] == 0,
                 "the fronts to release the requests")  # fmt: skip
        assert call(served.url, "/models/unload", {"model": "m"})[0] == 200


def test_fronts_route_a_loaded_model_themselves_and_the_router_counts_it(
    llama_server: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded model's requests that reach a front go to its replica without waiting for the
    router (the front only tells it: "use"); those that reach the router, or a model not
    loaded, are acquired there. The counts of both agree with where the answers came from."""
    asked: Counter[str] = Counter()
    acquire, use = ModelManager.acquire, ModelManager.use

    async def acquired(self: ModelManager, slot: Slot) -> Replica:
        asked["acquire"] += 1
        return await acquire(self, slot)

    def used(self: ModelManager, slot: Slot) -> None:
        asked["use"] += 1
        use(self, slot)

    monkeypatch.setattr(ModelManager, "acquire", acquired)
    monkeypatch.setattr(ModelManager, "use", used)
    config = models_in(tmp_path, tiny_model, a={}, b={"max_concurrency": 4})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, _):
        assert call(served.url, "/models/load", {"model": "a"})[0] == 200
        wait_for(lambda: via(served.url, "/v1/chat/completions", chat("a"))[1]
                 .startswith("1.1 xpulaunch-front"), "a front to forward")  # fmt: skip
        asked.clear()
        answers = [via(served.url, "/v1/chat/completions", chat("a"))[1] for _ in range(40)]
        by_fronts = sum(name.startswith("1.1 xpulaunch-front") for name in answers)
        assert by_fronts > 0
        assert asked == Counter(use=by_fronts, acquire=40 - by_fronts)
        # A model with max_concurrency is never routed by the fronts: its turns are the
        # router's to give.
        asked.clear()
        limited = [via(served.url, "/v1/chat/completions", chat("b")) for _ in range(20)]
        assert {status for status, _ in limited} == {200}
        assert any(name.startswith("1.1 xpulaunch-front") for _, name in limited)
        assert asked == Counter(acquire=20)
        status = {m["id"]: m for m in call(served.url, "/models/status")[1]["models"]}
        assert status["a"]["in_flight"] == status["b"]["in_flight"] == 0


def test_an_unload_never_meets_a_request_a_front_sent(
    llama_server: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients keep the fronts busy with a loaded model while it is unloaded again and again,
    and the router reads what its fronts say late (20 ms a line, as its loop may in a burst):
    a front's request is then on its way to the replica before the router knows of it. Each
    unload either finds requests in flight (409) or has every front stop routing the model
    first (and so learns of every request sent before), so none is sent to a server being
    stopped; every answer is 200 (the next request loads the model again)."""
    serve = fronts.Fronts._serve

    async def read_late(self: fronts.Fronts, front: Any, reader: asyncio.StreamReader) -> None:
        class Late:
            async def readline(self) -> bytes:
                await asyncio.sleep(0.02)
                return await reader.readline()

        await serve(self, front, Late())  # type: ignore[arg-type]

    monkeypatch.setattr(fronts.Fronts, "_serve", read_late)
    config = models_in(tmp_path, tiny_model, a={})
    with router(config, llama_server, tmp_path, front_processes=3) as (served, seen):
        assert call(served.url, "/models/load", {"model": "a"})[0] == 200
        stop = threading.Event()
        answers: list[tuple[int, str]] = []

        def client(number: int) -> None:
            pause = random.Random(number)
            while not stop.is_set():
                answers.append(via(served.url, "/v1/chat/completions", chat("a")))
                time.sleep(pause.uniform(0, 0.1))  # moments when the model may be idle

        clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in clients:
            thread.start()
        unloads: Counter[int] = Counter()
        try:
            deadline = time.monotonic() + 60
            while (unloads[200] < 20 or unloads[409] < 5) and time.monotonic() < deadline:
                unloads[call(served.url, "/models/unload", {"model": "a"})[0]] += 1
                time.sleep(0.05)
        finally:
            stop.set()
            for thread in clients:
                thread.join()
        assert unloads[200] >= 20 and unloads[409] >= 5, unloads
        assert set(unloads) == {200, 409}
        assert {status for status, _ in answers} == {200}, Counter(s for s, _ in answers)
        assert any(name.startswith("1.1 xpulaunch-front") for _, name in answers)
        loads = [m for m in seen.messages if m.startswith("model a ready in")]
        assert len(loads) >= unloads[200]  # loaded again after each unload (but the last)
        wait_for(lambda: call(served.url, "/models/status")[1]["models"][0]["in_flight"] == 0,
                 "the last releases to be read")  # fmt: skip


def test_an_unload_goes_on_without_a_front_that_does_not_answer(
    llama_server: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped front cannot say it dropped a model's replicas: the unload waits for it
    SYNC_TIMEOUT_S at most, says so, and goes on."""
    monkeypatch.setattr(fronts, "SYNC_TIMEOUT_S", 1.0)
    config = models_in(tmp_path, tiny_model, a={})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, seen):
        assert call(served.url, "/models/load", {"model": "a"})[0] == 200
        stopped, _ = fronts_of(os.getpid())
        number = stopped.cmdline()[-1]
        stopped.send_signal(signal.SIGSTOP)
        # Asked at the router's private port: on the public one, a connection that the kernel
        # gave the stopped front would wait for it (until the router kills it as stuck).
        assert served._fronts is not None
        private = served._fronts._private
        try:
            began = time.monotonic()
            assert call(private, "/models/unload", {"model": "a"})[0] == 200
            took = time.monotonic() - began
        finally:
            stopped.send_signal(signal.SIGCONT)
        assert 1.0 <= took < 10, took
        said = [m for m in seen.messages if f"router front {number} did not answer" in m]
        assert said == [f"router front {number} did not answer within 1 s; unloading a without it"]
        assert servers(tmp_path) == []
        # It runs again: it had no replicas of a since, and asks the router, which loads a.
        again = (200, f"1.1 xpulaunch-front{number}")
        wait_for(lambda: via(served.url, "/v1/chat/completions", chat("a")) == again,
                 "the front to forward again")  # fmt: skip


@pytest.mark.parametrize("respawn_after_s", [0.0, 3600.0])
def test_a_front_that_dies_is_started_again_or_leaves_the_port_served(
    llama_server: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    respawn_after_s: float,
) -> None:  # fmt: skip
    # A front that ran long enough is started again; one that ends soon after its start
    # (here: any, with an hour's bound) is not, and the others go on serving.
    monkeypatch.setattr(fronts, "RESPAWN_AFTER_S", respawn_after_s)
    config = models_in(tmp_path, tiny_model, a={})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, seen):
        gone, kept = fronts_of(os.getpid())
        number = gone.cmdline()[-1]
        gone.send_signal(signal.SIGKILL)
        said = wait_for(lambda: [m for m in seen.messages if f"router front {number} ended" in m],
                        "the router to see its front end")  # fmt: skip
        names = {"1.1 xpulaunch", f"1.1 xpulaunch-front{kept.cmdline()[-1]}"}
        if respawn_after_s == 0:
            assert said[0].endswith("; started again"), said
            again = wait_for(lambda: [p for p in fronts_of(os.getpid()) if p.pid != kept.pid],
                             "the new front")  # fmt: skip
            assert again[0].pid != gone.pid and again[0].cmdline()[-1] == number
            names.add(f"1.1 xpulaunch-front{number}")
        else:
            assert "not started again" in said[0], said
            assert fronts_of(os.getpid()) == [kept]
        answers = [via(served.url, "/v1/chat/completions", chat("a")) for _ in range(40)]
        assert {status for status, _ in answers} == {200}
        assert {name for _, name in answers} == names


def test_a_stopped_front_is_killed_and_started_again(
    llama_server: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A front that stops answering (SIGSTOP: it keeps its socket, and the kernel goes on
    giving it new connections) is killed once silent too long and started again; every
    request is answered afterwards."""
    monkeypatch.setattr(fronts, "PING_EVERY_S", 0.1, raising=False)
    monkeypatch.setattr(fronts, "STALLED_AFTER_S", 1.0, raising=False)
    monkeypatch.setattr(fronts, "RESPAWN_AFTER_S", 0.0)
    config = models_in(tmp_path, tiny_model, a={})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, seen):
        stopped, kept = fronts_of(os.getpid())
        number = stopped.cmdline()[-1]
        stopped.send_signal(signal.SIGSTOP)
        try:
            said = wait_for(
                lambda: [m for m in seen.messages if f"router front {number} said nothing" in m],
                "the router to see its front stuck",
            )
            assert "killing it" in said[0]
            wait_for(
                lambda: [m for m in seen.messages if f"front {number} ended" in m and "again" in m],
                "the front to be started again",
            )
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                stopped.send_signal(signal.SIGCONT)
        answers = [via(served.url, "/v1/chat/completions", chat("a")) for _ in range(30)]
        assert {status for status, _ in answers} == {200}
        assert kept.is_running()


def test_kill_9_of_the_router_ends_its_fronts_servers_and_lease(
    llama_server: str, tiny_model: Path, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    config = tmp_path / "models.toml"
    table = models_in(tmp_path, tiny_model, a={})["models"]["a"]
    config.write_text(f'[models.a]\nmodel = "{table["model"]}"\n'
                      f"args = {json.dumps(table['args'])}\n")  # fmt: skip
    # A CUDA build's stand-in on two "GPUs" (router_kit.cuda_shim), so that the model is leased
    binary = cuda_shim(tmp_path / "bin", llama_server)
    (tmp_path / "records").mkdir()
    env = {"FAKE_LLAMA_INVENTORY": str(TWO), "SHIM_RECORD_DIR": str(tmp_path / "records")}
    router_proc = subprocess.Popen(
        [XPULAUNCH, "llama", "serve", "--config", str(config), "--port", "0", "--binary", binary,
         "--inventory", str(TWO), "--lock-dir", str(tmp_path / "locks"),
         "--front-processes", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    started.append(router_proc)
    assert router_proc.stdout is not None
    line = router_proc.stdout.readline()
    url = line.split(" at ")[1].split("/v1")[0]
    assert {call(url, "/v1/chat/completions", chat("a"))[0] for _ in range(8)} == {200}
    fronts = fronts_of(router_proc.pid)
    model_servers = servers(tmp_path)
    assert len(fronts) == 3 and len(model_servers) == 1
    assert held(tmp_path) == 1  # the model's share of a GPU
    router_proc.kill()
    router_proc.wait(timeout=10)
    wait_for(lambda: all(process_gone(p) for p in fronts + model_servers),
             "the fronts and the server to end", timeout_s=20)  # fmt: skip
    wait_for(lambda: held(tmp_path) == 0, "the lease to end")


def held(tmp_path: Path) -> int:
    """The leases of the test's lock directory: whole devices and slots of shared ones."""
    report = LeaseManager(tmp_path / "locks").status()
    return len(report.leases) + len(report.slots)


def test_fronts_listen_on_one_address(monkeypatch: pytest.MonkeyPatch) -> None:
    sockets = fronts.listening_sockets("127.0.0.1", 0, 3)
    try:
        assert len(sockets) == 3 and len({s.getsockname() for s in sockets}) == 1
        with socket.socket() as other, pytest.raises(UsageError, match="cannot listen on"):
            other.bind(("127.0.0.1", 0))
            other.listen()
            fronts.listening_sockets("127.0.0.1", other.getsockname()[1], 2)  # not REUSEPORT
    finally:
        for sock in sockets:
            sock.close()
    # A name of two addresses (localhost on a host with IPv6): one socket would leave the
    # other address unanswered, so it is refused.
    both = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]  # fmt: skip
    monkeypatch.setattr(fronts.socket, "getaddrinfo", lambda *a, **k: both)
    with pytest.raises(UsageError, match=r"localhost is 2 addresses \(::1, 127.0.0.1\)"):
        fronts.listening_sockets("localhost", 0, 2)


def test_a_front_takes_the_routed_replicas_in_turn_and_tells_the_router() -> None:
    """A front's own routing: the router's replicas of a loaded model in turn (round robin,
    as the router's Slot.pick), one ``use`` to the router for each request; a model without
    routes is asked of the router."""
    from xpulaunch.llamacpp.router.config import parse_config

    config = parse_config({"models": {"m": {"model": "m.gguf"}, "n": {"model": "n.gguf"}}})

    async def scenario() -> tuple[list[int], list[dict[str, Any]]]:
        ours, theirs = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=ours)
        their_reader, their_writer = await asyncio.open_unix_connection(sock=theirs)
        models = fronts.RemoteModels(config, writer)
        replicas = [["m-0", "127.0.0.1", 4001], ["m-1", "127.0.0.1", 4002]]
        models.read({"op": "route", "model": "m", "replicas": replicas})
        ports = [(await models.acquire(models.slots["m"])).port for _ in range(5)]
        asking = asyncio.ensure_future(models.acquire(models.slots["n"]))  # no routes: asks
        sent = [json.loads(await their_reader.readline()) for _ in range(6)]
        asking.cancel()
        writer.close()
        their_writer.close()
        return ports, sent

    ports, sent = asyncio.run(scenario())
    assert ports == [4001, 4002, 4001, 4002, 4001]
    assert sent[:5] == [{"op": "use", "model": "m"}] * 5
    assert sent[5] == {"op": "acquire", "id": 1, "model": "n"}
