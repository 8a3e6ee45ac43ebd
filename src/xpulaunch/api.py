"""The public Python API: what the CLI does, minus the printing::

import xpulaunch
inventory = xpulaunch.probe()
plan = xpulaunch.plan(["train.py"], gpus="2", nproc_per_node=None)
print(xpulaunch.plan_document(plan)["workers"][0]["env"])
status = xpulaunch.run(["train.py"], gpus="2", nproc_per_node=None, max_restarts=1)
"""

from __future__ import annotations

import os
import sys
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from xpulaunch.core import inventory as inventory_doc, plan as plan_doc
from xpulaunch.errors import UsageError
from xpulaunch.launch.plan import free_port, load_inventory, plan, probe
from xpulaunch.model import Inventory, Plan

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from xpulaunch.leases.wait_queue import WaitStatus
    from xpulaunch.supervisor.spec import WorkerSpec

__all__ = [
    "free_port",
    "inventory_document",
    "load_inventory",
    "plan",
    "plan_document",
    "probe",
    "run",
    "worker_specs",
]


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    _check(inventory, Inventory, "inventory", "an Inventory (xpulaunch.probe() makes one)")
    return inventory_doc.to_dict(inventory)


def plan_document(plan: Plan) -> dict[str, Any]:
    _check(plan, Plan, "plan", "a Plan (xpulaunch.plan(...) makes one)")
    return plan_doc.to_dict(plan)


def _check(value: object, kind: type, name: str, expected: str) -> None:
    if not isinstance(value, kind):
        raise UsageError(f"expected {expected}", option=name, value=value)


def worker_specs(
    plan: Plan,
    parent_env: Mapping[str, str] | None = None,
    *,
    lease_fds: tuple[int, ...] = (),
) -> list[WorkerSpec]:
    """The plan's workers as :class:`~xpulaunch.supervisor.spec.WorkerSpec`\\ s for a
    ``Supervisor``: each one's complete environment (the plan's diff applied to
    ``parent_env``)."""
    from xpulaunch.launch.run import specs_for_plan

    _check(plan, Plan, "plan", "a Plan (xpulaunch.plan(...) makes one)")
    env = dict(os.environ) if parent_env is None else parent_env
    return specs_for_plan(plan, env, lease_fds=lease_fds)


class _Lines:
    """Where :func:`run` says what ``xpulaunch run`` says before its workers speak."""

    def say(self, text: str) -> None:
        sys.stderr.write(f"xpulaunch: {text}\n")

    def on_wait(self, status: WaitStatus) -> None:
        from xpulaunch.leases.wait_queue import wait_line

        self.say(wait_line(status))


def run(
    program: Sequence[str], *, parent_env: Mapping[str, str] | None = None, **options: Any
) -> int:
    """Plan, lease devices and supervise ``program`` until it is over, as ``xpulaunch run``
    does; its exit status. ``options`` are the fields of
    :class:`~xpulaunch.launch.request.RunRequest`, named as the options are
    (``gpus="2"``, ``nproc_per_node=None`` for auto: one worker per device,
    ``max_restarts=1``, ``log_dir=...``)."""
    from xpulaunch.launch.request import RunRequest, check_program
    from xpulaunch.launch.run import run as run_request

    check_program(program)
    known = {each.name for each in fields(RunRequest)}
    unknown = sorted(options.keys() - known)
    if unknown:
        raise UsageError(
            f"not an option of run; expected one of {', '.join(sorted(known))}",
            option=unknown[0],
            value=options[unknown[0]],
        )
    env = dict(os.environ) if parent_env is None else dict(parent_env)
    return run_request(RunRequest(program=tuple(program), **options), env, _Lines())
