"""The router's HTTP front: OpenAI-compatible routes, forwarded by the request's ``model``.

aiohttp serves and forwards (no hand-made HTTP): the body is read once (at most
``max_body_bytes``), its ``model`` names the model (an id or an alias), and the request goes
as it came to one of that model's replicas. Answers stream back as they come, chunk by chunk,
so server-sent events (``"stream": true``) reach the client token by token. A client that goes
away cancels its handler (aiohttp's ``handler_cancellation``), which closes the upstream
connection; llama-server notices the closed connection and stops generating.

Every error is JSON in the shape llama-server and OpenAI use:
``{"error": {"message": ..., "type": ..., "code": STATUS}}``.

When the router stops (:meth:`Forwarder.drain`, :meth:`Forwarder.cut`), the answers being
relayed run on until the router's grace is over; a stream still running then gets an error
event and its proper end (the last chunk), as does one whose server is killed meanwhile, so a
client reads an error where it read a broken body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from aiohttp import web
from aiohttp.http import HttpProcessingError

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.router.gate import KEY_HEADERS
from xpulaunch.llamacpp.router.policy import ModelState
from xpulaunch.llamacpp.router.slot import LoadFailed, RouteError, Unavailable

if TYPE_CHECKING:
    from xpulaunch.llamacpp.plan import Replica
    from xpulaunch.llamacpp.router.config import RouterConfig
    from xpulaunch.llamacpp.router.models import ModelManager
    from xpulaunch.llamacpp.router.slot import Slot

# POST routes of llama-server (tools/server/README.md) whose JSON body names the model.
PROXIED = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/completion",
    "/completions",
    "/embedding",
    "/embeddings",
    "/rerank",
    "/reranking",
    "/infill",
    "/tokenize",
    "/detokenize",
    "/apply-template",
)
# RFC 9110 7.6.1 hop-by-hop fields, and those aiohttp sets itself.
NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "server",
        "date",
    }
)
# A request's body is read decoded (aiohttp undoes its Content-Encoding), and sent on so.
NOT_FORWARDED_UP = NOT_FORWARDED | {"content-encoding"}
_EVENT_STREAM = "text/event-stream"
SHOWN_ERROR_CHARS = 500  # of a refusal that is not JSON, in the error event
# A streamed request whose model is not ready yet: its stream begins after NOTE_AFTER_S, with
# a comment line every NOTE_EVERY_S (see Forwarder._answer_after_wait).
NOTE_AFTER_S = 0.5
NOTE_EVERY_S = 1.0
SHOWN_NAME_CHARS = 100  # of a name no model has, in its 404 (a 2 MB name got a 2 MB answer)
_KINDS = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    status: int, message: str, kind: str | None = None, *, retry_after_s: float | None = None
) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": kind or _KINDS.get(status, "server_error"),
            "code": status,
        }
    }
    headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s else None
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A :class:`RouteError` a handler raises, and aiohttp's own errors (unknown path, wrong
    method, body too large, a body it cannot decode), as JSON."""
    try:
        return await handler(request)
    except RouteError as exc:
        return error_response(exc.status, exc.message, exc.kind, retry_after_s=exc.retry_after_s)
    except web.RequestPayloadError as exc:
        # Its cause says what: a body not in the Content-Encoding it names, or one cut short.
        why = getattr(exc.__cause__, "message", None) or str(exc)
        return error_response(400, f"the request body cannot be read: {why}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text or exc.reason
        if exc.status == 404:
            message = f"no route {request.method} {request.path}; see GET /v1/models"
        elif exc.status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        return error_response(exc.status, message)


class _Said(logging.Handler):
    """Each record through ``say``: a client's mistake as one line, anything else whole."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__()
        self._say = say

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, web.RequestPayloadError):
            error = error.__cause__ or error  # what aiohttp could not decode, and why
        if not isinstance(error, HttpProcessingError | web.RequestPayloadError):
            self._say(self.format(record))
            return
        why = error.message if isinstance(error, HttpProcessingError) else str(error)
        self._say(f"{record.getMessage()}: {why.strip().splitlines()[0].rstrip(':')}")


def server_logger(say: Callable[[str], None]) -> logging.Logger:
    """aiohttp's server logger for an app's connections (``AppRunner(logger=...)``), through
    ``say``: a request a client got wrong (malformed HTTP, a body that cannot be decoded), which
    aiohttp has answered 400, is one line, not a traceback; anything else keeps its traceback."""
    logger = logging.Logger("xpulaunch.router.http", logging.WARNING)  # no global registry
    logger.addHandler(_Said(say))
    return logger


class Models(Protocol):
    """What forwarding needs of the models: the router's :class:`ModelManager`, or in a front
    process (:mod:`~xpulaunch.llamacpp.router.fronts`) the manager's answers over a pipe."""

    @property
    def config(self) -> RouterConfig: ...
    @property
    def slots(self) -> Mapping[str, Slot]: ...
    async def acquire(self, slot: Slot) -> Replica: ...
    def release(self, slot: Slot) -> None: ...


class Forwarder:
    """Forwards a request to a replica of the model it names, and its answer back."""

    def __init__(
        self,
        models: Models,
        *,
        max_body_bytes: int,
        on_request: Callable[[Slot, str, int, float], None],
        via: str = "xpulaunch",
    ) -> None:
        """``via``: this process's name in each answer's ``Via`` header (RFC 9110 7.6.3):
        ``xpulaunch``, or ``xpulaunch-frontN`` for a front process."""
        self.models = models
        self._via = f"1.1 {via}"
        self._on_request = on_request
        self._max_body_bytes = max_body_bytes
        self.session: aiohttp.ClientSession | None = None
        self._upstreams: set[aiohttp.ClientResponse] = set()  # answers being relayed now
        self.stopping = False  # a stream cut from now on still gets its proper end

    def drain(self) -> None:
        """The router stops: answers being relayed go on; one that breaks from now on (its
        server stopped) gets its proper end after the error event."""
        self.stopping = True

    def cut(self, why: str) -> int:
        """End every answer being relayed now (its reads fail with ``why``, and a stream gets
        an error event and its proper end); how many there were."""
        self.stopping = True
        for upstream in self._upstreams:
            upstream.content.set_exception(_Cut(why))
        return len(self._upstreams)

    def make_app(self, routes: Sequence[web.RouteDef] = ()) -> web.Application:
        """Forwarding on :data:`PROXIED`, and ``routes``; the client session lives as long."""
        from xpulaunch.llamacpp.router import gate

        serve = self.models.config.serve
        app = web.Application(
            client_max_size=self._max_body_bytes,
            middlewares=[*gate.middlewares(serve), json_errors],
        )
        gate.install(app, serve)
        app.add_routes(
            [
                *(web.post(path, self.forward) for path in PROXIED),
                web.route("*", "/upstream/{tail:.*}", self.upstream),
                *routes,
            ]
        )
        app.cleanup_ctx.append(self._client)
        return app

    async def _client(self, app: web.Application) -> AsyncIterator[None]:
        # No pool limit (llama-server queues requests in its slots itself); no total timeout
        # (a long generation is not a failure); answers pass through undecoded. An idle
        # connection is dropped well before llama-server's own keep-alive ends (cpp-httplib's
        # "Keep-Alive: timeout=5"), so a request never races the server closing it.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=2.0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        yield
        await self.session.close()

    # -- the model a request names -----------------------------------------------------------
    def _slot(self, name: object) -> Slot:
        config = self.models.config
        if not isinstance(name, str) or not name:
            raise web.HTTPBadRequest(
                text='the request needs a "model" field naming one of: ' + ", ".join(config.ids)
            )
        found = config.resolve(name)
        if found is None:
            shown = repr(name[:SHOWN_NAME_CHARS]) + ("…" if len(name) > SHOWN_NAME_CHARS else "")
            raise _NotServed(f"model {shown} is not served here; models: " + ", ".join(config.ids))
        return self.models.slots[found.id]

    async def _body_model(self, request: web.Request) -> tuple[bytes, Slot, bool]:
        """The body, the model it names, and whether it asks for a streamed answer."""
        body = await request.read()
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise web.HTTPBadRequest(text=f"the request body is not valid JSON ({exc})") from None
        except RecursionError:
            raise web.HTTPBadRequest(text="the request body is JSON nested too deeply") from None
        if not isinstance(payload, dict):
            raise web.HTTPBadRequest(text="the request body must be a JSON object")
        return body, self._slot(payload.get("model")), payload.get("stream") is True

    # -- forwarding --------------------------------------------------------------------------
    async def forward(self, request: web.Request) -> web.StreamResponse:
        body, slot, streamed = await self._body_model(request)
        return await self._answer(request, slot, body, streamed, request.path_qs)

    async def upstream(self, request: web.Request) -> web.StreamResponse:
        """``/upstream/MODEL/PATH``: any request, to PATH of the model's server (loading it
        first), e.g. llama-server's web UI at ``/upstream/MODEL/``."""
        tail = request.match_info["tail"]
        slot, rest = self._upstream_target(tail)
        if rest is None:  # the page's relative links need the slash
            query = f"?{request.query_string}" if request.query_string else ""
            raise web.HTTPPermanentRedirect(location=f"/upstream/{tail}/{query}")
        body = await request.read()
        path = rest + (f"?{request.query_string}" if request.query_string else "")
        return await self._answer(request, slot, body, _asks_stream(body), path)

    def _upstream_target(self, tail: str) -> tuple[Slot, str | None]:
        """The model a ``/upstream/`` path names (its id may hold slashes: the longest that
        names one wins), and the path after it (None: nothing after it, not even a slash)."""
        parts = tail.split("/")
        for end in range(len(parts), 0, -1):
            found = self.models.config.resolve("/".join(parts[:end]))
            if found is not None:
                rest = "/" + "/".join(parts[end:]) if end < len(parts) else None
                return self.models.slots[found.id], rest
        return self._slot(parts[0]), None  # the 404 naming the models

    async def _answer(
        self, request: web.Request, slot: Slot, body: bytes, streamed: bool, path: str
    ) -> web.StreamResponse:
        began = time.monotonic()
        if streamed and not _ready_now(slot):
            return await self._answer_after_wait(request, slot, body, path, began)
        try:
            replica = await self.models.acquire(slot)
        except RouteError as exc:
            self._on_request(slot, "", exc.status, time.monotonic() - began)
            return error_response(
                exc.status, exc.message, exc.kind, retry_after_s=exc.retry_after_s
            )
        except asyncio.CancelledError:  # the client left while the model loaded
            self._on_request(slot, "", 499, time.monotonic() - began)
            raise
        return await self._relayed(request, slot, replica, body, streamed, path=path, began=began)

    async def _relayed(
        self,
        request: web.Request,
        slot: Slot,
        replica: Replica,
        body: bytes,
        streamed: bool,
        *,
        path: str,
        began: float,
        into: web.StreamResponse | None = None,
    ) -> web.StreamResponse:
        """Send to ``replica`` and relay its answer (into ``into``, a stream already begun),
        then release the model and count the request."""
        status = 499  # nginx's "client closed request": what a cancelled handler counts as
        try:
            response = await self._send(
                request, slot, replica, body, streamed, path=path, into=into
            )
            status = response.status
            return response
        except RouteError as exc:
            status = exc.status
            if into is not None:
                await _error_event(into, exc)
                return into
            return error_response(exc.status, exc.message, exc.kind)
        finally:
            self.models.release(slot)
            self._on_request(slot, replica.name, status, time.monotonic() - began)

    async def _answer_after_wait(
        self, request: web.Request, slot: Slot, body: bytes, path: str, began: float
    ) -> web.StreamResponse:
        """A streamed request whose model is not ready (loading, or every turn taken): after
        :data:`NOTE_AFTER_S` the stream begins, with an SSE comment line every
        :data:`NOTE_EVERY_S` (``: loading MODEL, 12 s``; OpenAI clients skip comments) until
        the model takes the request; then its answer follows in the same stream (an error as
        an error event). A client then sees progress, not dead air, and no read timeout."""
        acquiring = asyncio.ensure_future(self.models.acquire(slot))
        response: web.StreamResponse | None = None
        try:
            await asyncio.wait([acquiring], timeout=NOTE_AFTER_S)
            if not acquiring.done():
                response = web.StreamResponse(status=200, headers=self._stream_headers())
                await response.prepare(request)
            while not acquiring.done():
                assert response is not None
                what = "waiting for a turn of" if slot.state is ModelState.READY else "loading"
                note = f": {what} {slot.id}, {time.monotonic() - began:.0f} s\n\n"
                await response.write(note.encode())
                await asyncio.wait([acquiring], timeout=NOTE_EVERY_S)
        except BaseException:  # the client left (cancelled, or its connection reset)
            self._abandon(slot, acquiring)
            self._on_request(slot, "", 499, time.monotonic() - began)
            raise
        try:
            replica = acquiring.result()
        except RouteError as exc:
            self._on_request(slot, "", exc.status, time.monotonic() - began)
            if response is None:
                return error_response(
                    exc.status, exc.message, exc.kind, retry_after_s=exc.retry_after_s
                )
            await _error_event(response, exc)
            return response
        return await self._relayed(
            request, slot, replica, body, True, path=path, began=began, into=response
        )

    def _abandon(self, slot: Slot, acquiring: asyncio.Future[Replica]) -> None:
        """The request is gone: stop waiting for the model, or give back what it got."""
        if not acquiring.done():
            acquiring.cancel()  # acquire() releases what it took
        elif not acquiring.cancelled() and acquiring.exception() is None:
            self.models.release(slot)

    def _stream_headers(self) -> dict[str, str]:
        # X-Accel-Buffering: nginx in front would otherwise hold the notes back.
        return {
            "Content-Type": _EVENT_STREAM,
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            "Via": self._via,
        }

    async def _send(
        self,
        request: web.Request,
        slot: Slot,
        replica: Replica,
        body: bytes,
        streamed: bool,
        *,
        path: str,
        into: web.StreamResponse | None = None,
    ) -> web.StreamResponse:
        assert self.session is not None  # opened at startup
        hidden = NOT_FORWARDED_UP
        if self.models.config.serve.api_keys:  # the router's key: no model's server sees it
            hidden = NOT_FORWARDED_UP | set(KEY_HEADERS)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hidden}
        if streamed:
            # llama-server closes its connection after a streamed answer although it says
            # keep-alive (cpp-httplib), and aiohttp would pool it again at the answer's end:
            # the next request would then meet a closed connection. Asked to close, neither
            # side keeps it.
            headers["Connection"] = "close"
        url = replica.url + path
        try:
            upstream = await self.session.request(request.method, url, data=body, headers=headers)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if self.stopping:  # its server was stopped before it began to answer
                raise Unavailable("the router is stopping; retry on its next start") from None
            raise LoadFailed(
                f"model {slot.id}: llama-server replica {replica.name} ({replica.url}) did not "
                f"answer ({type(exc).__name__}: {exc}); it may be restarting, retry shortly"
            ) from None
        whole = False
        self._upstreams.add(upstream)
        try:
            response = await self._relay(request, slot, replica, upstream, into)
            whole = True
            return response
        finally:
            self._upstreams.discard(upstream)
            # A whole answer frees the connection for the next request (unless it was asked to
            # close); anything else (the client left, the server broke) must close it, which
            # ends llama-server's task.
            upstream.release() if whole else upstream.close()

    async def _relay(
        self,
        request: web.Request,
        slot: Slot,
        replica: Replica,
        upstream: aiohttp.ClientResponse,
        into: web.StreamResponse | None = None,
    ) -> web.StreamResponse:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_FORWARDED}
        headers["Via"] = self._via
        streamed = upstream.content_type == _EVENT_STREAM or upstream.content_length is None
        if into is not None and (upstream.status != 200 or upstream.content_type != _EVENT_STREAM):
            return await self._refusal_into(into, slot, replica, upstream)
        if not streamed:
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise _broken(slot, replica, exc) from None
            return web.Response(status=upstream.status, body=data, headers=headers)
        response = into
        if response is None:
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                error = _broken(slot, replica, exc)
                await _tell_stream(request, response, upstream, error, end=self.stopping)
                return response
            if not chunk:
                break
            await response.write(chunk)  # the client gone: ConnectionResetError, then cancel
        await response.write_eof()
        return response

    async def _refusal_into(
        self,
        into: web.StreamResponse,
        slot: Slot,
        replica: Replica,
        upstream: aiohttp.ClientResponse,
    ) -> web.StreamResponse:
        """The server refused a request whose stream had begun (its status is sent): its
        error as an error event (its own message when it gave one)."""
        try:
            data = await upstream.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _broken(slot, replica, exc) from None
        message = data.decode(errors="replace")[:SHOWN_ERROR_CHARS]
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            message = str(json.loads(data)["error"]["message"])
        error = RouteError(f"model {slot.id}: {message}")
        error.status, error.kind = upstream.status, _KINDS.get(upstream.status, "server_error")
        await _error_event(into, error)
        return into


