"""Front processes: more event loops forwarding on the router's port (``--front-processes N``).

One event loop forwards a burst of requests one after the other: each costs it about a
millisecond (accepting, parsing, a new connection to llama-server, which closes it after
every streamed answer), so the last of 64 requests sent at once waits for the 63 before it.
With N front processes the port has N + 1 listening sockets (``SO_REUSEPORT``): the kernel
spreads new connections over the router and its fronts, and each forwards on its own core.

The router keeps every decision about models (loads, unloads, queues). It tells each front, over
a socket pair, the replicas that answer of every loaded model, as they change. A front sends a
request for such a model to one of them itself (round robin, as the router does) and tells the
router, which counts it in flight, without waiting for an answer: asking the router and waiting,
as every request once did, made the router's one event loop the queue of a burst (a mean 1.5-3.9
ms per request of a burst of 64, traced on an H200 host;
``docs/hardware/2026-12-02-s19-h200x1/``). For a model the front has no replicas of (not loaded,
loading, restarting, or with ``max_concurrency``, whose queue is the router's), it asks the
router for one and waits, which may load the model, as for the router's own requests. Before the
router unloads a model (an eviction, a group's swap, its ttl, a yield to a job, a reload,
``/models/unload``) it has every front drop its replicas and waits until each has
(:data:`SYNC_TIMEOUT_S` at most): a request that a front sent meanwhile is counted by then, and
the model stays. A request in a front counts as in flight until it is answered, so it is never
evicted from under it. What is not a model request (``/health``, ``/v1/models``, ``/metrics``,
``/models/...``) the front forwards to the router's private port. A front ends when its pipe
closes: when the router stops, and when the router's process dies, even by SIGKILL (the kernel
closes the pipe). A front that dies is started again on a new socket of the same port (unless it
died within :data:`RESPAWN_AFTER_S` of its start); what its requests held is released at once.

Messages are JSON lines. Front -> router: ``{"op": "acquire", "id": N, "model": ID}``,
``{"op": "use", "model": ID}``, ``{"op": "release", "model": ID}``, ``{"op": "count", "model":
ID, "replica": NAME, "status": S, "seconds": T}``, ``{"op": "synced", "sync": N}``, ``{"op":
"ready"}``, ``{"op": "pong"}``. Router -> front: first ``{"config": ..., "private": URL,
"max_body_bytes": N}``, then ``{"id": N, "name": ..., "host": ..., "port": ...}`` or
``{"id": N, "error": {"status": S, "message": ..., "kind": ..., "retry_after_s": ...}}`` (the
answer to an acquire), ``{"op": "route", "model": ID, "replicas": [[NAME, HOST, PORT], ...]}``
(none: ask the router), ``{"op": "sync", "sync": N}`` (after routes dropped: answer
``synced`` once read), ``{"op": "config", "config": ...}`` after a reload, ``{"op": "ping"}`` every
:data:`PING_EVERY_S` (a front silent for :data:`STALLED_AFTER_S` is killed and started again),
and
``{"op": "drain"}`` when the router stops: the front stops accepting, its answers under way go
on, and when its pipe closes (the router's grace is over) it ends those that still run, as the
router ends its own (:meth:`~xpulaunch.llamacpp.router.proxy.Forwarder.cut`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.plan import Replica
from xpulaunch.llamacpp.router.config import ModelConfig, RouterConfig
from xpulaunch.llamacpp.router.options import ServeConfig
from xpulaunch.llamacpp.router.policy import ModelState
from xpulaunch.llamacpp.router.slot import RouteError, Slot, Unavailable

if TYPE_CHECKING:
    from xpulaunch.llamacpp.router.models import ModelManager

READY_TIMEOUT_S = 30.0
# How long an unload waits for every front to drop a model's replicas (one that does not
# answer is stuck or ending: the router kills a stuck one, and its requests fail with it).
SYNC_TIMEOUT_S = 5.0
# A front that ends after this long is started again; one that ends sooner is not (a front
# that cannot run would otherwise be started over and over).
RESPAWN_AFTER_S = 5.0
# The router asks every front for a sign of life this often, and kills (and starts again) one
# that said nothing for STALLED_AFTER_S: a stopped or wedged front keeps its listening socket,
# and the kernel would go on handing it a share of the port's new connections, unanswered.
PING_EVERY_S = 1.0
STALLED_AFTER_S = 10.0
_BACKLOG = 1024
_LINE_LIMIT = 1 << 20  # the first message carries the config


# -- the router's side ---------------------------------------------------------------------------
def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets listening on one address with ``SO_REUSEPORT`` (``port`` 0: the
    first gets a free port, the others join it). A port that cannot be had is one line."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if len(addresses) > 1:
            raise UsageError(
                f"{host} is {len(addresses)} addresses ({', '.join(addresses)}); with "
                "front processes the router listens on one: give it as --host",
                option="host",
                value=host,
            )
        family, _, _, _, address = found[0]
        sockets = [_listen(family, address)]
        address = (address[0], sockets[0].getsockname()[1], *address[2:])
        sockets += [_listen(family, address) for _ in range(count - 1)]
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port",
            option="port",
            value=port,
        ) from None
    return sockets


def _listen(family: int, address: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


@dataclass
class _Front:
    number: int
    process: subprocess.Popen[bytes]
    writer: asyncio.StreamWriter
    ready: asyncio.Future[None]  # done when the front listens
    held: Counter[str] = field(default_factory=Counter)  # model -> requests acquired
    syncs: dict[int, asyncio.Future[None]] = field(default_factory=dict)  # sent, unanswered
    closed: bool = False
    started_s: float = field(default_factory=time.monotonic)
    heard_s: float = field(default_factory=time.monotonic)  # its last message


class Fronts:
    """The router's front processes, and the requests they hold."""

    def __init__(
        self,
        manager: ModelManager,
        *,
        on_request: Callable[[Slot, str, int, float], None],
        say: Callable[[str], None],
    ) -> None:
        self._manager, self._on_request, self._say = manager, on_request, say
        self._fronts: list[_Front] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._hello = b""
        self._private, self._max_body_bytes = "", 0
        self._address: tuple[int, tuple[Any, ...]] | None = None  # family, address
        self._routes: dict[str, list[tuple[str, str, int]]] = {}  # as the fronts have them
        self._sync = 0
        manager.published, manager.withdraw = self.publish, self.withdraw

    async def start(
        self, sockets: Sequence[socket.socket], *, private_url: str, max_body_bytes: int
    ) -> None:
        """One front per socket (each socket is closed here once its front has it); returns
        when every front listens."""
        self._private, self._max_body_bytes = private_url, max_body_bytes
        self._hello = self._hello_for(self._manager.config)
        if sockets:
            self._address = (sockets[0].family, sockets[0].getsockname())
        for number, sock in enumerate(sockets, start=1):
            await self._spawn(number, sock)
        try:
            waits = [f.ready for f in self._fronts]
            await asyncio.wait_for(asyncio.gather(*waits), READY_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            await self.close(0.0)
            raise UsageError(f"the router's front processes did not start ({exc!r})") from None

    async def _spawn(self, number: int, sock: socket.socket) -> None:
        ours, theirs = socket.socketpair()
        with sock, theirs:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "xpulaunch.llamacpp.router.fronts",
                    str(sock.fileno()),
                    str(theirs.fileno()),
                    str(number),
                ],
                pass_fds=(sock.fileno(), theirs.fileno()),
                stdin=subprocess.DEVNULL,
            )
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_LINE_LIMIT)
        front = _Front(number, process, writer, asyncio.get_running_loop().create_future())
        writer.write(self._hello)
        self._fronts.append(front)
        for model, replicas in self._routes.items():
            if replicas:
                self._reply(front, {"op": "route", "model": model, "replicas": replicas})
        self._keep(self._serve(front, reader))
        self._keep(self._watch(front))

    def _keep(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, front: _Front) -> None:
        """Ping the front; kill one that stopped answering (it is then started again)."""
        while not front.closed and not self._closing:
            await asyncio.sleep(PING_EVERY_S)
            silent_s = time.monotonic() - front.heard_s
            if front.ready.done() and silent_s > STALLED_AFTER_S and not front.closed:
                self._say(
                    f"router front {front.number} said nothing for {silent_s:.0f} s (stopped "
                    "or stuck); killing it"
                )
                with contextlib.suppress(ProcessLookupError):
                    front.process.kill()
                return
            self._reply(front, {"op": "ping"})

    async def _serve(self, front: _Front, reader: asyncio.StreamReader) -> None:
        slots = self._manager.slots
        try:
            while line := await reader.readline():
                front.heard_s = time.monotonic()
                message = json.loads(line)
                op = message["op"]
                slot = slots.get(message.get("model", ""))  # None: a model a reload removed
                if op == "acquire" and slot is None:
                    missing = {"status": 404, "message": "no such model", "kind": "not_found"}
                    self._reply(front, {"id": message["id"], "error": missing})
                elif op == "acquire" and slot is not None:
                    self._keep(self._acquire(front, message["id"], slot))
                elif op == "use" and slot is not None:
                    front.held[message["model"]] += 1
                    self._manager.use(slot)
                elif op == "release" and slot is not None:
                    front.held[message["model"]] -= 1
                    self._manager.release(slot)
                elif op == "synced":
                    synced = front.syncs.pop(message["sync"], None)
                    if synced is not None and not synced.done():
                        synced.set_result(None)
                elif op == "count" and slot is not None:
                    self._on_request(
                        slot, message["replica"], message["status"], message["seconds"]
                    )
                elif op == "ready" and not front.ready.done():
                    front.ready.set_result(None)
        except (ConnectionError, ValueError, KeyError) as exc:
            self._say(f"router front {front.number}: bad message ({exc!r}); closing it")
        finally:
            await self._gone(front)

    async def _acquire(self, front: _Front, ident: int, slot: Slot) -> None:
        try:
            replica = await self._manager.acquire(slot)
        except RouteError as exc:
            error = {
                "status": exc.status,
                "message": exc.message,
                "kind": exc.kind,
                "retry_after_s": exc.retry_after_s,
            }
            self._reply(front, {"id": ident, "error": error})
            return
        if front.closed:  # the front went while the request waited for the load
            self._manager.release(slot)
            return
        front.held[slot.id] += 1
        self._reply(
            front, {"id": ident, "name": replica.name, "host": replica.host, "port": replica.port}
        )

    def publish(self, slot: Slot) -> None:
        """Tell every front the replicas of ``slot`` that answer now: none unless it is
        loaded, and none for a model with ``max_concurrency`` (its turns are the router's)."""
        replicas = []
        if slot.state is ModelState.READY and slot.config.max_concurrency is None:
            replicas = [(r.name, r.host, r.port) for r in slot.replicas if slot.up.get(r.name)]
        if replicas != self._routes.get(slot.id, []):
            self._routes[slot.id] = replicas
            for front in self._fronts:
                self._reply(front, {"op": "route", "model": slot.id, "replicas": replicas})

    async def withdraw(self, slots: Sequence[Slot]) -> None:
        """Every front drops the replicas of ``slots``; returns once each has read that (or
        after :data:`SYNC_TIMEOUT_S`): whatever it sent before, the router has read then."""
        self._sync += 1
        sync, waits = self._sync, []
        for slot in slots:
            self._routes[slot.id] = []
        for front in self._fronts:
            if front.closed:
                continue
            for slot in slots:
                self._reply(front, {"op": "route", "model": slot.id, "replicas": []})
            front.syncs[sync] = asyncio.get_running_loop().create_future()
            waits.append(front.syncs[sync])
            self._reply(front, {"op": "sync", "sync": sync})
        if not waits:
            return
        _, late = await asyncio.wait(waits, timeout=SYNC_TIMEOUT_S)
        for front in self._fronts:
            if front.syncs.pop(sync, None) in late:
                self._say(
                    f"router front {front.number} did not answer within {SYNC_TIMEOUT_S:g} s; "
                    f"unloading {', '.join(s.id for s in slots)} without it"
                )

    def _reply(self, front: _Front, message: Mapping[str, Any]) -> None:
        if not front.closed:
            front.writer.write(json.dumps(message).encode() + b"\n")

    async def _gone(self, front: _Front) -> None:
        """A front's pipe closed: what its requests held is released, and unless the router
        stops, the front ended early (it is reaped and reported)."""
        front.closed = True
        slots = self._manager.slots
        for model in front.held.elements():
            if model in slots:
                self._manager.release(slots[model])
        front.held.clear()
        for sync in front.syncs.values():
            sync.cancel()  # nothing more comes from it
        front.syncs.clear()
        front.writer.close()
        if not front.ready.done():
            front.ready.set_exception(ConnectionError(f"front {front.number} ended at start"))
        if self._closing:
            return
        status = await asyncio.get_running_loop().run_in_executor(None, front.process.wait)
        said = f"router front {front.number} ended (exit status {status})"
        if time.monotonic() - front.started_s < RESPAWN_AFTER_S or self._address is None:
            self._say(
                f"{said} within {RESPAWN_AFTER_S:g} s of its start; not started again: "
                "the router and the other fronts go on serving the port"
            )
            return
        try:
            await self._spawn(front.number, _listen(*self._address))
        except OSError as exc:
            self._say(f"{said}; cannot start it again ({exc}); the others go on serving")
            return
        self._say(f"{said}; started again")

    def _hello_for(self, config: RouterConfig) -> bytes:
        hello = {
            "config": _config_document(config),
            "private": self._private,
            "max_body_bytes": self._max_body_bytes,
        }
        return json.dumps(hello).encode() + b"\n"

    def reconfigure(self, config: RouterConfig) -> None:
        """A reload: every front resolves names with the new config (and one started again
        later hears it first)."""
        self._hello = self._hello_for(config)
        for front in self._fronts:
            self._reply(front, {"op": "config", "config": _config_document(config)})

    def drain(self) -> None:
        """The router stops: every front stops accepting; its answers under way go on."""
        for front in self._fronts:
            self._reply(front, {"op": "drain"})

    async def close(self, grace_s: float) -> None:
        """Close every pipe (each front then stops), wait up to ``grace_s``, kill the rest."""
        self._closing = True
        for front in self._fronts:
            if not front.closed:
                front.writer.close()
        deadline = time.monotonic() + grace_s
        for front in self._fronts:
            left = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.get_running_loop().run_in_executor(None, front.process.wait, left)
            except subprocess.TimeoutExpired:
                front.process.kill()
                front.process.wait()
        for task in list(self._tasks):
            task.cancel()


