"""``make_plan``: which devices, and what goes into each child's environment.

Pure function of (request, inventory, parent env, leases). A worker's planned environment
holds every variable known before the job starts; the supervisor adds only those whose values
exist at start (:data:`~xpulaunch.model.SET_AT_START`, listed by name in the document). The
plan document (``xpulaunch.plan/1``, docs/CONTRACT.md, section 4) is produced by :func:`to_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xpulaunch.core import devicemap
from xpulaunch.core.backend import choose_backend, elsewhere_hint, parse_backend
from xpulaunch.core.devicemap import place, worker_count
from xpulaunch.core.known_issues import issues_of
from xpulaunch.core.selection import (
    Filters,
    GpuMode,
    GpuRequest,
    allocated_by,
    busy_reason,
    holder_of,
    parse_gpus,
    select,
)
from xpulaunch.core.visibility import (
    child_order,
    child_visibility_env,
    hiding_notes,
    parent_visible,
)
from xpulaunch.errors import SelectionError
from xpulaunch.model import (
    CPUS_VAR,
    MAX_RESTARTS_VAR,
    SET_AT_START,
    Backend,
    DeviceMap,
    DeviceShare,
    Hierarchy,
    Inventory,
    NodeGroup,
    Plan,
    Unit,
    Vendor,
    WorkerPlan,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from xpulaunch.core.cpu_bind import Binding

SCHEMA = "xpulaunch.plan/1"


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """What the user asked for; ``argv`` is the resolved command of every worker."""

    argv: tuple[str, ...]
    gpus: str = "auto"
    backend: str | None = None
    nproc_per_node: int | None = 1  # None = auto: one per selected unit
    isolate: bool = False
    min_free_memory_bytes: int | None = None
    max_utilization_percent: float | None = None
    device_map: DeviceMap | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # torchrun's rank variables and its OMP_NUM_THREADS=1 default; False for processes that
    # are not ranks of one job (llama-server replicas size their own threads).
    distributed: bool = True
    # Restarts a worker may see (TORCHELASTIC_MAX_RESTARTS): 0 when restarts are off, None
    # for no limit ("-1", as torchrun's elastic agent writes it).
    max_restarts: int | None = 0
    # Variables every worker gets on top (an accelerate config's ACCELERATE_* settings);
    # device masks and rank variables are the plan's own and win over these.
    extra_env: tuple[tuple[str, str], ...] = ()
    # This machine's place in a job of several nodes; one node by default.
    nodes: NodeGroup = field(default_factory=NodeGroup)
    # accelerate's gpu_ids: ordinals in the numbering of the child's runtime, read in place
    # of ``gpus`` (core.runtime_ids); None when the devices come from ``gpus``.
    gpu_ids: str | None = None
    # Which CPUs each worker runs on (core.cpu_bind): none, numa or exclusive; read only when
    # not none, so a plan without binding does not import the binding rules.
    cpu_bind: str = "none"
    # Share each device with other small jobs (--slots-per-gpu, --gpu-memory); None: alone.
    share: DeviceShare | None = None
    # torchrun's TORCHELASTIC_RUN_ID: its --rdzv-id, "none" when not given.
    run_id: str = "none"
    # --topology: prefer (default), require or ignore a closely linked set (core.topology).
    topology: str = "prefer"


def check_topology(value: str) -> str:
    """``--topology``'s word, checked (prefer, require or ignore); the rules are imported only
    where a word other than the default is given or N devices are chosen."""
    if value == "prefer":
        return value
    from xpulaunch.core.topology import TopologyMode
    from xpulaunch.errors import member_of

    return member_of(TopologyMode, "topology", value).value


def make_plan(
    request: LaunchRequest,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    unavailable: Mapping[str, str] | None = None,
) -> Plan:
    """Resolve devices, workers and child environments. Raises on requests that cannot be met."""
    gpus = parse_gpus("all" if request.gpu_ids is not None else request.gpus)
    requested = parse_backend(request.backend)
    hierarchy, notes = _hierarchy(inventory, parent_env)
    visible: dict[Vendor, tuple[Unit, ...]] = {}
    for vendor in sorted({d.vendor for d in inventory.devices}, key=lambda v: v.value):
        seen = parent_visible(
            inventory, vendor, parent_env, hierarchy=hierarchy if vendor is Vendor.INTEL else None
        )
        visible[vendor] = seen.units
        notes += list(seen.notes)
    backend, backend_notes = choose_backend(requested, gpus, inventory.devices, visible)
    notes += list(backend_notes)
    if request.gpu_ids is not None and backend.vendor is not None:
        from xpulaunch.core.runtime_ids import runtime_request  # accelerate's gpu_ids only

        gpus, read_as = runtime_request(
            request.gpu_ids, backend.vendor, inventory, parent_env, hierarchy
        )
        notes.append(read_as)
    job = _Job(request, backend, (), inventory, parent_env, hierarchy)
    gpus = _one_per_worker(gpus, request)
    units, selection_notes = _select_units(job, gpus, visible, unavailable)
    units, order_notes = _in_child_order(job, units)
    selection_notes = (*selection_notes, *order_notes)
    job = _Job(request, backend, units, inventory, parent_env, hierarchy)
    workers, worker_notes = _workers(job)
    worker_notes = (*worker_notes, *_ipc_warning(request, backend, len(workers)))
    cards = dict.fromkeys(u.device for u in units)
    selection_notes = (*selection_notes, *(f"warning: {w}" for d in cards for w in issues_of(d)))
    if request.share is not None and units:
        selection_notes = (*selection_notes, _share_note(request.share, units))
    return Plan(
        backend=backend,
        devices=units,
        workers=workers,
        device_map=devicemap.job_device_map(
            len(units), request.device_map, workers=len(workers), isolate=request.isolate
        ),
        notes=(*notes, *selection_notes, *worker_notes),
        isolate=request.isolate,
        hierarchy=hierarchy if backend is Backend.XPU else None,
        nodes=request.nodes,
        share=request.share if units else None,
    )


# Collectives between the ranks of one node hand each other IPC handles of device memory;
# a process opens a peer's handle only on a device it can see. Level Zero's IPC (oneCCL's
# intra-node paths) and HIP's (RCCL's P2P transport) then fail or take a slower way round.
# NCCL under one CUDA device a rank is not warned about (not verified either way).
_IPC_STACKS = {
    Backend.XPU: "Intel (oneCCL over Level Zero IPC)",
    Backend.ROCM: "AMD (RCCL over HIP IPC)",
}


def _ipc_warning(request: LaunchRequest, backend: Backend, workers: int) -> tuple[str, ...]:
    if not (request.isolate and request.distributed and workers > 1 and backend in _IPC_STACKS):
        return ()
    return (
        f"warning: --isolate with {workers} ranks on {_IPC_STACKS[backend]}: each worker sees "
        "only its own devices, so collectives that pass IPC handles between devices cannot "
        "open their peers' memory (they fail, or fall back to slower paths); without --isolate "
        "every rank sees all selected devices and LOCAL_RANK picks its own",
    )


def _one_per_worker(gpus: GpuRequest, request: LaunchRequest) -> GpuRequest:
    """``auto`` for N workers that each use the device LOCAL_RANK picks (several, not
    isolated, not sharing slots): at most N devices. torchrun's workers see every GPU and use
    the first N; leasing the rest would keep them from every other job for nothing. A single
    worker keeps every free device (one process may spread a model over them), as does
    ``--isolate`` (each worker gets its share of them) and ``--nproc-per-node auto``."""
    count = request.nproc_per_node
    if gpus.mode is not GpuMode.AUTO or count is None or count < 2:
        return gpus
    if request.isolate or request.share is not None:
        return gpus
    return GpuRequest(GpuMode.AUTO, count=count)


def _share_note(share: DeviceShare, units: tuple[Unit, ...]) -> str:
    from xpulaunch.core.slots import describe_share  # a job sharing its devices only

    each = ", ".join(
        f"{u.label()}: {devicemap.format_share(share.claim_bytes(u.memory_total_bytes))}"
        for u in units
    )
    return (
        f"sharing: one slot of each device ({describe_share(share)}), shared with other small "
        f"jobs; XPULAUNCH_MAX_MEMORY is this job's share ({each})"
    )


def _hierarchy(
    inventory: Inventory, parent_env: Mapping[str, str]
) -> tuple[Hierarchy | None, list[str]]:
    intel = inventory.of(Vendor.INTEL)
    if not intel:
        return None, []
    from xpulaunch.core.masks.level_zero import resolve_hierarchy

    hierarchy, note = resolve_hierarchy(parent_env.get("ZE_FLAT_DEVICE_HIERARCHY"), intel)
    return hierarchy, [note]


@dataclass(frozen=True, slots=True)
class _Job:
    """What every worker of one plan shares."""

    request: LaunchRequest
    backend: Backend
    units: tuple[Unit, ...]
    inventory: Inventory
    parent_env: Mapping[str, str]
    hierarchy: Hierarchy | None


def _select_units(
    job: _Job,
    gpus: GpuRequest,
    visible: Mapping[Vendor, tuple[Unit, ...]],
    unavailable: Mapping[str, str] | None,
) -> tuple[tuple[Unit, ...], tuple[str, ...]]:
    vendor = job.backend.vendor
    if vendor is None:
        return (), ()
    request = job.request
    allocated = _allocation(job, gpus, visible[vendor], unavailable)
    if allocated is not None:  # auto: every GPU the scheduler gave the job
        return allocated
    filters = Filters(
        request.min_free_memory_bytes,
        request.max_utilization_percent,
        share=request.share,
        topology=request.topology,
    )
    selection = select(
        gpus,
        visible[vendor],
        job.inventory.of(vendor),
        filters=filters,
        unavailable=unavailable,
        elsewhere=elsewhere_hint(vendor, visible),
    )
    if not selection.units and gpus.mode is GpuMode.AUTO:
        raise SelectionError(
            "no free device among the visible ones ("
            + "; ".join(selection.notes)
            + "); name devices explicitly, use none for the CPU, or wait for a free one",
            option="gpus",
            value="auto",
        )
    return selection.units, selection.notes


def _in_child_order(job: _Job, units: tuple[Unit, ...]) -> tuple[tuple[Unit, ...], tuple[str, ...]]:
    """The units with each worker's share in the order its runtime numbers them, so that
    LOCAL_RANK k, XPULAUNCH_DEVICES and XPULAUNCH_MAX_MEMORY name the child's device k. Only
    Level Zero reorders: an Intel child sees its devices in driver order, not in the order
    they were named (``--gpus device=1,0`` on an Arc with an iGPU: xpu:0 is still the Arc)."""
    if len(units) < 2:
        return units, ()
    count = worker_count(job.request.nproc_per_node, len(units))
    ordered = list(units)
    for share in set(place(len(units), count, isolate=job.request.isolate)):
        mine = child_order(
            job.backend.vendor, [units[i] for i in share], job.inventory, job.parent_env
        )
        for position, unit in zip(share, mine, strict=True):
            ordered[position] = unit
    if ordered == list(units):
        return units, ()
    return tuple(ordered), (
        "Level Zero numbers a child's devices in driver order (discrete before integrated, "
        "then PCI address), not in the order they were named, so workers get them as: "
        + ", ".join(u.label() for u in ordered),
    )


def _filtered(request: LaunchRequest) -> bool:
    """The user set a bar of their own (free memory, utilisation): ``auto`` keeps it."""
    return request.min_free_memory_bytes is not None or request.max_utilization_percent is not None


def _allocation(
    job: _Job, gpus: GpuRequest, units: tuple[Unit, ...], unavailable: Mapping[str, str] | None
) -> tuple[tuple[Unit, ...], tuple[str, ...]] | None:
    """``--gpus auto`` under a scheduler's allocation (:mod:`xpulaunch.core.selection`):
    every allocated unit that no other job of ours leases, a busy one too, with a warning.
    None where no scheduler allocated the GPUs, the user set a bar of their own (free memory,
    utilisation), or every unit is leased (auto's own refusal then names the holders)."""
    who = allocated_by(job.parent_env) if gpus.mode is GpuMode.AUTO else None
    if who is None or _filtered(job.request):
        return None
    held = unavailable or {}
    free = tuple(u for u in units if holder_of(u, held) is None and not u.device.integrated)
    if not free:
        return None
    scheduler = who.partition(" ")[0]
    notes = [
        f"--gpus auto: {who} allocated this job its GPUs, so every one is used (a busy one "
        "with a warning) instead of fewer workers on this node",
        *(
            f"{u.label()}: skipped, leased by {holder_of(u, held)}"
            for u in units
            if holder_of(u, held) is not None
        ),
        *(f"{u.label()}: allocated to the job" for u in free),
        *(
            f"warning: {u.label()} is {busy}; used anyway, as {scheduler} allocated it"
            for u in free
            if (busy := busy_reason(u)) is not None
        ),
    ]
    return free, tuple(notes)


def _workers(job: _Job) -> tuple[tuple[WorkerPlan, ...], tuple[str, ...]]:
    units, env = job.units, job.parent_env
    count = worker_count(job.request.nproc_per_node, len(units))
    shares = place(len(units), count, isolate=job.request.isolate)
    notes: list[str] = []
    if not job.request.isolate and units and count > len(units):
        notes.append(
            f"{count} workers share {len(units)} device(s): "
            f"LOCAL_RANK modulo {len(units)} picks each worker's device"
        )
    bindings, bind_notes = _bindings(job, shares)
    if count > 1 and "OMP_NUM_THREADS" not in env and job.request.distributed:
        notes.append(
            "OMP_NUM_THREADS=1 for every worker "
            "(as torchrun does with several workers and no OMP_NUM_THREADS set)"
            if not any(bindings)
            else "OMP_NUM_THREADS follows the cores each worker is bound to"
        )
    nodes = job.request.nodes
    if nodes.source == "none":
        notes.append(
            "--nnodes auto: no Slurm, Kubeflow or MPI variables here, so one node (this one)"
        )
    if nodes.nnodes > 1:
        notes.append(node_note(nodes, count, job.request.master_addr, job.request.master_port))
    if units and job.request.isolate:
        notes.append("visibility: each worker sees only its own devices (--isolate)")
    elif units and count > 1:
        notes.append("visibility: every worker sees all selected devices, LOCAL_RANK picks one")
    elif len(units) > 1:  # one worker: there is no LOCAL_RANK to pick by
        notes.append("visibility: the worker sees all selected devices")
    workers = tuple(
        _worker(job, share, rank, count, bindings[rank]) for rank, share in enumerate(shares)
    )
    notes += hiding_notes(workers[0].child_env(env), job.backend.vendor) if workers else []
    return workers, (*notes, *bind_notes)


def node_note(nodes: NodeGroup, count: int, master_addr: str, master_port: int) -> str:
    """``node 1 of 2: global rank 2 of 3 (2 + 1 workers), rendezvous at HOST:PORT``. Before
    the nodes meet, every node is assumed to run ``count`` workers, and the note says so."""
    first = nodes.rank_offset(count)
    ranks = f"global rank {first}" if count == 1 else f"global ranks {first}-{first + count - 1}"
    told = f" (from {nodes.source})" if nodes.source else ""
    if nodes.counts:
        counted = f" ({' + '.join(str(n) for n in nodes.counts)} workers)"
    else:
        counted = (
            f" if every node runs {count} (the nodes tell each other their counts when they "
            "meet; global ranks follow node order)"
        )
    return (
        f"node {nodes.node_rank} of {nodes.nnodes}{told}: {ranks} of "
        f"{nodes.world_size(count)}{counted}, rendezvous at {master_addr}:{master_port}"
    )


def skipped_text(notes: tuple[str, ...] | list[str]) -> str:
    """The devices a plan skipped, in a few words (``nvidia 3 busy, nvidia 1 leased``), from
    its ``"<device> (<PCI address>): skipped, <reason>"`` notes; integrated GPUs (never chosen
    unless named) are left out."""
    parts = (note.partition(": skipped, ") for note in notes)
    return ", ".join(
        f"{label.partition(' (')[0]} {_short_reason(reason)}"
        for label, skipped, reason in parts
        if skipped and not reason.startswith("integrated")
    )


def _short_reason(reason: str) -> str:
    if reason.startswith("leased"):
        return "leased"
    if "minimum" in reason:
        return "short of memory"
    if "busy" in reason:
        return "busy"
    return reason.partition(",")[0]


def _bindings(
    job: _Job, shares: tuple[tuple[int, ...], ...]
) -> tuple[tuple[Binding | None, ...], tuple[str, ...]]:
    """``--cpu-bind``: each worker near the devices it works on: its own with ``--isolate``,
    else the one its LOCAL_RANK picks (LOCAL_RANK modulo the selected devices)."""
    if job.request.cpu_bind == "none":
        return tuple(None for _ in shares), ()
    from xpulaunch.core.cpu_bind import CpuBind, bind_workers, parse_cpu_bind, topology_of

    mode = parse_cpu_bind(job.request.cpu_bind)
    if mode is CpuBind.NONE:
        return tuple(None for _ in shares), ()
    used = [
        [job.units[i] for i in share]
        if job.request.isolate or not share
        else [job.units[share[rank % len(share)]]]
        for rank, share in enumerate(shares)
    ]
    return bind_workers(mode, used, topology_of(job.inventory))


def _worker(
    job: _Job, share: tuple[int, ...], rank: int, count: int, binding: Binding | None
) -> WorkerPlan:
    request, parent_env = job.request, job.parent_env
    mine = [job.units[i] for i in share]
    env: dict[str, str | None] = dict(request.extra_env)
    env.update(
        child_visibility_env(
            job.backend.vendor, mine, job.inventory, parent_env, hierarchy=job.hierarchy
        )
    )
    if request.distributed:
        env.update(rank_env(rank, count, request.master_addr, request.master_port, request.nodes))
        env[MAX_RESTARTS_VAR] = "-1" if request.max_restarts is None else str(request.max_restarts)
        env.update(elastic_env(request.run_id, parent_env))
        if count > 1 and "OMP_NUM_THREADS" not in parent_env:
            env["OMP_NUM_THREADS"] = "1"
    if binding is not None and "OMP_NUM_THREADS" not in parent_env:
        env["OMP_NUM_THREADS"] = str(binding.threads)
    # processes.spawn binds the child to these CPUs before it executes the program; an
    # inherited value (xpulaunch run inside a bound worker) is not passed on unbound.
    env[CPUS_VAR] = binding.cpulist if binding is not None else None
    env["XPULAUNCH_BACKEND"] = job.backend.value
    env["XPULAUNCH_DEVICES"] = ",".join(u.key for u in mine) if mine else None
    chosen_map, budget = devicemap.worker_memory(
        mine,
        request.device_map,
        local_rank=rank,
        workers=count,
        isolate=request.isolate,
        share=request.share,
    )
    env["XPULAUNCH_DEVICE_MAP"] = chosen_map.value if chosen_map else None
    env["XPULAUNCH_MAX_MEMORY"] = budget
    return WorkerPlan(
        name=str(rank),
        rank=request.nodes.rank_offset(count) + rank,
        local_rank=rank,
        argv=request.argv,
        env=env_diff(env, parent_env),
        units=share,
    )


def rank_env(
    local_rank: int,
    nproc: int,
    master_addr: str,
    master_port: int,
    nodes: NodeGroup,
) -> dict[str, str]:
    """torchrun's per-worker variables, as its local elastic agent writes them for one role
    (``default``) under a static rendezvous: node ``node_rank`` of ``nnodes`` runs ``nproc``
    workers, and a worker's global rank is the count of the workers of the nodes before it
    plus its ``local_rank`` (``node_rank * nproc + local_rank`` while every node is assumed
    to run ``nproc``, before the nodes have met)."""
    return {
        **layout_env(nodes, nproc, local_rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(nodes.node_rank),
        "GROUP_WORLD_SIZE": str(nodes.nnodes),
        "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


# torchrun's agent sets these for every worker (LocalElasticAgent._start_workers); a value
# already in the parent's environment wins. Lightning's is_torchelastic_launched() looks for
# the run id; torch's NCCL process group reads the other to tear down a failed collective.
RUN_ID_VAR = "TORCHELASTIC_RUN_ID"
NCCL_ASYNC_VAR = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def elastic_env(run_id: str, parent_env: Mapping[str, str]) -> dict[str, str]:
    """``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``, "none" by default) and
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, each unless the parent has it."""
    wanted = {RUN_ID_VAR: run_id, NCCL_ASYNC_VAR: "1"}
    return {name: value for name, value in wanted.items() if name not in parent_env}


def with_layout(plan: Plan, counts: tuple[int, ...], parent_env: Mapping[str, str]) -> Plan:
    """``plan`` once the nodes have met: every node's worker count known, the global ranks
    and world size of this node's workers follow them, and so does the plan's node note."""
    nodes = replace(plan.nodes, counts=counts)
    count = len(plan.workers)
    workers = []
    for worker in plan.workers:
        env = {**worker.env, **layout_env(nodes, count, worker.local_rank)}
        rank = nodes.rank_offset(count) + worker.local_rank
        workers.append(replace(worker, rank=rank, env=env_diff(env, parent_env)))
    mark = f"node {nodes.node_rank} of {nodes.nnodes}"
    notes = tuple(
        _relaid(note, nodes, count) if note.startswith(mark) else note for note in plan.notes
    )
    return replace(plan, nodes=nodes, workers=tuple(workers), notes=notes)


def layout_env(nodes: NodeGroup, nproc: int, local_rank: int) -> dict[str, str]:
    """The rank variables that depend on the other nodes' worker counts."""
    rank = nodes.rank_offset(nproc) + local_rank
    world = str(nodes.world_size(nproc))
    return {
        "RANK": str(rank),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": world,
        "ROLE_WORLD_SIZE": world,
    }


def _relaid(note: str, nodes: NodeGroup, count: int) -> str:
    _, _, rendezvous = note.rpartition(", rendezvous at ")
    host, _, port = rendezvous.rpartition(":")
    return node_note(nodes, count, host, int(port)) if port.isascii() and port.isdigit() else note


def env_diff(
    changes: Mapping[str, str | None], parent_env: Mapping[str, str]
) -> dict[str, str | None]:
    """Keep only real differences: a value the parent lacks or has otherwise, or a removal of
    a variable the parent has (``None``)."""
    kept = (
        (name, value)
        for name, value in changes.items()
        if (name in parent_env if value is None else parent_env.get(name) != value)
    )
    return dict(sorted(kept))


def to_dict(plan: Plan) -> dict[str, Any]:
    """The plan document (docs/CONTRACT.md, section 4)."""
    return {
        "schema": SCHEMA,
        "backend": plan.backend.value,
        "devices": [
            {
                "vendor": u.device.vendor.value,
                "index": u.device.index,
                "tile": u.tile,
                "pci_bus_id": u.device.pci_bus_id,
                "uuid": u.device.uuid,
                "name": u.device.name,
                "memory_total_bytes": u.memory_total_bytes,
                "memory_free_bytes": u.memory_free_bytes,
                **({"mig_uuid": u.mig.uuid} if u.mig is not None else {}),
            }
            for u in plan.devices
        ],
        "workers": [
            {
                "name": w.name,
                "rank": w.rank,
                "local_rank": w.local_rank,
                "argv": list(w.argv),
                "env": dict(w.env),
                "devices": list(w.units),
            }
            for w in plan.workers
        ],
        # Variables every worker also gets, whose values exist only when it starts.
        "set_at_start": list(SET_AT_START),
        "device_map": plan.device_map.value if plan.device_map else None,
        "isolate": plan.isolate,
        "hierarchy": plan.hierarchy.value if plan.hierarchy else None,
        "nodes": {
            "nnodes": plan.nodes.nnodes,
            "node_rank": plan.nodes.node_rank,
            "source": plan.nodes.source,
            "hosts": list(plan.nodes.hosts),
            # Every node's worker count, once the nodes have met (empty in a dry run).
            "workers_per_node": list(plan.nodes.counts),
        },
        "share": _share_dict(plan),
        "notes": list(plan.notes),
    }


def _share_dict(plan: Plan) -> dict[str, Any] | None:
    """The job's share of each of its devices; null for a job that has them alone."""
    share = plan.share
    if share is None:
        return None
    return {
        "slots_per_gpu": share.slots,
        "gpu_memory_bytes": share.memory_bytes,
        "device_bytes": [share.claim_bytes(u.memory_total_bytes) for u in plan.devices],
    }
