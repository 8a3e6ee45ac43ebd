"""The model router: one OpenAI-compatible port in front of several llama.cpp models, each
loaded on demand onto devices chosen and leased like any launch (``xpulaunch llama serve``,
:func:`serve_models`).

::

    import xpulaunch
    with xpulaunch.serve_models("models.toml", port=8080) as router:
        print(router.url)      # http://127.0.0.1:8080; loads a model at its first request
        router.wait()          # until stopped (Ctrl-C in the CLI)

The router runs its own event loop on a thread of its own; the caller's thread only starts,
waits and stops it. Each loaded model is a :class:`~xpulaunch.llamacpp.server.LlamaServer`
under its own Supervisor, whose guardian kills its servers (and so frees its devices) if
this process dies, even by SIGKILL.

A stop (:meth:`Router.stop`, SIGTERM or Ctrl-C in the CLI) drains: the port stops accepting,
a request on a connection already open gets 503, and the answers under way have the grace
(``grace_s``, ``--grace``) to finish; then what still runs is ended (a stream with an error
event and its proper end), and the servers are stopped. A second signal ends it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError, XpulaunchError
from xpulaunch.llamacpp.plan import url_host
from xpulaunch.llamacpp.router.config import RouterConfig, parse_config, read_config
from xpulaunch.llamacpp.router.loops import loop_factory, run_loop
from xpulaunch.processes.signals import wait_answering

if TYPE_CHECKING:
    from xpulaunch.events import Event
    from xpulaunch.llamacpp.router.fronts import Fronts
    from xpulaunch.llamacpp.router.models import ModelManager
    from xpulaunch.llamacpp.router.proxy import Proxy
    from xpulaunch.llamacpp.router.setup import Setup

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # a few images in a chat request, base64-encoded


class Router:
    """A running (after :meth:`start`) router; a context manager."""

    def __init__(
        self,
        config: RouterConfig,
        setup: Setup,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        front_processes: int = 0,
        on_event: Callable[[Event, str | None], None] | None = None,
        on_message: Callable[[str], None] | None = None,
    ) -> None:
        """``port`` 0: a free port (see :attr:`url`). ``front_processes``: processes that
        forward on the same port beside the router's own loop
        (:mod:`~xpulaunch.llamacpp.router.fronts`). ``on_event(event, model)`` gets the
        router's model events (``model`` None) and each replica's supervisor events (with
        its model's id); ``on_message`` one line at a time of what happens (default:
        ``xpulaunch: ...`` lines on stderr). Both run on the router's thread."""
        if front_processes < 0:
            raise UsageError("must be 0 or more", option="front_processes", value=front_processes)
        self.config, self.setup = config, setup
        self.host, self.port = host, port
        self.front_processes = front_processes
        self._max_body_bytes = max_body_bytes
        self._on_event = on_event or (lambda event, model: None)
        self._on_message = on_message or _to_stderr
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None  # a second signal: no more waiting
        self._bound = threading.Event()
        self._error: BaseException | None = None
        self._status: int | None = None
        self._signals = 0
        self._signum: int | None = None
        self.manager: ModelManager | None = None
        self._fronts: Fronts | None = None
        # API keys from outside the file (--api-key, $XPULAUNCH_API_KEY): a reload keeps them.
        self.extra_api_keys: tuple[str, ...] = ()
        self._reloads: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        """Listen, and return the URL once the port is bound (models load on demand)."""
        if self._thread is not None:
            return self.url
        self._thread = threading.Thread(target=self._run, name="xpulaunch-router", daemon=True)
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self.url

    def _run(self) -> None:
        try:
            run_loop(self._main(), loop_factory())
        except BaseException as exc:  # reported to the thread that called start()  # noqa: BLE001
            self._error = exc if self._error is None else self._error
            self._status = 1 if self._status is None else self._status
        finally:
            self._bound.set()

    async def _main(self) -> None:
        from aiohttp import web

        from xpulaunch.llamacpp.router.metrics import scrape
        from xpulaunch.llamacpp.router.models import ModelManager
        from xpulaunch.llamacpp.router.proxy import Proxy, server_logger

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._hurry = asyncio.Event()
        manager = ModelManager(
            self.config, self.setup, on_event=self._on_event, on_message=self._on_message
        )
        self.manager = manager

        async def metrics() -> str:
            assert proxy.session is not None
            return await scrape(proxy.session, manager.slots.values())

        proxy = Proxy(
            manager,
            max_body_bytes=self._max_body_bytes,
            metrics=metrics,
            on_request=_count,
            reload=self.reload_now,
        )
        # handler_cancellation: a client that disconnects cancels its handler, which closes
        # the upstream request (aiohttp >= 3.9 leaves handlers running unless asked).
        runner = web.AppRunner(
            proxy.app(),
            handler_cancellation=True,
            access_log=None,
            logger=server_logger(self._on_message),
            shutdown_timeout=self.setup.grace_s,
        )
        await runner.setup()
        try:
            site, fronts = await self._listen(runner, manager)
            self._fronts = fronts
        except BaseException:
            await runner.cleanup()
            raise
        self._bound.set()
        manager.warm_up()
        manager.preload()
        watcher = asyncio.get_running_loop().create_task(manager.watch_ttl())
        yielding = asyncio.get_running_loop().create_task(manager.watch_jobs())
        await self._stop.wait()
        yielding.cancel()
        await site.stop()  # no new connections
        await self._drain(proxy, fronts, manager)
        if fronts is not None:
            await fronts.close(self.setup.grace_s)  # a front ends its own streams first
        await manager.close()
        watcher.cancel()
        await runner.cleanup()
        self._status = 128 + self._signum if self._signum is not None else 0

    async def _drain(self, proxy: Proxy, fronts: Fronts | None, manager: ModelManager) -> None:
        """Let the answers under way finish, for the grace at most (after a second signal:
        not at all), taking no new request; then end those that still run."""
        proxy.drain()
        if fronts is not None:
            fronts.drain()  # they stop accepting too
        await manager.refuse()
        grace_s, busy = self.setup.grace_s, manager.in_flight()
        who = signal.Signals(self._signum).name if self._signum else "stopping"
        if busy and grace_s > 0:
            self._on_message(
                f"{who}: taking no new requests; {busy} in flight get up to {grace_s:g} s "
                "to finish (again to stop at once)"
            )
            await self._until_idle(manager, grace_s)
        cut = proxy.cut(f"the router stopped, and ended this answer ({who}, grace {grace_s:g} s)")
        if cut:
            self._on_message(f"{who}: ended {cut} answer(s) still running")

    async def _until_idle(self, manager: ModelManager, timeout_s: float) -> None:
        """Until no request is in flight, ``timeout_s`` have passed, or a second signal."""
        assert self._hurry is not None
        waits = [
            asyncio.ensure_future(manager.idle()),
            asyncio.ensure_future(self._hurry.wait()),
        ]
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()

    async def _listen(self, runner: Any, manager: ModelManager) -> tuple[Any, Fronts | None]:
        """The public site, and the front processes beside it (with a private site of the
        router's own, where they send what is not a model request)."""
        from aiohttp import web

        if not self.front_processes:
            site = web.TCPSite(runner, self.host, self.port)
            try:
                await site.start()
            except OSError as exc:
                raise UsageError(
                    f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); choose "
                    "another --port",
                    option="port",
                    value=self.port,
                ) from None
            self.port = _bound_port(site, self.port)
            return site, None
        from xpulaunch.llamacpp.router.fronts import Fronts, listening_sockets

        sockets = listening_sockets(self.host, self.port, self.front_processes + 1)
        self.port = sockets[0].getsockname()[1]
        shared = web.SockSite(runner, sockets[0])
        private = web.TCPSite(runner, "127.0.0.1", 0)
        fronts = Fronts(manager, on_request=_count, say=self._on_message)
        try:
            await shared.start()
            await private.start()
            private_url = f"http://127.0.0.1:{_bound_port(private, 0)}"
            await fronts.start(
                sockets[1:], max_body_bytes=self._max_body_bytes, private_url=private_url
            )
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        return shared, fronts

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the router has stopped; its exit status (None: timeout): 0 after
        :meth:`stop`, 128 + N after signal N."""
        thread = self._thread
        if thread is None:
            raise UsageError("the router was not started: call start() first")

        def joined(slice_s: float | None) -> int | None:
            thread.join(slice_s)
            return None if thread.is_alive() else (self._status or 0)

        return wait_answering(joined, timeout)

    def stop(self) -> int:
        """Close the port, let the answers under way finish (for ``grace_s`` at most), then
        stop every model's servers and free their devices."""
        self._post_stop()
        status = self.wait()
        return 0 if status is None else status

    def _post_stop(self, event: asyncio.Event | None = None) -> None:
        loop, stop = self._loop, event or self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just finished: nothing left
                loop.call_soon_threadsafe(stop.set)

    def send_stop_signal(self, signum: int) -> None:
        """For a signal handler: stop gracefully; a second call kills every server at once.
        Only posts (no lock), as :meth:`LlamaServer.send_stop_signal` does."""
        self._signals += 1
        self._signum = self._signum or signum
        self._post_stop()
        if self._signals > 1:
            self._post_stop(self._hurry)
        if self._signals > 1 and self.manager is not None:
            for server in self.manager.servers():
                server.send_stop_signal(signal.SIGKILL)
                server.send_stop_signal(signal.SIGKILL)

    def send_reload_signal(self, signum: int = signal.SIGHUP) -> None:
        """For a signal handler (SIGHUP): read the config file again; only posts."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._start_reload)

    def _start_reload(self) -> None:
        """On the loop: a reload for a signal, whose task is kept until it ends."""
        task = asyncio.ensure_future(self._reload_for_signal())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload_for_signal(self) -> None:
        # A file that does not load was said in the output (reload_now); for a signal there
        # is nobody else to tell, and the task must not end in an unretrieved exception.
        with contextlib.suppress(UsageError):
            await self.reload_now()

    async def reload_now(self) -> list[str]:
        """Read the config file again (on the loop) and take it: what changed, one line
        each, also said in the router's output. A config that does not load is one line, and
        the one before keeps serving."""
        manager = self.manager
        source = self.config.source
        if manager is None:
            raise UsageError("the router is not running")
        if not os.path.isfile(source):
            raise UsageError(f"the router's config is not a file ({source}): nothing to read again")
        try:
            loop = asyncio.get_running_loop()
            config = await loop.run_in_executor(None, _checked_config, source)
            config = replace(config, serve=config.serve.with_keys(self.extra_api_keys))
        except UsageError as exc:
            self._on_message(f"reload: {exc.cli_message()}; serving the config before it")
            raise
        said = [f"warning: {w}" for w in config.warnings]
        said += manager.reconfigure(config) or ["no change"]
        self.config = config
        if self._fronts is not None:
            self._fronts.reconfigure(config)
        for line in said:
            self._on_message(f"reload: {line}")
        return said

    # -- while it runs -------------------------------------------------------------------------
    def status(self) -> list[dict[str, object]]:
        """Every model's state (what ``GET /models/status`` answers)."""
        loop, manager = self._loop, self.manager
        if loop is None or manager is None:
            raise UsageError("the router is not running")

        async def read() -> list[dict[str, object]]:
            return [s.status(manager.clock()) for s in manager.slots.values()]

        return asyncio.run_coroutine_threadsafe(read(), loop).result()

    def __enter__(self) -> Router:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _count(slot: Any, replica: str, status: int, seconds: float) -> None:
    counters = slot.counters
    key = (replica, status)
    counters.requests[key] = counters.requests.get(key, 0) + 1
    counters.request_seconds += seconds


