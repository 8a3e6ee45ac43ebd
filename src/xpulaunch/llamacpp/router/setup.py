"""What every model of one router shares (:class:`Setup`), and the ``xpulaunch llama``
request each model is (:func:`model_request`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from xpulaunch.core.selection import GpuMode, parse_gpus
from xpulaunch.llamacpp.plan import LlamaRequest
from xpulaunch.llamacpp.server import HealthOptions
from xpulaunch.model import DeviceShare, Inventory
from xpulaunch.supervisor.restart import RestartPolicy

if TYPE_CHECKING:
    from xpulaunch.llamacpp.devices import LlamaBackend
    from xpulaunch.llamacpp.prepare import Prepared
    from xpulaunch.llamacpp.router.config import ModelConfig


@dataclass(frozen=True, slots=True)
class Setup:
    """What every model of one router shares."""

    inventory: Inventory
    parent_env: Mapping[str, str]
    health: HealthOptions
    policy: RestartPolicy
    binary: str | None = None
    llama_backend: LlamaBackend | None = None
    backend: str | None = None
    lock_dir: str | None = None
    grace_s: float = 10.0
    log_dir: str | None = None
    record_dir: str | None = None
    # How long a load waits for a busy model of ours to become idle and make room, before
    # its requests get 503.
    room_wait_s: float = 10.0
    # Unload idle, unpinned models from the GPUs a launch waiting in line wants (and place
    # none there meanwhile), every yield_interval_s: serving yields to training.
    yield_to_jobs: bool = True
    yield_interval_s: float = 1.0
    # Probe the host again before each placement (the inventory is this host's, not a file):
    # other programs come and go on the GPUs while a router runs for days.
    reprobe: bool = False
    start_port: int | None = None  # the first port tried for a server ([serve] start_port)


def model_request(model: ModelConfig, setup: Setup) -> LlamaRequest:
    """What ``xpulaunch llama`` would be asked for this model (free ports, 127.0.0.1)."""
    return LlamaRequest(
        model=model.model,
        replicas=model.replicas,
        binary=(model.cmd[0] if model.cmd else model.binary) or setup.binary or "llama-server",
        llama_backend=setup.llama_backend,
        passthrough=() if model.cmd else _server_args(model),
        gpus=model.gpus,
        backend=setup.backend,
        topology=model.topology,
        first_port=setup.start_port,
    )


def model_env(model: ModelConfig, setup: Setup) -> dict[str, str]:
    """The environment the model's servers start from (and its estimate is asked in): the
    router's, with the model's ``env`` on top; the plan's own variables, the device masks, go
    on top of both. Only the masks in it steer the placement (:func:`placement_env`)."""
    return {**setup.parent_env, **model.env}


def pinned_by_hand(model: ModelConfig) -> dict[str, str]:
    """The device masks a model's ``env`` sets by hand (``CUDA_VISIBLE_DEVICES=1``, as
    llama-swap configs pin a model), with the variables that say how to read them."""
    from xpulaunch.core.visibility import CUDA_ORDER_VAR, PCI_ORDER_VAR, VENDOR_VARS

    masks = {v for names in VENDOR_VARS.values() for v in names}
    if not masks & set(model.env):
        return {}
    return {k: v for k, v in model.env.items() if k in masks | {CUDA_ORDER_VAR, PCI_ORDER_VAR}}


def placement_env(model: ModelConfig, setup: Setup) -> dict[str, str]:
    """The environment a model is planned in: the router's, with the masks its ``env`` sets
    by hand over the router's own. Such a mask keeps the model on the devices it names, as a
    parent's mask keeps any launch there; the servers then get the masks of the devices
    chosen among those, leased like any others (what ``status`` and ``top`` show)."""
    return {**setup.parent_env, **pinned_by_hand(model)}


def pin_note(model: ModelConfig) -> str | None:
    """What the dry run says of a model pinned by hand (None: not pinned)."""
    pins = pinned_by_hand(model)
    if not pins:
        return None
    said = " ".join(f"{k}={v}" for k, v in pins.items())
    return f"pinned by hand: its env sets {said}; it goes only on the devices that names"


def prepare_model(model: ModelConfig, setup: Setup, *, dry_run: bool = False) -> Prepared:
    """:func:`~xpulaunch.llamacpp.prepare.prepare_llama` for a llama model; for a ``cmd``
    engine, nothing to ask: its need is its ``memory`` (None: a whole device). A model's
    ``memory`` is its share of a device in place of the estimate."""
    from xpulaunch.llamacpp.devices import LlamaBackend
    from xpulaunch.llamacpp.engine import Engine, memory_estimate
    from xpulaunch.llamacpp.plan import Sizing
    from xpulaunch.llamacpp.prepare import Prepared, prepare_llama

    request = model_request(model, setup)
    memory = memory_estimate(model.memory_bytes)
    if model.cmd:
        engine = Engine(model.cmd, model.id, model.check)
        return Prepared(request, LlamaBackend.CPU, None, Sizing(None, memory), (), engine)
    prepared = prepare_llama(request, model_env(model, setup), dry_run=dry_run)
    if memory is None:
        return prepared
    return replace(prepared, sizing=replace(prepared.sizing, estimate=memory))


def packed(
    model: ModelConfig, prepared: Prepared, inventory: Inventory, parent_env: Mapping[str, str]
) -> Prepared:
    """``prepared``, asking for a share of one GPU per replica instead of whole GPUs when the
    model fits in one (its ``memory``, else its estimate plus llama.cpp's ``--fit-target``
    margin): models are packed beside each other and beside other small jobs, as the queue's
    ``--gpu-memory`` jobs are, and a model is evicted only when memory runs out. A model
    larger than any GPU, one with no estimate and no ``memory``, and a CPU build keep whole
    devices."""
    from xpulaunch.llamacpp import args as llama_args
    from xpulaunch.llamacpp.devices import LlamaBackend
    from xpulaunch.llamacpp.fit import fit_target_bytes

    request = prepared.request
    on_cpu = prepared.engine is None and prepared.build is LlamaBackend.CPU
    if on_cpu or parse_gpus(model.gpus).mode is not GpuMode.AUTO:
        return prepared
    need = model.memory_bytes  # a cmd engine's need is its memory alone (else whole devices)
    estimate = prepared.sizing.estimate
    if need is None and estimate is not None and prepared.engine is None:
        margin = fit_target_bytes(
            llama_args.passthrough_value(request.passthrough, "fit_target")
            or parent_env.get("LLAMA_ARG_FIT_TARGET")
        )
        need = estimate.on_devices(1) + margin
    largest = max((d.memory_total_bytes or 0 for d in inventory.devices), default=0)
    if need is None or need > largest:
        return prepared
    return replace(prepared, request=replace(request, share=DeviceShare(memory_bytes=need)))


def _server_args(model: ModelConfig) -> tuple[str, ...]:
    """The model's args, plus llama-server's own ``/metrics`` (which the router's relabels)
    and ``--alias ID`` (answers then name the model as the client did), unless given."""
    args = model.args
    extra: tuple[str, ...] = () if "--metrics" in args else ("--metrics",)
    if not {"-a", "--alias"} & set(args):
        extra += ("--alias", model.id)
    return (*args, *extra)
