"""The values shell completion offers beyond click's own: ``--gpus`` with this host's device
ids (the probe's, which starts no GPU runtime, kept for :data:`DEVICE_CACHE_S` in the user's
private lock directory so that each Tab press does not probe again; or the ``--inventory``
file's), and job ids from the queue.

These callbacks are attached to options of other commands through
:func:`xpulaunch.cli.commands.completer`, which imports this module only when the shell asks;
it imports the probe and the queue only when a value is completed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import click
from click.shell_completion import CompletionItem

if TYPE_CHECKING:
    from xpulaunch.jobqueue.policy import Job
    from xpulaunch.model import Inventory

DEVICE_CACHE_S = 20.0  # how long a probe's device ids are reused: a burst of Tab presses
# What changes the probe's answer besides the host: the testing hooks and the masks it honours.
_PROBE_VARS = (
    "XPULAUNCH_SYSFS_ROOT",
    "XPULAUNCH_PROCFS_ROOT",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
)


# --gpus


def complete_gpus(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """``auto``, ``all``, ``none``, counts, and ``device=ID[,ID...]`` with this host's ids
    (or those of ``--inventory``); after ``device=0,`` the ids not named yet."""
    devices = device_ids(ctx.params.get("inventory") or os.environ.get("XPULAUNCH_INVENTORY"))
    if incomplete.startswith("device=") or "," in incomplete:
        head, _, _ = incomplete.rpartition(",")
        if not head:
            head = "device="
        else:
            head += ","
        named = set(head.removeprefix("device=").rstrip(",").split(","))
        values = [(head + i, about) for i, about in devices if i not in named]
    else:
        values = [("auto", "the free devices"), ("all", "every device"), ("none", "the CPU")]
        values += [
            (str(n), f"{n} device{'s' if n > 1 else ''}") for n in range(1, len(devices) + 1)
        ]
        values += [(f"device={i}", about) for i, about in devices]
    return [CompletionItem(v, help=about) for v, about in values if v.startswith(incomplete)]


def device_ids(inventory_path: str | None) -> list[tuple[str, str]]:
    """(the id ``--gpus`` takes, what the device is) for each card; none when they cannot be
    known (a bad inventory file: completion stays quiet rather than printing an error)."""
    from xpulaunch.errors import XpulaunchError

    try:
        if inventory_path:
            from xpulaunch.launch.plan import load_inventory

            return _ids(load_inventory(inventory_path))
        return _cached_probe(dict(os.environ))
    except (XpulaunchError, OSError, ValueError):
        return []


def _ids(inventory: Inventory) -> list[tuple[str, str]]:
    vendors = {d.vendor for d in inventory.devices}
    found = []
    for d in inventory.devices:
        ident = f"{d.vendor.value}:{d.index}" if len(vendors) > 1 else str(d.index)
        found.append((ident, " ".join(p for p in (d.vendor.value, str(d.index), d.name) if p)))
    return found


def _cached_probe(env: Mapping[str, str], now_s: float | None = None) -> list[tuple[str, str]]:
    """The probe's ids, from a cache file younger than :data:`DEVICE_CACHE_S` when there is
    one (in the private lock directory: nobody else can plant one)."""
    path = _cache_path(env)
    now_s = time.time() if now_s is None else now_s
    if path is not None:
        try:
            if now_s - os.stat(path).st_mtime < DEVICE_CACHE_S:
                with open(path, encoding="utf-8") as handle:
                    return [(str(i), str(about)) for i, about in json.load(handle)]
        except (OSError, ValueError, TypeError):
            pass  # none yet, or unreadable: probe again, below
    from xpulaunch.probing.host import probe_from_env

    ids = _ids(probe_from_env(env))
    if path is not None:
        _write(path, json.dumps(ids))
    return ids


def _cache_path(env: Mapping[str, str]) -> str | None:
    from xpulaunch.errors import XpulaunchError
    from xpulaunch.leases.lock_directory import LockDirectory

    directory = LockDirectory.default(env)
    try:
        directory.ensure(create=True)
    except (XpulaunchError, OSError):
        return None
    key = "\0".join(f"{name}={env.get(name, '')}" for name in _PROBE_VARS)
    return directory.join(
        f"completion-devices-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"
    )


def _write(path: str, text: str) -> None:
    """Replace ``path`` whole (a Tab press at the same time reads the old file or the new)."""
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    except OSError:
        return  # a full disk: the next Tab press probes again


def complete_file(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """A file name: the shell's own completion (``--inventory FILE``)."""
    return [CompletionItem(incomplete, type="file")]


# Job ids


def _queue_jobs(ctx: click.Context) -> list[Job]:
    from xpulaunch.errors import XpulaunchError
    from xpulaunch.jobqueue import actions, listing

    env = dict(os.environ)
    try:
        directory = actions.queue_directory(ctx.params.get("lock_dir"), env)
        return list(listing.take(directory, env, ended=ctx.command.name == "logs").jobs)
    except (XpulaunchError, OSError):
        return []


def _job_items(
    jobs: Sequence[Job], incomplete: str, already: Sequence[str]
) -> list[CompletionItem]:
    from xpulaunch.jobqueue.listing import command_text

    return [
        CompletionItem(str(j.id), help=f"{j.state.value}  {command_text(j.command)}")
        for j in jobs
        if str(j.id).startswith(incomplete) and str(j.id) not in already
    ]


def _jobs_completer(keep: Callable[[Job], bool]) -> Callable[..., list[CompletionItem]]:
    def complete_ids(
        ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        already = ctx.params.get(param.name or "") or ()
        if isinstance(already, str):
            already = (already,)
        return _job_items([j for j in _queue_jobs(ctx) if keep(j)], incomplete, already)

    return complete_ids


def _mine_and(*states: str) -> Callable[[Job], bool]:
    return lambda job: job.uid == os.getuid() and job.state.value in states


complete_cancellable = _jobs_completer(_mine_and("queued", "held", "starting", "running"))
complete_holdable = _jobs_completer(_mine_and("queued"))
complete_held = _jobs_completer(_mine_and("held"))
complete_waitable = _jobs_completer(lambda job: True)  # any user's job that has not ended


def complete_run(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """``logs``' RUN: a job id of the queue, or else a log folder."""
    jobs = _job_items(_queue_jobs(ctx), incomplete, ())
    if jobs and (incomplete == "" or incomplete.isdigit()):
        return jobs
    return [CompletionItem(incomplete, type="dir")]
