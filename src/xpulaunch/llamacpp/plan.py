"""The llama plan: :func:`~xpulaunch.core.plan.make_plan` with one isolated worker per replica,
each worker's argv replaced by its full llama-server command line. Pure.

The visibility env of every replica comes from the shared planner (isolated workers: a
replica sees only its own devices, renumbered from 0), so CUDA, SYCL and ROCm builds are pinned by
their runtime's mask and address their devices as ``CUDA0..``, ``SYCL0..``, ``ROCm0..``.
Vulkan ignores those masks and is pinned by ``--device VulkanN`` (:mod:`.vulkan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

from xpulaunch.core.backend import parse_backend
from xpulaunch.core.masks import ODS_VAR
from xpulaunch.core.plan import LaunchRequest
from xpulaunch.core.selection import GpuMode, parse_gpus
from xpulaunch.errors import SelectionError, UsageError, check_plain
from xpulaunch.llamacpp import args as llama_args, vulkan
from xpulaunch.llamacpp.devices import DeviceList, LlamaBackend, LlamaDevice, device_names
from xpulaunch.llamacpp.fit import FIT_TARGET_MIB, Estimate, fit_target_bytes
from xpulaunch.llamacpp.placement import plan_replicas, sizing_notes
from xpulaunch.model import Backend, DeviceShare, Inventory, Plan, Unit, WorkerPlan

SYSMAN_VAR = "ZES_ENABLE_SYSMAN"
_DEVICE_MAP_VARS = frozenset({"XPULAUNCH_DEVICE_MAP", "XPULAUNCH_MAX_MEMORY"})


@dataclass(frozen=True, slots=True)
class LlamaRequest:
    """What ``xpulaunch llama`` was asked (``port`` None: free ports; ``llama_backend`` None:
    ask the binary)."""

    model: str | None
    replicas: int = 1
    host: str = "127.0.0.1"
    port: int | None = None
    binary: str = "llama-server"
    llama_backend: LlamaBackend | None = None
    passthrough: tuple[str, ...] = ()
    gpus: str = "auto"
    backend: str | None = None
    min_free_memory_bytes: int | None = None
    max_utilization_percent: float | None = None
    # A share of each device beside other jobs and models (the router packs models so),
    # instead of whole devices.
    share: DeviceShare | None = None
    topology: str = "prefer"  # --topology: how a replica's several GPUs are chosen
    first_port: int | None = None  # free ports from here up (None: any free port)

    def __post_init__(self) -> None:
        for each in fields(self):
            check_plain(each.name, getattr(self, each.name), str(each.type))  # a caller's type
        if self.replicas < 1:
            raise UsageError("expected 1 or more", option="replicas", value=self.replicas)
        if self.port is not None and not 1 <= self.port <= 65535:
            raise UsageError("expected a port from 1 to 65535", option="port", value=self.port)


@dataclass(frozen=True, slots=True)
class Replica:
    """One llama-server: where it listens and what it offloads to."""

    name: str
    host: str
    port: int
    port_fixed: bool  # the user chose it: never moved to another port
    devices: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"


@dataclass(frozen=True, slots=True)
class Sizing:
    """What is known about memory: ``fit`` whether the build sizes its own offload
    (``--fit``; None: unknown, treated as no), and the model's estimated need."""

    fit: bool | None = None
    estimate: Estimate | None = None


@dataclass(frozen=True, slots=True)
class LlamaPlan:
    """``fits``: whether each replica's devices hold the estimate (None: unknown)."""

    plan: Plan
    replicas: tuple[Replica, ...]
    build: LlamaBackend
    estimate: Estimate | None = None
    fits: bool | None = None


def url_host(host: str) -> str:
    """Where to reach a server bound to ``--host``: a wildcard is reached on loopback."""
    first = host.split(",", maxsplit=1)[0].strip()
    if first.endswith(".sock"):
        raise UsageError(
            "a UNIX socket cannot be health-checked by xpulaunch; "
            "use an IP address such as 127.0.0.1",
            option="host",
            value=host,
        )
    first = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(first, first)
    return f"[{first}]" if ":" in first else first


def effective_model(request: LlamaRequest, parent_env: Mapping[str, str]) -> str | None:
    """The model path (None: a remote model or ``LLAMA_ARG_MODEL``); raises when none or two
    are given."""
    after = llama_args.passthrough_value(request.passthrough, "model")
    if request.model is not None and after is not None:
        raise UsageError(f"-m given twice ({request.model} and {after} after --): keep one")
    model = request.model or after
    remote = llama_args.has_remote_model(request.passthrough) or "LLAMA_ARG_MODEL" in parent_env
    if model is None and not remote:
        raise UsageError(
            "no model given; expected the path of a .gguf file", option="model", value=None
        )
    return model