class Proxy(Forwarder):
    """The aiohttp application of one router: forwarding, and the router's own routes."""

    def __init__(
        self,
        manager: ModelManager,
        *,
        max_body_bytes: int,
        metrics: Callable[[], Awaitable[str]],
        on_request: Callable[[Slot, str, int, float], None],
        reload: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        super().__init__(manager, max_body_bytes=max_body_bytes, on_request=on_request)
        self.manager = manager
        self._metrics = metrics
        self._reload = reload
        self.started_s = int(time.time())

    def app(self) -> web.Application:
        return self.make_app(
            [
                web.get("/health", self.health),
                web.get("/v1/models", self.models_list),
                web.get("/v1/models/{model:.+}", self.one_model),
                web.get("/metrics", self.metrics),
                web.get("/models/status", self.status),
                web.post("/models/load", self.load),
                web.post("/models/unload", self.unload),
                web.post("/models/reload", self.reload),
            ]
        )

    # -- the router's own routes -------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _model_object(self, slot: Slot) -> dict[str, Any]:
        return {
            "id": slot.id,
            "object": "model",
            "created": self.started_s,
            "owned_by": "xpulaunch",
            "aliases": list(slot.config.aliases),
            "status": {"value": slot.state.value},
        }

    async def models_list(self, request: web.Request) -> web.Response:
        # An unlisted model is served when named, but not listed (llama-swap's unlisted).
        slots = self.manager.slots.values()
        data = [self._model_object(s) for s in slots if not s.config.unlisted]
        return web.json_response({"object": "list", "data": data})

    async def one_model(self, request: web.Request) -> web.Response:
        return web.json_response(self._model_object(self._slot(request.match_info["model"])))

    async def metrics(self, request: web.Request) -> web.Response:
        text = await self._metrics()
        return web.Response(
            text=text,
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def status(self, request: web.Request) -> web.Response:
        now = self.manager.clock()
        models = [s.status(now) for s in self.manager.slots.values()]
        return web.json_response({"models": models})

    async def load(self, request: web.Request) -> web.Response:
        _, slot, _ = await self._body_model(request)
        await self.manager.acquire(slot)
        self.manager.release(slot)
        return web.json_response(slot.status(self.manager.clock()))

    async def unload(self, request: web.Request) -> web.Response:
        _, slot, _ = await self._body_model(request)
        if not await self.manager.unload(slot):
            return error_response(
                409,
                f"model {slot.id} has {slot.in_flight} request(s) in flight; unload it "
                "once they are answered",
                "conflict_error",
            )
        return web.json_response({"id": slot.id, "state": slot.state.value})

    async def reload(self, request: web.Request) -> web.Response:
        """Read the config file again (as SIGHUP does): what changed, or why it did not."""
        if self._reload is None:
            return error_response(404, "this router cannot reload its config")
        try:
            said = await self._reload()
        except UsageError as exc:
            return error_response(400, exc.cli_message(), "invalid_request_error")
        return web.json_response({"changes": said})


def _ready_now(slot: Slot) -> bool:
    """Whether a request for the model is sent on at once (in a front, whose slots are
    copies, never known: the router's answer over the pipe says)."""
    limit = slot.config.max_concurrency
    full = limit is not None and (slot.seated >= limit or bool(slot.queue))
    return slot.state is ModelState.READY and not full


def _asks_stream(body: bytes) -> bool:
    """Whether a passthrough body asks for a streamed answer (any other body: no)."""
    if not body.startswith(b"{"):
        return False
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(payload, dict) and payload.get("stream") is True


async def _error_event(response: web.StreamResponse, error: RouteError) -> None:
    """An error event and the stream's end, for a stream whose status is sent already."""
    event = {"error": {"message": error.message, "type": error.kind, "code": error.status}}
    with contextlib.suppress(ConnectionResetError):  # the client is gone too
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write_eof()


class _NotServed(RouteError):
    """A request refused before any model is touched: it names no model of this router."""

    status = 404
    kind = "model_not_found"


class _Cut(aiohttp.ClientError):
    """What reading an answer raises once :meth:`Forwarder.cut` ended it."""


def _broken(slot: Slot, replica: Replica, exc: BaseException) -> RouteError:
    if isinstance(exc, _Cut):
        return Unavailable(f"model {slot.id}: {exc}")
    return LoadFailed(
        f"model {slot.id}: llama-server replica {replica.name} closed the connection while "
        f"answering ({type(exc).__name__}); it crashed or was stopped"
    )


async def _tell_stream(
    request: web.Request,
    response: web.StreamResponse,
    upstream: aiohttp.ClientResponse,
    error: RouteError,
    *,
    end: bool,
) -> None:
    """The server broke mid-answer: the status is sent already, so an event stream gets an
    error event. With ``end`` (the router stops: the break is ours) an event stream then gets
    its proper end, which a client reads as a complete answer that ends in an error; anything
    else ends without it (the connection is closed), so a client sees the answer cut."""
    if upstream.content_type == _EVENT_STREAM:
        event = {"error": {"message": error.message, "type": error.kind, "code": error.status}}
        try:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            if end:
                await response.write_eof()
                return
        except ConnectionResetError:
            return  # the client is gone too
    if request.transport is not None:
        request.transport.close()
