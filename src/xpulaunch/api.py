"""The public Python API: probe, plan and (re-exported) the Supervisor.

Everything here is what the CLI does, minus the printing::

    import xpulaunch
    inventory = xpulaunch.probe()
    plan = xpulaunch.plan(["train.py"], gpus="2", nproc_per_node=None)
    print(xpulaunch.plan_document(plan)["workers"][0]["env"])
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from xpulaunch.core import inventory as inventory_doc
from xpulaunch.core import plan as plan_doc
from xpulaunch.core.nodes import DEFAULT_PORT
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.errors import InventoryError, LaunchError
from xpulaunch.model import DeviceMap, DeviceShare, Inventory, NodeGroup, Plan
from xpulaunch.processes import ports
from xpulaunch.processes.program import resolve_program

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from xpulaunch.supervisor.spec import WorkerSpec


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
    try:
        data = _read_regular_file(path, inventory_doc.MAX_DOCUMENT_CHARS)
        if len(data) > inventory_doc.MAX_DOCUMENT_CHARS:
            raise InventoryError(
                f"larger than {inventory_doc.MAX_DOCUMENT_CHARS // 2**20} MiB",
                option="inventory",
                value=os.fspath(path),
            )
        text = data.decode("utf-8")
    except OSError as exc:
        raise InventoryError(
            f"cannot read it ({exc.strerror})", option="inventory", value=os.fspath(path)
        ) from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(
            f"not UTF-8 text ({exc.reason})", option="inventory", value=os.fspath(path)
        ) from exc
    return inventory_doc.loads(text, source=str(path))


def _read_regular_file(path: str | os.PathLike[str], limit_bytes: int) -> bytes:
    """A regular file's bytes, at most ``limit_bytes`` (+1, so the parser sees it is too big).

    Opened without blocking and checked before reading: a FIFO would block the open (and the
    read) for ever, and ``/dev/zero`` never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return handle.read(limit_bytes + 1)


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    return inventory_doc.to_dict(inventory)


def plan_document(plan: Plan) -> dict[str, Any]:
    return plan_doc.to_dict(plan)


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
    share: DeviceShare | None = None,
) -> Plan:
    """Plan a launch of ``program`` (argv list) exactly as ``xpulaunch run --dry-run`` does.

    ``max_restarts`` is what the workers see as ``TORCHELASTIC_MAX_RESTARTS``: 0 when they
    are not restarted, None for no limit (:attr:`RunOptions.restart_limit` of the options
    the plan will run with). ``extra_env`` is given to every worker under the plan's own
    variables (device masks, ranks), which win; ``notes`` are added to the plan's.
    the plan will run with). ``nodes``: this machine's place in a job of several nodes;
    there ``master_port`` defaults to torchrun's 29500, since every node must name the same.
    ``share``: share each device with other small jobs (``--slots-per-gpu``, ``--gpu-memory``).
    """
    if not program:
        raise LaunchError("no PROGRAM given")
    resolved = resolve_program(program, must_exist=must_exist)  # on this process's PATH
    if inventory is None:
        inventory = probe(parent_env)
    elif not isinstance(inventory, Inventory):
        inventory = load_inventory(inventory)
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
        master_port=_master_port(master_port, master_addr, nodes),
        max_restarts=max_restarts,
        extra_env=tuple(sorted((extra_env or {}).items())),
        nodes=nodes or NodeGroup(),
        share=share,
    )
    env = dict(os.environ) if parent_env is None else parent_env
    result = make_plan(request, inventory, env, unavailable=unavailable)
    extra_notes = (*([resolved.note] if resolved.note else []), *notes)
    if extra_notes:
        from dataclasses import replace

        result = replace(result, notes=(*result.notes, *extra_notes))
    return result


def _master_port(port: int | None, master_addr: str, nodes: NodeGroup | None) -> int:
    if port is not None:
        return port
    if nodes is not None and nodes.nnodes > 1:
        return DEFAULT_PORT
    return free_port(master_addr)


def worker_specs(
    plan: Plan,
    parent_env: Mapping[str, str] | None = None,
    *,
    lease_fds: tuple[int, ...] = (),
) -> list[WorkerSpec]:
    """The plan's workers as :class:`~xpulaunch.supervisor.spec.WorkerSpec`s for a ``Supervisor``:
    each one's complete environment (the plan's diff applied to ``parent_env``)."""
    from xpulaunch.launch.run import specs_for_plan

    env = dict(os.environ) if parent_env is None else parent_env
    return specs_for_plan(plan, env, lease_fds=lease_fds)
