"""One model of the router: its state, its servers and lease while loaded, and its counters.
Only the router's event loop changes a slot."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xpulaunch.events import Event, Exited, GaveUp, Ready, Unhealthy
from xpulaunch.llamacpp.router.policy import ModelState, ModelView, next_replica
from xpulaunch.llamacpp.server import error_line

_GAVE_UP = "failed for good"

if TYPE_CHECKING:
    from xpulaunch.leases.manager import Lease
    from xpulaunch.llamacpp.plan import LlamaPlan, Replica
    from xpulaunch.llamacpp.prepare import Prepared
    from xpulaunch.llamacpp.router.config import ModelConfig
    from xpulaunch.llamacpp.server import LlamaServer
    from xpulaunch.model import Device


class RouteError(Exception):
    """A request that cannot be answered: ``status`` is its HTTP status, ``kind`` the
    OpenAI-style error type."""

    status = 503
    kind = "unavailable_error"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class NoRoom(RouteError):
    """The model cannot be placed: no free device, and no loaded model that may be evicted
    makes room."""


class Unavailable(RouteError):
    """The model is loaded but no replica answers now (restarting), or the router stops."""


class Busy(RouteError):
    """The model answers ``max_concurrency`` requests, and ``max_queue`` more wait."""

    status = 429
    kind = "rate_limit_error"


class LoadFailed(RouteError):
    """The model's server did not start (or failed for good)."""

    status = 502
    kind = "server_error"


@dataclass
class Counters:
    loads: int = 0
    load_failures: int = 0
    last_load_s: float | None = None
    unloads: dict[str, int] = field(default_factory=dict)
    requests: dict[tuple[str, int], int] = field(default_factory=dict)  # (replica, status)
    request_seconds: float = 0.0