# -- a front process -----------------------------------------------------------------------------
class RemoteModels:
    """The :class:`~xpulaunch.llamacpp.router.proxy.Models` of a front: the router's answers."""

    def __init__(self, config: RouterConfig, writer: asyncio.StreamWriter) -> None:
        self.config = config
        self.slots = {m.id: Slot(m) for m in config.models}
        self._writer = writer
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], str]] = {}
        self._next = 0
        self._routes: dict[str, list[Replica]] = {}  # the router's: the replicas that answer

    def reconfigure(self, config: RouterConfig) -> None:
        """Names resolve with ``config`` from now on (requests under way keep their slot)."""
        self.config = config
        for gone in set(self._routes) - set(config.ids):
            del self._routes[gone]
        for model in config.models:
            if model.id in self.slots:
                self.slots[model.id].config = model
            else:
                self.slots[model.id] = Slot(model)

    def _send(self, message: Mapping[str, Any]) -> None:
        if not self._writer.is_closing():
            self._writer.write(json.dumps(message).encode() + b"\n")

    def drop_routes(self) -> None:
        """Ask the router for every request from now on (it stops: each gets its 503)."""
        self._routes.clear()

    async def acquire(self, slot: Slot) -> Replica:
        replicas = self._routes.get(slot.id)
        if replicas:  # loaded: the next replica here, round robin, and the router counts it
            index = slot.turn % len(replicas)  # every one listed answers (Slot.pick's turn)
            slot.turn = index + 1
            self._send({"op": "use", "model": slot.id})
            return replicas[index]
        self._next += 1
        ident = self._next
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = (answer, slot.id)
        self._send({"op": "acquire", "id": ident, "model": slot.id})
        reply = await answer  # cancelled (the client left): answered() releases it
        error = reply.get("error")
        if error is not None:
            exc = RouteError(error["message"], retry_after_s=error["retry_after_s"])
            exc.status, exc.kind = error["status"], error["kind"]
            raise exc
        return Replica(reply["name"], reply["host"], reply["port"], port_fixed=True)

    def read(self, message: dict[str, Any]) -> None:
        """A model message of the router's: a model's replicas, a sync, an acquire's answer."""
        op = message.get("op")
        if op == "route":
            self._routes[message["model"]] = [
                Replica(name, host, port, port_fixed=True)
                for name, host, port in message["replicas"]
            ]
        elif op == "sync":
            self._send({"op": "synced", "sync": message["sync"]})
        else:
            self._answered(message)

    def _answered(self, reply: dict[str, Any]) -> None:
        answer, model = self._pending.pop(reply["id"], (None, ""))
        if answer is None:
            return
        if answer.cancelled():
            if "error" not in reply:  # acquired for a client that left meanwhile
                self._send({"op": "release", "model": model})
            return
        answer.set_result(reply)

    def release(self, slot: Slot) -> None:
        self._send({"op": "release", "model": slot.id})

    def count(self, slot: Slot, replica: str, status: int, seconds: float) -> None:
        self._send(
            {
                "op": "count",
                "model": slot.id,
                "replica": replica,
                "status": status,
                "seconds": seconds,
            }
        )

    def stop_waiting(self) -> None:
        for answer, _ in self._pending.values():
            if not answer.done():
                answer.set_exception(Unavailable("the router is stopping"))
        self._pending.clear()