def _bound_port(site: Any, asked: int) -> int:
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or ()
    return int(sockets[0].getsockname()[1]) if sockets else asked


def _to_stderr(text: str) -> None:
    sys.stderr.write(f"xpulaunch: {text}\n")
    sys.stderr.flush()


def load_config(config: str | os.PathLike[str] | Mapping[str, Any] | RouterConfig) -> RouterConfig:
    """A ``models.toml`` path, its parsed document, or a :class:`RouterConfig`."""
    if isinstance(config, RouterConfig):
        return config
    if isinstance(config, Mapping):
        return parse_config(config, source="config")
    if not isinstance(config, str | os.PathLike):
        raise UsageError(
            "expected a models.toml path, its parsed document or a RouterConfig",
            option="config",
            value=config,
        )
    return read_config(config)


def _checked_config(path: str) -> RouterConfig:
    config = read_config(path)
    check_models(config)
    return config


def check_models(config: RouterConfig) -> None:
    """Every model file is there and readable: a typo is an error at start, not at the
    first request. The ids too, for a :class:`RouterConfig` made in Python."""
    from xpulaunch.llamacpp.prepare import check_model
    from xpulaunch.llamacpp.router.config import check_id

    for model in config.models:
        check_id(model.id, f"{config.source}: [models.{model.id}]")
        if model.model is not None:
            try:
                check_model(model.model)
            except XpulaunchError as exc:
                where = f"{config.source}: [models.{model.id}] model {model.model}"
                raise UsageError(f"{where}: {exc.detail}") from None


def check_engines(config: RouterConfig, env: Mapping[str, str]) -> None:
    """Every ``cmd`` engine's program, and every model's own ``binary``, can be run (on the
    model's PATH): checked once, when the router starts, so a typo is one line then, not a 502
    at the model's first request."""
    import shutil

    for model in config.models:
        key, program = ("cmd", model.cmd[0]) if model.cmd else ("binary", model.binary)
        if program is None:
            continue  # the router's --binary, checked as for `xpulaunch llama`
        path = {**env, **model.env}.get("PATH", os.defpath)
        if shutil.which(program, path=path) is None:
            where = "" if "/" in program else " on PATH"
            raise UsageError(
                f"{config.source}: [models.{model.id}] {key}: {program!r} is not an executable "
                f"program{where} (checked when the router starts)"
            )