def make_llama_plan(
    request: LlamaRequest,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    build: LlamaBackend,
    listing: DeviceList | None,
    ports: Sequence[int],
    build_notes: Sequence[str] = (),
    unavailable: Mapping[str, str] | None = None,
    sizing: Sizing = Sizing(),
) -> LlamaPlan:
    """Plan ``request.replicas`` servers of a ``build`` binary on disjoint devices.

    ``listing`` is the binary's ``--list-devices`` (needed for Vulkan); ``ports`` one
    candidate port per replica; ``sizing`` says whether llama.cpp fits the model itself and
    what it needs (``--gpus auto``: the fewest free devices that hold it).
    """
    _check_counts(request, ports)
    launch = _launch_request(request, build, _preview_build(inventory))
    fit_mib = _fit_target(request, sizing, parent_env)
    margin = fit_target_bytes(
        llama_args.passthrough_value(request.passthrough, "fit_target")
        or parent_env.get("LLAMA_ARG_FIT_TARGET")
    )
    placed = plan_replicas(
        launch,
        request.replicas,
        inventory,
        parent_env,
        unavailable=unavailable,
        estimate=sizing.estimate,
        margin_bytes=margin,
    )
    plan = placed.plan
    vk = _vulkan_table(build, inventory, listing)
    model = effective_model(request, parent_env)
    workers: list[WorkerPlan] = []
    replicas: list[Replica] = []
    notes = [*vk[1], *sizing_notes(sizing.estimate, sizing.fit, fit_mib, bool(plan.devices))]
    notes += placed.notes
    for worker, port in zip(plan.workers, ports, strict=True):
        units = tuple(plan.devices[i] for i in worker.units)
        names = _names(build, units, vk[0], listing)
        replica = _replica(request, worker.name, port, names)
        offload = llama_args.Offload(names, _split_units(build, units), fit_mib)
        argv, arg_notes = llama_args.server_argv(
            request.binary,
            model=model,
            host=request.host,
            port=replica.port,
            offload=offload,
            passthrough=request.passthrough,
            parent_env=parent_env,
        )
        env = _replica_env(worker, build, len(names), parent_env)
        workers.append(replace(worker, argv=argv, env=env))
        replicas.append(replica)
        notes += [f"replica {worker.name}: {n}" for n in arg_notes]
        notes.append(_replica_note(replica, units))
    _check_disjoint(build, replicas)
    shared = _replica_words(plan.notes, bool(plan.devices))
    if build is LlamaBackend.CPU and launch.gpus != request.gpus:  # --gpus auto on a CPU build
        said = f"backend cpu: this llama-server is a CPU build (gpus: {request.gpus})"
        shared = [said if n == "backend cpu: --gpus none" else n for n in shared]
    final = replace(
        plan, workers=tuple(workers), notes=(*build_notes, *shared, *notes), device_map=None
    )
    return LlamaPlan(final, tuple(replicas), build, sizing.estimate, placed.fits)


def _fit_target(request: LlamaRequest, sizing: Sizing, parent_env: Mapping[str, str]) -> int | None:
    """The ``--fit-target`` in MiB to pass (None: the old offload options instead)."""
    if not sizing.fit or llama_args.fit_is_off(request.passthrough, parent_env):
        return None
    return FIT_TARGET_MIB


def _replica_words(notes: Sequence[str], on_devices: bool) -> list[str]:
    """The shared planner's notes, told for servers: a replica is not a rank, and the
    planner's visibility note speaks of workers and the run command's isolation."""
    kept = [n for n in notes if not n.startswith("visibility: ")]
    if on_devices:
        kept.append("visibility: each replica sees only its own devices, numbered from 0")
    return kept


def _check_counts(request: LlamaRequest, ports: Sequence[int]) -> None:
    if request.replicas < 1:
        raise UsageError("must be at least 1", option="replicas", value=request.replicas)
    if len(ports) != request.replicas:
        raise ValueError(f"{len(ports)} ports for {request.replicas} replicas")
    after = llama_args.passthrough_value(request.passthrough, "port")
    if after is not None and request.replicas > 1:
        raise UsageError(
            f"--port {after} in the llama-server arguments would give all "
            f"{request.replicas} replicas one port; give the first port as xpulaunch's port "
            "instead"
        )


def _preview_build(inventory: Inventory) -> str:
    """The ``--llama-backend`` that previews a GPU plan for ``inventory``'s GPUs."""
    vendors = {d.vendor for d in inventory.devices}
    if len(vendors) == 1:
        return {"nvidia": "cuda", "intel": "sycl", "amd": "rocm"}[vendors.pop().value]
    return "cuda, sycl, rocm or vulkan"