class Slot:
    """A configured model and, while loaded, its :class:`LlamaServer` and lease."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        # A reload's news, applied once the model is idle: its new table, or its removal.
        self.next_config: ModelConfig | None = None
        self.removed = False
        self.retiring = False  # unloaded for that once the fronts stop routing it
        self.state = ModelState.UNLOADED
        self.in_flight = 0  # answered now, or waiting for the load
        self.last_used_s = 0.0
        self.loading: asyncio.Task[None] | None = None
        self.unloaded = asyncio.Event()
        self.unloaded.set()
        self.server: LlamaServer | None = None
        self.lease: Lease | None = None
        self.plan: LlamaPlan | None = None
        self.prepared: Prepared | None = None
        self.preparing: asyncio.Future[Prepared] | None = None
        self.settle: Callable[[Sequence[str]], None] | None = None
        # The devices it was placed on, as they were before it loaded (see with_readings).
        self.readings: dict[str, Device] = {}
        self.generation = 0  # each load's events carry it; older ones are ignored
        self.up: dict[str, bool] = {}
        self.down_reason: dict[str, str] = {}
        self.turn = 0
        self.last_error: str | None = None
        self.counters = Counters()
        # max_concurrency: requests past the limit, each told (its future done) when its turn
        # comes; ``seated`` is how many hold a turn now.
        self.seated = 0
        self.queue: deque[asyncio.Future[None]] = deque()
        self.loading_since: tuple[float, float] | None = None  # (clock, wall time)

    @property
    def id(self) -> str:
        return self.config.id

    def view(self) -> ModelView:
        c = self.config
        return ModelView(c.id, self.state, c.pinned, c.ttl_s, self.in_flight, self.last_used_s)

    @property
    def replicas(self) -> tuple[Replica, ...]:
        return self.server.replicas if self.server is not None else ()

    def pick(self) -> Replica:
        """The next replica that is up, round robin; :class:`Unavailable` when none is."""
        replicas = self.replicas
        index = next_replica([self.up.get(r.name, False) for r in replicas], self.turn)
        if index is None:
            why = "; ".join(f"replica {n}: {r}" for n, r in sorted(self.down_reason.items()))
            raise Unavailable(
                f"model {self.id}: no replica answers now ({why or 'restarting'}); it is being "
                "restarted, retry shortly",
                retry_after_s=1.0,
            )
        self.turn = index + 1
        return replicas[index]

    def replica_event(self, event: Event) -> bool:
        """Note what a replica's supervisor says; True when every replica failed for good."""
        if isinstance(event, Ready):
            self.up[event.name] = True
            self.down_reason.pop(event.name, None)
        elif isinstance(event, Exited) and not event.expected:
            how = f"killed by {event.signal}" if event.signal else f"exit code {event.exit_code}"
            why = error_line(event.stderr_tail, or_last=event.signal is None)
            self.up[event.name] = False
            self.down_reason[event.name] = f"llama-server {how}" + (f": {why}" if why else "")
        elif isinstance(event, Unhealthy):
            self.up[event.name] = False
            self.down_reason[event.name] = event.reason
        elif isinstance(event, GaveUp):
            for name in event.names:
                self.up[name] = False
                self.down_reason[name] = f"{_GAVE_UP}: {event.reason}"
            failed = [r for r in self.down_reason.values() if r.startswith(_GAVE_UP)]
            return len(failed) == len(self.up)
        return False

    async def take_turn(self) -> None:
        """Under ``max_concurrency``: a turn now, or a place in the model's bounded queue
        until a request ends and passes its turn on (:meth:`pass_turn`); beyond
        ``max_queue``, :class:`Busy`."""
        limit = self.config.max_concurrency
        if limit is None:
            return
        if self.seated < limit and not self.queue:
            self.seated += 1
            return
        if len(self.queue) >= self.config.max_queue:
            raise Busy(
                f"model {self.id} answers {limit} request(s) at once (max_concurrency), and "
                f"{len(self.queue)} wait (max_queue); retry shortly",
                retry_after_s=1.0,
            )
        turn = asyncio.get_running_loop().create_future()
        self.queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:  # the client left while it waited
            if turn.cancelled():
                self.queue.remove(turn)
            else:
                self.pass_turn()  # given the turn just as it left: the next one's
            raise

    def pass_turn(self) -> None:
        """A request ended: its turn goes to the first one waiting, else it is free."""
        if self.config.max_concurrency is None:
            return
        while self.queue:
            turn = self.queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.seated -= 1

    def set_loaded(self, server: LlamaServer) -> None:
        self.state = ModelState.READY
        self.loading_since = None
        self.up = {r.name: True for r in server.replicas}
        self.down_reason = {}

    def set_unloaded(self) -> None:
        self.state = ModelState.UNLOADED
        self.loading_since = None
        self.server, self.lease, self.plan, self.settle = None, None, None, None
        self.readings = {}
        self.up, self.down_reason = {}, {}
        self.generation += 1
        self.unloaded.set()

    def status(self, now_s: float) -> dict[str, object]:
        """What ``/models/status`` and ``xpulaunch llama serve --status`` show."""
        plan = self.plan
        devices = [u.label() for u in plan.plan.devices] if plan is not None else []
        idle = None
        if self.state is ModelState.READY and not self.in_flight:
            idle = now_s - self.last_used_s
        return {
            "id": self.id,
            "state": self.state.value,
            "aliases": list(self.config.aliases),
            "pinned": self.config.pinned,
            "ttl": self.config.ttl_s,
            "in_flight": self.in_flight,
            "idle_s": None if idle is None else round(idle, 1),
            "devices": devices,
            "replicas": [
                {
                    "name": r.name,
                    "url": r.url,
                    "up": self.up.get(r.name, False),
                    "reason": self.down_reason.get(r.name),
                }
                for r in self.replicas
            ],
            "estimate_bytes": (plan.estimate.on_devices(1) if plan and plan.estimate else None),
            "loads": self.counters.loads,
            "last_load_s": self.counters.last_load_s,
            "last_error": self.last_error,
            "engine": self.config.cmd[0] if self.config.cmd else "llama-server",
            "max_concurrency": self.config.max_concurrency,
            "queued": len(self.queue),
            **self._loading(now_s),
        }

    def _loading(self, now_s: float) -> dict[str, object]:
        """Since when it loads (None when it does not), in UTC and in seconds."""
        if self.loading_since is None:
            return {"loading_since": None, "loading_s": None}
        began, wall = self.loading_since
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))
        return {"loading_since": since, "loading_s": round(now_s - began, 1)}
