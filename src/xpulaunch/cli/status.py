"""``xpulaunch status [--json] [--lock-dir DIR]``: who holds which device, and who waits."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.terminal import aligned, terminal_safe
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.leases.lock_files import HolderInfo
from xpulaunch.leases.manager import LeaseManager, LeaseRecord, StatusReport
from xpulaunch.leases.slots import SlotRecord
from xpulaunch.leases.wait_queue import WaiterRecord

SCHEMA = "xpulaunch.status/1"


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@lock_dir_option
def status(as_json: bool, lock_dir: str | None) -> int:
    """Show device leases and launches waiting for devices."""
    report = LeaseManager(lock_dir).status()
    click.echo(
        json.dumps(status_document(report), indent=2)
        if as_json
        else terminal_safe(status_text(report))
    )
    return 0


def status_document(report: StatusReport) -> dict[str, object]:
    """The ``xpulaunch.status/1`` document."""
    return {
        "schema": SCHEMA,
        "lock_dir": str(report.lock_dir),
        "lock_dir_kind": "shared" if report.shared_dir else "private",
        "lock_dir_exists": report.exists,
        "leases": [_lease_entry(lease) for lease in report.leases],
        "slots": [_slot_entry(slot) for slot in report.slots],
        "waiting": [_waiter_entry(waiter) for waiter in report.waiting],
    }


def _slot_entry(slot: SlotRecord) -> dict[str, object]:
    """A slot of a device shared by small jobs (--slots-per-gpu, --gpu-memory)."""
    return {
        "device": slot.key,
        "slot": slot.slot,
        "slots_per_gpu": slot.share.slots,
        "gpu_memory_bytes": slot.share.memory_bytes,
        **_holder_fields(slot.holder),
    }


def _lease_entry(lease: LeaseRecord) -> dict[str, object]:
    return {"device": lease.key, **_holder_fields(lease.holder), "holder_alive": lease.holder_alive}


def _waiter_entry(waiter: WaiterRecord) -> dict[str, object]:
    return {
        "position": waiter.position,
        **_holder_fields(waiter.holder),
        "waiting_for": _waiting_for(waiter),
        "stopped": waiter.stopped,
        "owner": waiter.owner,
        "ignored": waiter.ignored,
    }


def _waiting_for(waiter: WaiterRecord) -> str | None:
    """What it waits for; a stopped waiter's own last reason is stale, so say that instead."""
    if waiter.ignored is not None:
        return f"nothing: ignored, {waiter.ignored} (a file of {waiter.owner})"
    if waiter.stopped:
        return "nothing: stopped (Ctrl-Z?); later launches go first until it is continued"
    return waiter.waiting_for


def _holder_fields(holder: HolderInfo | None) -> dict[str, object]:
    """Every field null when the holder's record is missing (the lease itself is real)."""
    if holder is None:
        return dict.fromkeys(("pid", "command", "user", "since", "job_id", "hostname"))
    since = datetime.fromtimestamp(holder.since_s).astimezone().isoformat(timespec="seconds")
    return {
        "pid": holder.pid,
        "command": list(holder.argv),
        "user": holder.user,
        "since": since,
        "job_id": holder.job_id,
        "hostname": holder.hostname,
    }


def status_text(report: StatusReport) -> str:
    kind = "shared" if report.shared_dir else "private"
    lines = [f"lock directory: {report.lock_dir} ({kind})"]
    if not report.exists:
        return "\n".join([*lines, "no leases (the directory does not exist yet)"])
    if report.leases:
        rows = [_lease_row(lease) for lease in report.leases]
        lines += ["", *aligned([("DEVICE", "PID", "USER", "SINCE", "JOB", "COMMAND"), *rows])]
        if any(lease.holder_alive is False for lease in report.leases):
            lines.append("(exited): that xpulaunch is gone, but processes it started still run")
    elif not report.slots:
        lines.append("no devices are leased")
    if report.slots:
        rows = [_slot_row(slot) for slot in report.slots]
        header = ("DEVICE", "SLOT", "PID", "USER", "SINCE", "JOB", "COMMAND")
        lines += ["", "shared devices (a slot per job):", *aligned([header, *rows])]
    if report.waiting:
        rows = [_waiter_row(waiter) for waiter in report.waiting]
        header = ("#", "PID", "USER", "WAITED", "JOB", "COMMAND", "WAITING FOR")
        lines += ["", f"waiting launches ({len(rows)}):", *aligned([header, *rows])]
    return "\n".join(lines)


def _lease_row(lease: LeaseRecord) -> tuple[str, ...]:
    holder = lease.holder
    if holder is None:
        return (lease.key, "?", "?", "?", "?", "(holder record missing)")
    pid = str(holder.pid) if lease.holder_alive is not False else f"{holder.pid} (exited)"
    return (lease.key, pid, holder.user, holder.since(), holder.job_id, holder.command(_width()))


def _slot_row(slot: SlotRecord) -> tuple[str, ...]:
    of = f"/{slot.share.slots}" if slot.share.slots else ""
    holder = slot.holder
    if holder is None:
        return (slot.key, f"{slot.slot}{of}", "?", "?", "?", "?", "(holder record missing)")
    cells = (str(holder.pid), holder.user, holder.since(), holder.job_id, holder.command(_width()))
    return (slot.key, f"{slot.slot}{of}", *cells)


def _waiter_row(waiter: WaiterRecord) -> tuple[str, ...]:
    holder = waiter.holder
    reason = _waiting_for(waiter) or "its turn"
    if holder is None:
        owner = waiter.owner.removeprefix("user ") or "?"
        return (str(waiter.position), "?", owner, "?", "?", "?", reason)
    waited = f"{max(time.time() - holder.since_s, 0):.0f} s"
    cells = (str(holder.pid), holder.user, waited, holder.job_id, holder.command(_width(40)))
    return (str(waiter.position), *cells, reason)


def _width(on_a_terminal: int = 60) -> int | None:
    """How much of a command a row shows: cut to fit a terminal, whole in a pipe or a file
    (a script reading the table must not get a command cut short)."""
    return on_a_terminal if sys.stdout.isatty() else None