def _config_document(config: RouterConfig) -> dict[str, Any]:
    return {
        "models": [m.as_dict() for m in config.models],
        "names": dict(config.names),
        "source": config.source,
        # Over the pipe only (never on a command line, which ps shows to anyone).
        "api_keys": list(config.serve.api_keys),
        "cors": list(config.serve.cors),
    }


def _config(document: Mapping[str, Any]) -> RouterConfig:
    models = tuple(ModelConfig.from_dict(fields) for fields in document["models"])
    serve = ServeConfig(tuple(document["api_keys"]), tuple(document["cors"]))
    return RouterConfig(models, document["source"], dict(document["names"]), serve)


async def _front(listen_fd: int, pipe_fd: int, number: int) -> None:
    import aiohttp
    from aiohttp import web

    from xpulaunch.llamacpp.router.proxy import (
        NOT_FORWARDED,
        NOT_FORWARDED_UP,
        Forwarder,
        error_response,
        server_logger,
    )

    pipe = socket.socket(fileno=pipe_fd)
    reader, writer = await asyncio.open_unix_connection(sock=pipe, limit=_LINE_LIMIT)
    hello = json.loads(await reader.readline())
    models = RemoteModels(_config(hello["config"]), writer)
    forwarder = Forwarder(
        models,
        max_body_bytes=hello["max_body_bytes"],
        on_request=models.count,
        via=f"xpulaunch-front{number}",
    )
    private = hello["private"]

    async def to_router(request: web.Request) -> web.StreamResponse:
        """Anything but a model request: answered by the router itself."""
        assert forwarder.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED_UP}
        try:
            async with forwarder.session.request(
                request.method, private + request.path_qs, data=body, headers=headers
            ) as answer:
                data = await answer.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return error_response(503, "the router is stopping", retry_after_s=1)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in NOT_FORWARDED}
        return web.Response(status=answer.status, body=data, headers=kept)

    app = forwarder.make_app([web.route("*", "/{tail:.*}", to_router)])

    def say(text: str) -> None:  # the router's stderr, as its own lines are
        sys.stderr.write(f"xpulaunch: router front {number}: {text}\n")
        sys.stderr.flush()

    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        logger=server_logger(say),
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.SockSite(runner, socket.socket(fileno=listen_fd))
    await site.start()
    writer.write(b'{"op": "ready"}\n')
    try:
        # Ends at the pipe's end: the router stopped, or died (a reset, when it was killed).
        with contextlib.suppress(ConnectionError):
            while line := await reader.readline():
                message = json.loads(line)
                if message.get("op") == "drain":
                    models.drop_routes()
                    forwarder.drain()
                    await _stop(site)  # no new connections
                elif message.get("op") == "config":  # the router reloaded its config
                    models.reconfigure(_config(message["config"]))
                elif message.get("op") == "ping":  # the router checks that we answer
                    writer.write(b'{"op": "pong"}\n')
                else:
                    models.read(message)
    finally:
        models.stop_waiting()
        forwarder.cut("the router stopped, and ended this answer")
        await _stop(site)
        await runner.cleanup()


async def _stop(site: Any) -> None:
    """Stop accepting on ``site``; once only (aiohttp refuses a stopped site's second stop)."""
    with contextlib.suppress(RuntimeError):
        await site.stop()


def main(argv: Sequence[str]) -> int:
    """``python -m xpulaunch.llamacpp.router.fronts LISTEN_FD PIPE_FD NUMBER``: a front."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the router, which ends us
    from xpulaunch.llamacpp.router.loops import loop_factory, run_loop

    listen_fd, pipe_fd, number = (int(a) for a in argv)
    run_loop(_front(listen_fd, pipe_fd, number), loop_factory())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
