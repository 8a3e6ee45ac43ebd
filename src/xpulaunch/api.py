"""The public Python API: probe, plan and (re-exported) the Supervisor.

Everything here is what the CLI does, minus the printing::

    import xpulaunch
    inventory = xpulaunch.probe()
    plan = xpulaunch.plan(["train.py"], gpus="2", nproc_per_node=None)
    print(xpulaunch.plan_document(plan)["workers"][0]["env"])
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xpulaunch.core import inventory as inventory_doc
from xpulaunch.core import plan as plan_doc
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.errors import InventoryError, LaunchError
from xpulaunch.model import DeviceMap, Inventory, Plan


def probe(**options: Any) -> Inventory:
    """Probe this host's accelerators without initialising any GPU runtime."""
    from xpulaunch.probe import probe_host

    inventory: Inventory = probe_host(**options)
    return inventory


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read an inventory document (``xpulaunch devices --json`` output)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"--inventory {path}: cannot read it ({exc.strerror})") from exc
    return inventory_doc.loads(text, source=str(path))


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    return inventory_doc.to_dict(inventory)


def plan_document(plan: Plan) -> dict[str, Any]:
    return plan_doc.to_dict(plan)


def resolve_argv(
    program: str, args: Sequence[str] = (), *, must_exist: bool = True
) -> tuple[tuple[str, ...], str | None]:
    """PROGRAM ``*.py`` runs under this interpreter; anything else is looked up on PATH.

    Returns the argv and, when the program could not be found and ``must_exist`` is False
    (a dry run for another machine), a note saying so.
    """
    if program.endswith(".py"):
        if Path(program).is_file():
            return (sys.executable, program, *args), None
        if must_exist:
            raise LaunchError(f"{program}: no such script")
        return (sys.executable, program, *args), f"{program}: no such script here"
    found = shutil.which(program)
    if found is None:
        if must_exist:
            raise LaunchError(f"{program}: command not found on PATH")
        return (program, *args), f"{program}: not found on PATH here"
    return (found, *args), None


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port for MASTER_PORT.

    Binding port 0 and closing it leaves a small window in which another process may take the
    port (landscape pitfall 13); rank 0 binds it within milliseconds of start, and a worker
    that fails to bind fails the gang, which is then restarted on the same plan.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


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
) -> Plan:
    """Plan a launch of ``program`` (argv list) exactly as ``xpulaunch run --dry-run`` does."""
    if not program:
        raise LaunchError("no PROGRAM given")
    argv, missing = resolve_argv(program[0], program[1:], must_exist=must_exist)
    if inventory is None:
        inventory = probe()
    elif not isinstance(inventory, Inventory):
        inventory = load_inventory(inventory)
    request = LaunchRequest(
        argv=argv,
        gpus=gpus,
        backend=backend,
        nproc_per_node=nproc_per_node,
        isolate=isolate,
        min_free_memory_bytes=min_free_memory_bytes,
        max_utilization_percent=max_utilization_percent,
        device_map=DeviceMap(device_map) if isinstance(device_map, str) else device_map,
        master_addr=master_addr,
        master_port=master_port if master_port is not None else free_port(master_addr),
    )
    env = dict(os.environ) if parent_env is None else parent_env
    result = make_plan(request, inventory, env, unavailable=unavailable)
    if missing:
        from dataclasses import replace

        result = replace(result, notes=(*result.notes, missing))
    return result
