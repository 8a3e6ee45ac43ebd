"""Planning a launch: the program resolved, the inventory probed or read, and the pure
:func:`~xpulaunch.core.plan.make_plan` called, as ``xpulaunch run --dry-run`` does.
:func:`xpulaunch.plan` is :func:`plan`."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from xpulaunch.core.plan import LaunchRequest, check_topology, make_plan
from xpulaunch.errors import InventoryError, UsageError, check_plain
from xpulaunch.launch.request import check_program
from xpulaunch.model import DeviceMap, DeviceShare, Inventory, NodeGroup, Plan
from xpulaunch.nodes.settings import DEFAULT_PORT
from xpulaunch.processes import ports
from xpulaunch.processes.program import resolve_program

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


def probe(env: Mapping[str, str] | None = None, *, use_torch: bool = False) -> Inventory:
    """Probe this host's accelerators without initialising any GPU runtime.

    ``env`` is the environment the probe's tools run with (default: this process's); the
    probe strips the visibility variables that would hide devices from them. The inventory's
    ``problems`` list everything ``xpulaunch devices --debug`` shows, a tool that is not
    installed included: a caller decides what to ignore.
    """
    from xpulaunch.probing.host import probe_from_env

    return probe_from_env(
        dict(os.environ) if env is None else env, use_torch=use_torch, report_missing=True
    )


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read an inventory document (``xpulaunch devices --json`` output)."""
    from functools import partial

    from xpulaunch.core import inventory as inventory_doc
    from xpulaunch.textfiles import read_regular_file

    if not isinstance(path, str | os.PathLike):
        raise UsageError("expected the path of an inventory document", option="path", value=path)
    bad = partial(InventoryError, option="inventory", value=os.fspath(path))
    limit = inventory_doc.MAX_DOCUMENT_CHARS
    try:
        data = read_regular_file(path, limit)
        if len(data) > limit:
            raise bad(f"larger than {limit // 2**20} MiB")
        text = data.decode("utf-8")
    except OSError as exc:
        raise bad(f"cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 text ({exc.reason})") from exc
    return inventory_doc.loads(text, source=str(path))


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port for MASTER_PORT: rank 0 binds it as it starts, and a worker
    that fails to bind fails the gang, which is then restarted on the same plan."""
    hint = (
        "give an IPv4 address or name of this host, or a --master-port too when the master "
        "runs elsewhere"
    )
    return ports.free_port(host, option="master_addr", hint=hint)


def plan(
    program: Sequence[str],
    *,
    gpus: str = "auto",
    backend: str | None = None,
    nproc_per_node: int | None = 1,
    isolate: bool = False,
    min_free_memory_bytes: int | None = None,
    max_utilization_percent: float | None = None,
    device_map: DeviceMap | str | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    inventory: Inventory | str | os.PathLike[str] | None = None,
    parent_env: Mapping[str, str] | None = None,
    unavailable: Mapping[str, str] | None = None,
    must_exist: bool = True,
    max_restarts: int | None = 0,
    extra_env: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
    nodes: NodeGroup | None = None,
    gpu_ids: str | None = None,
    cpu_bind: str | None = None,
    share: DeviceShare | None = None,
    run_id: str = "none",
    topology: str = "prefer",
) -> Plan:
    """Plan a launch of ``program`` (argv list) exactly as ``xpulaunch run --dry-run`` does.

    ``nproc_per_node``: how many workers (default 1, which then sees every selected device);
    None is ``--nproc-per-node auto``: one worker per selected device. ``max_restarts`` is
    what the workers see as ``TORCHELASTIC_MAX_RESTARTS``: 0 when they are not restarted,
    None for no limit. ``extra_env`` is given to every worker under the
    plan's own variables (device masks, ranks), which win; ``notes`` are added to the plan's.
    ``nodes``: this machine's place in a job of several nodes; there ``master_port`` defaults
    to torchrun's 29500, since every node must name the same. ``unavailable`` maps a unit's
    lease key to who holds it; ``must_exist`` False: a program missing here is a note (a
    plan for another machine). ``gpu_ids`` (accelerate's): device ordinals as the children's
    runtime numbers them (Intel: flat tiles under FLAT), used instead of ``gpus``.
    ``cpu_bind``: ``none`` (default), ``numa`` or ``exclusive``: each worker's CPUs near its
    devices (``--cpu-bind``). ``share``: share each device with other small jobs
    (``--slots-per-gpu``, ``--gpu-memory``). ``run_id``: the workers' ``TORCHELASTIC_RUN_ID``
    (torchrun's ``--rdzv-id``). ``topology``: ``prefer`` (default), ``require`` or ``ignore``
    a set of devices in one link group, then under one PCIe switch, then on one NUMA node
    (``--topology``).
    """
    arguments = locals()
    check_program(program)
    for name, annotation in plan.__annotations__.items():  # a Python caller's wrong type
        if name in arguments:
            check_plain(name, arguments[name], annotation)
    resolved = resolve_program(program, must_exist=must_exist)  # on this process's PATH
    request = LaunchRequest(
        argv=resolved.argv,
        gpus=gpus,
        backend=backend,
        nproc_per_node=nproc_per_node,
        isolate=isolate,
        min_free_memory_bytes=min_free_memory_bytes,
        max_utilization_percent=max_utilization_percent,
        device_map=DeviceMap(device_map) if isinstance(device_map, str) else device_map,
        master_addr=master_addr,
        master_port=master_port_for(master_port, master_addr, nodes),
        max_restarts=max_restarts,
        extra_env=tuple(sorted((extra_env or {}).items())),
        nodes=nodes or NodeGroup(),
        gpu_ids=gpu_ids,
        cpu_bind=cpu_bind or "none",
        share=share,
        run_id=run_id,
        topology=check_topology(topology),
    )
    env = dict(os.environ) if parent_env is None else parent_env
    found = inventory_of(inventory, env)
    notes = (*([resolved.note] if resolved.note else []), *notes)
    return plan_launch(request, found, env, unavailable=unavailable, notes=notes)


def inventory_of(
    inventory: Inventory | str | os.PathLike[str] | None, env: Mapping[str, str]
) -> Inventory:
    """The inventory to plan on: this host's (probed), a document's, or the one given."""
    if inventory is None:
        return probe(env)
    if isinstance(inventory, Inventory):
        return inventory
    return load_inventory(inventory)


def plan_launch(
    request: LaunchRequest,
    inventory: Inventory,
    parent_env: Mapping[str, str],
    *,
    unavailable: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
) -> Plan:
    """The pure plan, with ``notes`` (the program's, the caller's) added to its own."""
    result = make_plan(request, inventory, parent_env, unavailable=unavailable)
    return replace(result, notes=(*result.notes, *notes)) if notes else result


def master_port_for(port: int | None, master_addr: str, nodes: NodeGroup | None) -> int:
    """The port given; torchrun's 29500 on several nodes (every node must name the same);
    else a free one."""
    if port is not None:
        return port
    if nodes is not None and nodes.nnodes > 1:
        return DEFAULT_PORT
    return free_port(master_addr)
