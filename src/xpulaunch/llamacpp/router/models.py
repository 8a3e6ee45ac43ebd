"""Loading models on demand and unloading them: the router's side of each model's
:class:`~xpulaunch.llamacpp.server.LlamaServer`.

All state lives on the router's event loop (one owner); what blocks (asking the binary,
starting and stopping servers, taking the lease lock) runs on worker threads and is awaited.

A load: prepare the model once (the build, ``--fit``, the estimate), then under the placement
lock plan it with the devices leased by others excluded; when it does not fit, evict idle
models of this router (:func:`~.policy.choose_evictions`) and plan again; when only models of
this router that are busy (or loading) keep it out, wait a while (``Setup.room_wait_s``) for
one of them to become idle; lease the plan's devices like any launch; then start the servers
under the Supervisor and wait for ``/health``. Every request that arrives meanwhile waits for
the same load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from xpulaunch.errors import DeviceBusyError, SelectionError, XpulaunchError
from xpulaunch.events import Event
from xpulaunch.llamacpp.router.events import (
    ModelLoaded,
    ModelLoadFailed,
    ModelLoading,
    ModelUnloaded,
)
from xpulaunch.llamacpp.router.groups import must_unload
from xpulaunch.llamacpp.router.policy import (
    ModelState,
    Outcome,
    choose_evictions,
    eviction_order,
    expired,
    next_expiry,
    no_room,
    with_readings,
)
from xpulaunch.llamacpp.router.setup import (
    Setup,
    model_env,
    packed,
    placement_env,
    prepare_model,
)
from xpulaunch.llamacpp.router.slot import LoadFailed, NoRoom, RouteError, Slot, Unavailable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from xpulaunch.leases.manager import Lease, LeaseView
    from xpulaunch.llamacpp.plan import LlamaPlan, Replica
    from xpulaunch.llamacpp.prepare import Prepared
    from xpulaunch.llamacpp.router.config import RouterConfig
    from xpulaunch.llamacpp.server import LlamaServer
    from xpulaunch.model import Device

T = TypeVar("T")
PLACE_TRIES = 8  # other jobs may take a device between our look and our lock
ACQUIRE_TRIES = 8  # a model unloaded again while a request waited for it


class ModelManager:
    """The models of one router (call every method on its event loop)."""

    def __init__(
        self,
        config: RouterConfig,
        setup: Setup,
        *,
        on_event: Callable[[Event, str | None], None],
        on_message: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from xpulaunch.leases.manager import LeaseManager

        self.config, self.setup = config, setup
        self.slots = {m.id: Slot(m) for m in config.models}
        self._emit, self._say, self.clock = on_event, on_message, clock
        self._leases = LeaseManager(setup.lock_dir)
        self._inventory = setup.inventory
        self._place_lock = asyncio.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=4 + 2 * len(self.slots), thread_name_prefix="xpulaunch-router"
        )
        self._wake = asyncio.Event()
        self._waiters: set[asyncio.Future[None]] = set()  # told when a model may have gone idle
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closing = False
        # Front processes route a loaded model's requests by their own copy of its replicas
        # (fronts.py): ``published`` tells them of a change, and ``withdraw`` has them stop
        # routing models, returning once each has, before those are unloaded.
        self.published: Callable[[Slot], None] = lambda slot: None
        self.withdraw: Callable[[Sequence[Slot]], Awaitable[None]] = _no_fronts

    async def _blocking(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            if not isinstance(error, LoadFailed | NoRoom | Unavailable):
                self._say(f"router task failed: {error!r}")

    # -- requests --------------------------------------------------------------------------
    async def acquire(self, slot: Slot) -> Replica:
        """A replica of ``slot`` to send one request to, loading the model first when needed.
        The request counts as in flight from here until :meth:`release`; with the model's
        ``max_concurrency``, it first waits for its turn (:meth:`Slot.take_turn`)."""
        await slot.take_turn()
        slot.in_flight += 1
        try:
            for _ in range(ACQUIRE_TRIES):
                if self.closing:
                    raise Unavailable("the router is stopping")
                if slot.state is ModelState.READY:
                    slot.last_used_s = self.clock()
                    return slot.pick()
                if slot.state is ModelState.UNLOADED:
                    self.start_load(slot)
                if slot.state is ModelState.LOADING and slot.loading is not None:
                    await asyncio.shield(slot.loading)
                elif slot.state is ModelState.UNLOADING:
                    await slot.unloaded.wait()
            raise Unavailable(f"model {slot.id} was unloaded again while this request waited")
        except BaseException:
            self.release(slot)
            raise

    def use(self, slot: Slot) -> None:
        """A front process sent a request to a replica of its copy of the model's routes: in
        flight until :meth:`release`, as after :meth:`acquire`."""
        slot.in_flight += 1
        slot.last_used_s = self.clock()

    def release(self, slot: Slot) -> None:
        slot.in_flight -= 1
        slot.pass_turn()
        slot.last_used_s = self.clock()
        self._retire_if_idle(slot)
        self._wake.set()
        if not slot.in_flight:
            self._changed()

    def preload(self) -> None:
        """Load the models with ``preload = true`` now (a failure is said, as at a request)."""
        for slot in self.slots.values():
            if slot.config.preload and slot.state is ModelState.UNLOADED:
                self.start_load(slot)

    # -- loading ---------------------------------------------------------------------------
    def start_load(self, slot: Slot) -> asyncio.Task[Any]:
        if slot.state is ModelState.UNLOADED:
            slot.state = ModelState.LOADING
            slot.loading_since = (self.clock(), time.time())
            slot.unloaded.clear()
            slot.loading = self._spawn(self._load(slot))
        if slot.loading is None:
            raise Unavailable(f"model {slot.id} is {slot.state.value}")
        return slot.loading

    async def _load(self, slot: Slot) -> None:
        began = self.clock()
        try:
            prepared = await self._prepare(slot)
            plan, lease, evicted = await self._place(slot, prepared)
        except (XpulaunchError, NoRoom) as exc:
            raise self._failed(slot, exc) from exc
        except BaseException:
            slot.set_unloaded()  # nothing was leased: only the state is to undo
            raise
        if self.closing:
            lease.release()
            slot.set_unloaded()
            raise Unavailable("the router is stopping")
        labels = tuple(u.label() for u in plan.plan.devices)
        self._emit(ModelLoading(self.clock(), slot.id, labels, evicted), None)
        where = ", ".join(labels) or "the CPU"
        self._say(
            f"loading model {slot.id} on {where}"
            + (f" (evicted {', '.join(evicted)})" if evicted else "")
        )
        server = self._server(slot, plan, lease)
        try:
            await self._blocking(server.start)
        except XpulaunchError as exc:
            await self._blocking(server.stop)
            lease.release()
            raise self._failed(slot, exc) from exc
        except BaseException:
            # Anything else (a bug, a cancelled task): no server, no lease, no model stuck
            # loading; the error goes on to whoever waits.
            server.stop(0)
            lease.release()
            slot.set_unloaded()
            raise
        if self.closing:
            await self._unload(slot, "stop")
            raise Unavailable("the router is stopping")
        slot.set_loaded(server)
        self.published(slot)
        self._retire_if_idle(slot)  # a reload while it loaded
        took = self.clock() - began
        slot.counters.loads += 1
        slot.counters.last_load_s = took
        slot.last_used_s = self.clock()
        self._emit(ModelLoaded(self.clock(), slot.id, server.urls, took), None)
        self._say(f"model {slot.id} ready in {took:.1f} s at {', '.join(server.urls)}")
        self._wake.set()
        self._changed()

    def _failed(self, slot: Slot, exc: XpulaunchError | NoRoom) -> RouteError:
        """Note a load that failed; the error for the requests that wait for it."""
        why = f"model {slot.id} could not be loaded: {exc}"
        error = LoadFailed(why) if isinstance(exc, XpulaunchError) else exc
        slot.last_error = error.message
        slot.counters.load_failures += 1
        slot.set_unloaded()
        self._changed()
        self._emit(ModelLoadFailed(self.clock(), slot.id, slot.last_error), None)
        self._say(slot.last_error)
        return error

    async def _prepare(self, slot: Slot) -> Prepared:
        """The build, --fit and the estimate: asked once per model (a failure is asked
        again at the next load)."""
        if slot.prepared is not None:
            return slot.prepared
        if slot.preparing is None:
            model, setup = slot.config, self.setup
            slot.preparing = asyncio.ensure_future(
                self._blocking(lambda: prepare_model(model, setup))
            )
        try:
            slot.prepared = await asyncio.shield(slot.preparing)
        finally:
            if slot.preparing.done() and slot.prepared is None:
                slot.preparing = None
        return slot.prepared

    def warm_up(self) -> None:
        """Prepare every model now, in the background: asking a GPU build and measuring a
        model take seconds, which the first request of each model then does not wait for."""

        async def prepare(slot: Slot) -> None:
            try:
                await self._prepare(slot)
            except XpulaunchError as exc:
                self._say(f"model {slot.id}: {exc.message} (asked again at its first request)")

        for slot in self.slots.values():
            self._spawn(prepare(slot))

    async def _place(
        self, slot: Slot, prepared: Prepared
    ) -> tuple[LlamaPlan, Lease, tuple[str, ...]]:
        """Plan and lease (:meth:`_place_now`); when busy models of ours keep it out, try
        again each time one of them may have become idle, for ``room_wait_s``: most requests
        end within seconds, and a 503 at once sent the client away for nothing."""
        deadline = self.clock() + self.setup.room_wait_s
        while True:
            changed = asyncio.get_running_loop().create_future()
            self._waiters.add(changed)  # before the look: a change during it is not missed
            try:
                return await self._place_now(slot, prepared)
            except NoRoom:
                left = deadline - self.clock()
                if self.closing:
                    raise Unavailable("the router is stopping") from None
                if left <= 0 or not self._may_make_room(slot):
                    raise
                await asyncio.wait([changed], timeout=left)
            finally:
                self._waiters.discard(changed)

    def _may_make_room(self, slot: Slot) -> bool:
        """Whether a model of ours that may not be evicted now may be later: one with
        requests in flight, or loading or unloading (never a pinned one)."""
        busy = (ModelState.LOADING, ModelState.UNLOADING)
        return any(
            other is not slot
            and not other.config.pinned
            and (other.state in busy or (other.state is ModelState.READY and other.in_flight))
            for other in self.slots.values()
        )

    def _changed(self) -> None:
        """A model became idle, loaded, failed or unloaded: loads waiting for room look again
        (and a router that stops, for its last requests)."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _place_now(
        self, slot: Slot, prepared: Prepared
    ) -> tuple[LlamaPlan, Lease, tuple[str, ...]]:
        """Plan and lease, evicting idle models of ours when that makes room."""
        evicted: list[str] = []
        async with self._place_lock:
            for _ in range(PLACE_TRIES):
                swapped = self._swapped_out(slot)
                if swapped:  # one that got a request meanwhile stays: the next look sees it
                    evicted += await self._unload_all(swapped, "swapped", by=slot.id)
                    continue
                await self._look()
                wanted = packed(slot.config, prepared, self._inventory, self.setup.parent_env)
                leases = await self._blocking(self._leases.view)
                evict = self._evictions(slot, wanted, leases)
                if evict:
                    evicted += await self._unload_all(evict, "evicted", by=slot.id)
                    continue
                try:
                    lease_it = partial(self._lease, slot, wanted, self._wanted(leases))
                    plan, lease = await self._blocking(lease_it)
                except (SelectionError, DeviceBusyError):
                    continue  # another job took a device meanwhile: look again
                return plan, lease, tuple(evicted)
        raise NoRoom(f"model {slot.id}: devices kept being taken by other jobs; try again")

    async def _unload_all(self, ids: tuple[str, ...], reason: str, *, by: str) -> list[str]:
        """Unload those of ``ids`` that are still idle (:meth:`_claim`); the ones unloaded."""
        claimed = await self._claim([self.slots[v] for v in ids])
        await asyncio.gather(*(self._unload(v, reason, by=by) for v in claimed))
        return [v.id for v in claimed]

    def _swapped_out(self, slot: Slot) -> tuple[str, ...]:
        """The idle models its group's rules unload before it loads (:mod:`.groups`);
        :class:`NoRoom` while one of them has requests in flight or loads."""
        live = (ModelState.READY, ModelState.LOADING)
        loaded = [s.id for s in self.slots.values() if s.state in live and s is not slot]
        victims = tuple(must_unload(slot.id, self.config.groups, loaded))
        for victim in victims:
            other = self.slots[victim]
            if other.in_flight or other.state is ModelState.LOADING:
                raise NoRoom(
                    f"model {slot.id} waits for {victim} to finish its requests: their groups "
                    "do not let both stay loaded"
                )
        return victims

    def _evictions(self, slot: Slot, prepared: Prepared, leases: LeaseView) -> tuple[str, ...]:
        """Which of our idle models to evict now (on the loop: no request changes them while
        this runs); raises :class:`NoRoom` with the reason when none makes room. A model
        packed beside others needs only its share of a device: none is evicted while the
        device's memory holds it too."""
        job_of = {s.id: s.lease.job_id for s in self.slots.values() if s.lease is not None}
        share = prepared.request.share
        errors: list[str] = []

        avoid = self._wanted(leases)

        def attempt(evicted: frozenset[str]) -> Outcome:
            gone = {job_of[model] for model in evicted if model in job_of}
            left = {**leases.unavailable(share, ignoring=gone), **avoid}
            try:
                planned = self._plan(slot, prepared, left)
            except (SelectionError, DeviceBusyError) as exc:
                errors.append(exc.message)
                return Outcome.NONE
            return Outcome.PARTIAL if planned.fits is False else Outcome.FITS

        views = [s.view() for s in self.slots.values()]
        order = eviction_order(views, self.clock(), exclude=slot.id)
        chosen = choose_evictions(attempt, order)
        if chosen is None:
            reason = errors[0] if errors else "no free device"
            raise NoRoom(no_room(slot.id, reason, views))
        return chosen

    def _plan(self, slot: Slot, prepared: Prepared, unavailable: Mapping[str, str]) -> LlamaPlan:
        from xpulaunch.llamacpp.prepare import plan_prepared

        env = placement_env(slot.config, self.setup)
        return plan_prepared(prepared, self._inventory, env, unavailable=unavailable)

    async def _look(self) -> None:
        """A fresh probe (when the router probes), with the devices of our own loaded models
        as they were before those loaded."""
        fresh = self.setup.inventory
        if self.setup.reprobe:
            from xpulaunch.errors import InventoryError
            from xpulaunch.probing.isolated import probe_in_child

            try:
                fresh = await self._blocking(lambda: probe_in_child(self.setup.parent_env))
            except InventoryError as exc:
                self._say(f"probing the devices again failed, planning with the last look: {exc}")
                fresh = self._inventory
        # A device several of our models share: as it was before the first of them loaded
        # (the most memory free); their shares are counted by their leases.
        readings: dict[str, Device] = {}
        for s in self.slots.values():
            for key, device in s.readings.items():
                seen = readings.get(key)
                if seen is None or (device.memory_free_bytes or 0) > (seen.memory_free_bytes or 0):
                    readings[key] = device
        self._inventory = with_readings(fresh, readings)

    def _lease(
        self, slot: Slot, prepared: Prepared, avoid: Mapping[str, str]
    ) -> tuple[LlamaPlan, Lease]:
        from xpulaunch.llamacpp.launch import lease_plan

        command = ["xpulaunch", "llama", "serve", slot.id]
        env = placement_env(slot.config, self.setup)  # gpus, and a mask its env pins
        return lease_plan(
            prepared, self._inventory, env, self._leases, command=command, avoid=avoid
        )

    def _wanted(self, leases: LeaseView) -> dict[str, str]:
        """The units launches waiting in line want: no model goes there meanwhile."""
        return leases.wanted() if self.setup.yield_to_jobs else {}

    async def watch_jobs(self) -> None:
        """Serving yields to training: every ``yield_interval_s``, unload the idle, unpinned
        models that alone keep a launch waiting in line from the GPUs it wants (it starts at
        its next look; the models load elsewhere, or later, at their next request)."""
        if not self.setup.yield_to_jobs:
            return
        while not self.closing:
            leases = await self._blocking(self._leases.view)
            waiters = {slot.id: waiter for slot, waiter in yielding(self.slots.values(), leases)}
            for slot in await self._claim([self.slots[m] for m in waiters]) if waiters else ():
                self._spawn(self._unload(slot, "yielded", by=waiters[slot.id]))
            await asyncio.sleep(self.setup.yield_interval_s)

    def _server(self, slot: Slot, plan: LlamaPlan, lease: Lease) -> LlamaServer:
        from xpulaunch.joblog.logs import LogConfig
        from xpulaunch.llamacpp.launch import server_for
        from xpulaunch.llamacpp.prepare import cuda_settle

        setup, loop = self.setup, asyncio.get_running_loop()
        slot.generation += 1
        generation, model = slot.generation, slot.id

        def on_event(event: Event) -> None:  # on the supervisor's thread
            loop.call_soon_threadsafe(self._replica_event, slot, generation, event)

        log_dir = None if setup.log_dir is None else f"{setup.log_dir}/{model}"
        slot.settle = cuda_settle(plan)
        # The router owns the lease (released at unload); the supervisor unlocks it as soon
        # as the replicas are gone, so an evicted model's devices are free at once.
        server = server_for(
            plan,
            lease,
            model_env(slot.config, setup),
            owns_lease=False,
            engine=slot.prepared.engine if slot.prepared is not None else None,
            health=setup.health,
            policy=setup.policy,
            grace_s=setup.grace_s,
            logs=LogConfig(log_dir=log_dir, console=False),
            on_message=lambda text: self._say(f"model {model}: {text}"),
            on_event=on_event,
            release_leases=True,
            settle=slot.settle,
            record_dir=setup.record_dir,
        )
        slot.server, slot.lease, slot.plan = server, lease, plan
        slot.readings = {u.device.key: u.device for u in plan.plan.devices}
        return server

    # -- replica events (from supervisor threads, run on the loop) -------------------------
    def _replica_event(self, slot: Slot, generation: int, event: Event) -> None:
        if generation != slot.generation:
            return  # a server this slot no longer runs
        self._emit(event, slot.id)
        if slot.replica_event(event) and slot.state is ModelState.READY:
            slot.last_error = f"model {slot.id}: every replica failed for good"
            slot.state = ModelState.UNLOADING
            self._spawn(self._unload(slot, "failed"))
        self.published(slot)  # the replicas that answer now

    # -- unloading ---------------------------------------------------------------------------
    async def _claim(self, slots: Sequence[Slot]) -> list[Slot]:
        """Those of ``slots`` that are loaded and idle, now UNLOADING (for the caller to
        unload). The front processes stop routing them first: a request one of them sent
        meanwhile is counted by then, and its model stays (routed by the fronts again)."""
        await self.withdraw(slots)
        claimed = [s for s in slots if s.state is ModelState.READY and not s.in_flight]
        for slot in slots:
            if slot in claimed:
                slot.state = ModelState.UNLOADING
            self.published(slot)
        return claimed

    async def _unload(self, slot: Slot, reason: str, by: str | None = None) -> None:
        """Stop the model's servers and free its devices (the state is UNLOADING already)."""
        server, lease, plan, settle = slot.server, slot.lease, slot.plan, slot.settle
        slot.generation += 1  # the stop's own events are not news
        if server is not None:
            await self._blocking(server.stop)
        if settle is not None and plan is not None:
            names = [w.name for w in plan.plan.workers]
            await self._blocking(lambda: settle(names))  # the GPU memory is free again
        if lease is not None:
            lease.release()
        slot.set_unloaded()
        self.published(slot)
        self._renew(slot)  # a reload's news, whichever unload came first
        self._changed()
        slot.counters.unloads[reason] = slot.counters.unloads.get(reason, 0) + 1
        self._emit(ModelUnloaded(self.clock(), slot.id, reason, by), None)
        self._say(f"model {slot.id} unloaded ({reason}{f' for {by}' if by else ''})")

    async def unload(self, slot: Slot, reason: str = "request") -> bool:
        """Unload an idle model now; False when it has requests in flight."""
        if slot.state is ModelState.LOADING and slot.loading is not None:
            await asyncio.shield(slot.loading)
        if slot.state is ModelState.UNLOADING:
            await slot.unloaded.wait()
        if slot.state is not ModelState.READY:
            return True
        if slot.in_flight:
            return False
        if await self._claim([slot]):
            await self._unload(slot, reason)
            return True
        # A front sent it a request meanwhile, or another unload claimed it first.
        return False if slot.in_flight else await self.unload(slot, reason)

    # -- a new config (reload) ---------------------------------------------------------------
    def reconfigure(self, config: RouterConfig) -> list[str]:
        """Take a new config (on the loop), and say what changes, one line each. New models
        can be asked for at once; a removed one is unloaded once idle, and a changed one too,
        to load with its new settings at its next request; an unchanged loaded model keeps
        its servers."""
        said: list[str] = []
        self.config = config
        for model in config.models:
            slot = self.slots.get(model.id)
            if slot is None:
                self.slots[model.id] = Slot(model)
                said.append(f"model {model.id} added")
            elif slot.config != model:
                slot.next_config, slot.removed = model, False
                said.append(f"model {model.id} changed: it reloads once idle")
            else:
                slot.next_config, slot.removed = None, False  # as it was: nothing pending
        for model_id in sorted(set(self.slots) - set(config.ids)):
            self.slots[model_id].removed = True
            said.append(f"model {model_id} removed: unloaded once idle")
        for slot in list(self.slots.values()):
            self._retire_if_idle(slot)
        self._wake.set()
        return said

    def _retire_if_idle(self, slot: Slot) -> None:
        """Apply a reload's news to a model that nothing uses now."""
        if not (slot.removed or slot.next_config is not None) or slot.in_flight:
            return
        if slot.state is ModelState.READY and not slot.retiring:
            slot.retiring = True
            self._spawn(self._retire(slot))
        elif slot.state is ModelState.UNLOADED:
            self._renew(slot)

    async def _retire(self, slot: Slot) -> None:
        try:
            claimed = await self._claim([slot])
        finally:
            slot.retiring = False
        # Else it is busy again (a front's request: retired at its release), or another
        # unload took it (its ttl, an eviction), which applied the news (_unload).
        if claimed:
            await self._unload(slot, "removed" if slot.removed else "reloaded")

    def _renew(self, slot: Slot) -> None:
        if slot.removed:
            if self.slots.get(slot.id) is slot:
                del self.slots[slot.id]
            return
        if slot.next_config is not None:
            slot.config, slot.next_config = slot.next_config, None
            slot.prepared = slot.preparing = None  # asked again with the new settings

    async def watch_ttl(self) -> None:
        """Unload idle models whose ttl has run out, waking when the next one is due."""
        while not self.closing:
            views = [s.view() for s in self.slots.values()]
            due_now = [self.slots[model] for model in expired(views, self.clock())]
            for slot in await self._claim(due_now) if due_now else ():
                self._spawn(self._unload(slot, "ttl"))
            due = next_expiry([s.view() for s in self.slots.values()])
            timeout = None if due is None else max(0.0, due - self.clock())
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # a ttl is due: look again
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def refuse(self) -> None:
        """Take no new request (each gets 503) and stop the loads under way (their requests
        get the error); the models loaded go on answering what they have."""
        self.closing = True
        self._wake.set()
        self._changed()  # loads waiting for room give up
        for slot in self.slots.values():
            if slot.state is ModelState.LOADING and slot.server is not None:
                await self._blocking(slot.server.stop)  # its start() returns, failing

    def in_flight(self) -> int:
        """Requests being answered or waiting for a load, the front processes' too."""
        return sum(s.in_flight for s in self.slots.values())

    async def idle(self) -> None:
        """Return once no request is in flight."""
        while self.in_flight():
            changed = asyncio.get_running_loop().create_future()
            self._waiters.add(changed)
            try:
                await changed
            finally:
                self._waiters.discard(changed)

    async def close(self) -> None:
        """Stop every server (loading ones too) and free every lease."""
        await self.refuse()
        pending = [t for t in self._tasks if not t.done()]
        await asyncio.gather(*pending, return_exceptions=True)
        ready = [s for s in self.slots.values() if s.state is ModelState.READY]
        for slot in ready:
            slot.state = ModelState.UNLOADING
        await asyncio.gather(*(self._unload(s, "stop") for s in ready))
        self._pool.shutdown(wait=True)

    def servers(self) -> tuple[LlamaServer, ...]:
        """The servers running now (for a signal handler: a snapshot, no lock)."""
        return tuple(s.server for s in list(self.slots.values()) if s.server is not None)


def yielding(slots: Iterable[Slot], leases: LeaseView) -> list[tuple[Slot, str]]:
    """The loaded models to unload for launches waiting in line, with who each goes for: a
    waiter's GPUs must be held by idle, unpinned models of ours alone (a busy model, a
    pinned one or another job on any of them, and unloading helps it nothing yet)."""
    idle = {
        s.lease.job_id: s
        for s in slots
        if s.lease is not None
        and s.state is ModelState.READY
        and not s.in_flight
        and not s.config.pinned
    }
    chosen: dict[str, tuple[Slot, str]] = {}
    for waiter in leases.waiting:
        holders = [leases.holders_of(key) for key in waiter.wants]
        if not any(holders) or not all(h <= idle.keys() for h in holders):
            continue
        who = waiter.holder.describe() if waiter.holder else waiter.owner
        for job_id in set().union(*holders):
            chosen.setdefault(job_id, (idle[job_id], who))
    return list(chosen.values())


async def _no_fronts(slots: Sequence[Slot]) -> None:
    """No front process routes by its own copy: nothing to wait for."""