def _launch_request(
    request: LlamaRequest, build: LlamaBackend, preview: str = "cuda, sycl, rocm or vulkan"
) -> LaunchRequest:
    """The shared planner's request: the backend follows the build of the binary.
    ``preview``: the ``--llama-backend`` to name to a CPU build asked for GPUs."""
    wanted = parse_backend(request.backend)
    gpus, backend = request.gpus, request.backend
    native = build.plan_backend
    if build is LlamaBackend.CPU:
        if parse_gpus(gpus).mode not in (GpuMode.AUTO, GpuMode.NONE):
            raise UsageError(
                "this llama-server is a CPU build (--list-devices shows no GPU); "
                "use none, or a CUDA, SYCL, ROCm or Vulkan build (to preview a GPU build's "
                f"plan with this one: --dry-run --llama-backend {preview})",
                option="gpus",
                value=gpus,
            )
        if wanted not in (None, Backend.CPU):
            raise UsageError(
                "this llama-server is a CPU build", option="backend", value=wanted.value
            )
        gpus, backend = "none", None
    elif native is not None and wanted is not Backend.CPU:
        if wanted not in (None, native):
            raise UsageError(
                f"this llama-server is a {build.device_prefix} build, which runs on the "
                f"{native.value} backend (or cpu)",
                option="backend",
                value=wanted.value,
            )
        backend = native.value
    return LaunchRequest(
        argv=(request.binary,),
        gpus=gpus,
        backend=backend,
        isolate=True,
        # A replica is not a rank: no torchrun variables, no OMP_NUM_THREADS=1 (llama-server
        # sizes its own CPU threads with -t/-tb; the OpenMP default would cap them).
        min_free_memory_bytes=request.min_free_memory_bytes,
        max_utilization_percent=request.max_utilization_percent,
        distributed=False,
        share=request.share if build is not LlamaBackend.CPU else None,
        topology=request.topology,
    )


def _vulkan_table(
    build: LlamaBackend, inventory: Inventory, listing: DeviceList | None
) -> tuple[dict[str, LlamaDevice], tuple[str, ...]]:
    if build is not LlamaBackend.VULKAN:
        return {}, ()
    if listing is None:
        raise UsageError(
            "pinning a Vulkan build needs its --list-devices, "
            "but the binary could not be asked; run where the binary is",
            option="llama_backend",
            value="vulkan",
        )
    return vulkan.match_devices(inventory, listing.of(LlamaBackend.VULKAN))


def _names(
    build: LlamaBackend,
    units: tuple[Unit, ...],
    matched: dict[str, LlamaDevice],
    listing: DeviceList | None,
) -> tuple[str, ...]:
    if not units:
        return ()
    if build is LlamaBackend.VULKAN:
        listed = listing.of(LlamaBackend.VULKAN) if listing else ()
        return tuple(d.name for d in vulkan.replica_devices(units, matched, listed))
    return device_names(build, len(units))


def _split_units(build: LlamaBackend, units: tuple[Unit, ...]) -> tuple[Unit, ...]:
    """What ``--tensor-split`` divides: Vulkan devices are whole cards, so tiles merge."""
    if build is not LlamaBackend.VULKAN:
        return units
    return tuple(dict.fromkeys(Unit(u.device) for u in units))


def _replica(request: LlamaRequest, name: str, port: int, names: tuple[str, ...]) -> Replica:
    host = llama_args.passthrough_value(request.passthrough, "host") or request.host
    url_host(host)  # rejects UNIX sockets early
    after = llama_args.passthrough_value(request.passthrough, "port")
    if after is not None:
        return Replica(name, host, _port_number(after, "--port after --"), True, names)
    return Replica(name, host, port, request.port is not None, names)


def _port_number(text: str, what: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise UsageError(f"{what} {text!r}: expected a port number from 1 to 65535")
    return port


def _replica_env(
    worker: WorkerPlan, build: LlamaBackend, devices: int, parent_env: Mapping[str, str]
) -> dict[str, str | None]:
    # Device-map hints are for one process spanning the selection (accelerate);
    # llama-server splits a model with its own -sm/--tensor-split arguments.
    env = {k: v for k, v in worker.env.items() if k not in _DEVICE_MAP_VARS}
    if build is LlamaBackend.SYCL:
        child = worker.child_env(parent_env)
        # ggml-sycl picks its platform by substring of the selector and throws on one without
        # "level_zero"/"opencl"/...; OpenCL would also list every Intel GPU twice (ref. 3.2).
        if ODS_VAR in child and "level_zero" not in child[ODS_VAR]:
            env[ODS_VAR] = "level_zero:gpu"
        # SYCL.md: -sm layer across devices needs Sysman to read their free memory.
        if devices > 1 and SYSMAN_VAR not in parent_env:
            env[SYSMAN_VAR] = "1"
    return dict(sorted(env.items()))


def _replica_note(replica: Replica, units: tuple[Unit, ...]) -> str:
    where = ", ".join(
        f"{name} = {unit.label()}" for name, unit in zip(replica.devices, units, strict=False)
    )
    if len(replica.devices) != len(units) and units:
        where = f"{', '.join(replica.devices)} = {', '.join(u.label() for u in units)}"
    port = "fixed port" if replica.port_fixed else "free port, moved if taken"
    return f"replica {replica.name}: {replica.url} ({port}) on {where or 'the CPU'}"


def _check_disjoint(build: LlamaBackend, replicas: Sequence[Replica]) -> None:
    if build is not LlamaBackend.VULKAN:
        return  # masks of disjoint units are disjoint
    owner: dict[str, str] = {}
    for replica in replicas:
        for name in replica.devices:
            if name in owner:
                raise SelectionError(
                    f"replicas {owner[name]} and {replica.name} would share {name}: Vulkan "
                    "sees whole cards, not tiles; set ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE"
                )
            owner[name] = replica.name
