"""``xpulaunch top [--once] [--interval S] [--inventory FILE] [--lock-dir DIR]``: a live view
linking devices to jobs: each device's memory and utilisation, the job or launch holding it
(queue job, user, command), the jobs sharing its slots, other processes on it, and the queue.

Drawn with the standard library's ``curses``: each refresh redraws into curses' buffer and
``doupdate()`` sends only what changed, so the screen does not flicker (also over ssh); ``q``
quits. ``--once`` prints one frame as plain text, for scripts. With ``--inventory`` the
devices are that file's (readings as written there; no processes are listed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.terminal import cut, output_width
from xpulaunch.cli.top_view import DeviceRow, Frame, render
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import XpulaunchError
from xpulaunch.jobqueue import actions, listing
from xpulaunch.jobqueue.policy import Job, JobState, short_devices
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.leases.lock_files import HolderInfo
from xpulaunch.leases.manager import StatusReport
from xpulaunch.model import Device, Inventory

KEY_POLL_MS = 100  # how often a key press is looked for between refreshes


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--once", is_flag=True, help="Print one frame as text and exit (for scripts).")
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 3600),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Time between refreshes.",
)
@click.option(
    "--inventory",
    envvar="XPULAUNCH_INVENTORY",
    metavar="FILE",
    help="Show this inventory document's devices instead of probing [env: XPULAUNCH_INVENTORY].",
)
@lock_dir_option
def top(once: bool, interval: float, inventory: str | None, lock_dir: str | None) -> int:
    """Live view of devices, the jobs holding them, and the queue (q quits)."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    loaded = None  # the file's devices, read once; else the host is probed at each refresh
    if inventory is not None:
        from xpulaunch.api import load_inventory

        loaded = load_inventory(inventory)
    if once:
        lines = render(gather(directory, env, loaded), output_width())
        click.echo("\n".join(line.text for line in lines))
        return 0
    if not sys.stdout.isatty():
        raise XpulaunchError("xpulaunch top needs a terminal; use --once for a script")
    term = env.get("TERM", "")
    if term in ("", "dumb"):  # Emacs's shell: curses would draw rows of blanks
        said = f"TERM={term}" if term else ("TERM is empty" if "TERM" in env else "no TERM")
        raise XpulaunchError(
            f"xpulaunch top needs a terminal that can move its cursor ({said}); use --once"
        )
    drawn_as = drawable_term(term)
    notes = () if drawn_as == term else (f"TERM={term}: no terminfo here; drawn as {drawn_as}",)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C quits as q does
        _live(lambda: _noted(gather(directory, env, loaded, live=True), notes), interval, drawn_as)
    return 0


# Terminal types to draw as when the host lacks the terminfo entry of TERM: ssh from kitty
# (xterm-kitty), ghostty or alacritty into a server that does not know them. These terminals
# all speak xterm's sequences, and what top sends (cursor moves, bold) is in even vt100's.
FALLBACK_TERMS = ("xterm-256color", "xterm", "vt100")


def drawable_term(term: str) -> str:
    """``term`` if this host has its terminfo entry, else the first of
    :data:`FALLBACK_TERMS` it has; none of them is a one-line error."""
    import curses

    for name in (term, *FALLBACK_TERMS):
        try:
            curses.setupterm(name, sys.stdout.fileno())
        except curses.error:  # "could not find terminal"
            continue
        return name
    raise XpulaunchError(
        f"xpulaunch top: this host has no terminfo entry for TERM={term} (nor for "
        f"{', '.join(FALLBACK_TERMS)}); use --once"
    )


def _noted(frame: Frame, notes: tuple[str, ...]) -> Frame:
    return dataclasses.replace(frame, notes=(*frame.notes, *notes)) if notes else frame


def gather(
    directory: LockDirectory, env: Mapping[str, str], loaded: Inventory | None, live: bool = False
) -> Frame:
    """One frame: the devices (``loaded``, else probed now), the leases and the queue as they
    are now. A ``live`` one's title says first that q quits (the end of a title may be cut)."""
    notes: list[str] = []
    try:
        snapshot = listing.take(directory, env)
    except XpulaunchError as exc:  # a locked database: say so, keep showing the devices
        notes.append(f"queue: {exc.cli_message()}")
        snapshot = listing.Snapshot(str(directory.root), directory.shared, time.time())
    if loaded is None:
        from xpulaunch.probing.host import probe_from_env

        inventory = probe_from_env(env)
        processes = _processes(inventory, env, _holding_jobs(snapshot.leases), notes)
    else:
        inventory, processes = loaded, {}
        notes.append("processes: not listed (the devices come from an inventory file)")
    by_pid = {j.pid: j for j in snapshot.jobs if j.pid and j.state in _HOLDING}
    rows = tuple(
        _device_row(d, snapshot.leases, by_pid, processes.get(d.key, ())) for d in inventory.devices
    )
    runners = ", ".join(f"{u} pid {p}" for u, p in listing.runner_names(snapshot).items())
    kind = "shared" if directory.shared else "private"
    title = f"xpulaunch top{' (q quits)' if live else ''}  {time.strftime('%H:%M:%S')}"
    title += f"  {directory.root} ({kind})  runner: {runners or 'none'}"
    return Frame(
        title=title,
        devices=rows,
        queue_summary=_summary(snapshot),
        queue_header=listing.HEADER,
        queue_rows=tuple(listing.table_rows(snapshot)),
        notes=tuple(notes),
    )


_HOLDING = (JobState.STARTING, JobState.RUNNING)


def _device_row(
    device: Device,
    report: StatusReport | None,
    jobs: Mapping[int, Job],
    others: Sequence[str],
) -> DeviceRow:
    holders: list[str] = []
    if report is not None:
        for lease in report.leases:
            if _on(device, lease.key):
                holders.append(_holder(lease.holder, jobs, lease.key, device))
        for slot in report.slots:
            if _on(device, slot.key):
                holders.append("slot: " + _holder(slot.holder, jobs, slot.key, device))
    return DeviceRow(
        label=short_devices([device.label()]),
        name=device.name,
        memory_used_bytes=device.memory_used_bytes,
        memory_total_bytes=device.memory_total_bytes,
        utilization_percent=device.utilization_percent,
        holders=tuple(holders),
        others=tuple(others),
    )


def _on(device: Device, key: str) -> bool:
    return key == device.key or key.startswith(device.key + "/")


def _holder(holder: HolderInfo | None, jobs: Mapping[int, Job], key: str, device: Device) -> str:
    part = "" if key == device.key else f"[{key.removeprefix(device.key + '/')}] "
    if holder is None:
        return part + "a launch whose record is missing"
    job = jobs.get(holder.pid)
    if job is not None:
        return f"{part}job {job.id}  {job.user}  {listing.command_text(job.command)}"
    return f"{part}pid {holder.pid}  {holder.user}  {holder.command(60)}"


def _holding_jobs(report: StatusReport | None) -> set[tuple[str, str]]:
    """(device key, job id) of every lease and slot: whose processes a holder line names."""
    if report is None:
        return set()
    return {(key.split("/")[0], holder.job_id) for key, holder in report.holders()}


def _processes(
    inventory: Inventory,
    env: Mapping[str, str],
    holding: set[tuple[str, str]],
    notes: list[str],
) -> dict[str, list[str]]:
    """Processes using each device (probed hosts only): pid, user, memory, command. Those of
    a job that holds the device are left to its holder line; any other is listed, an
    xpulaunch job's too (a device its job did not lease, or an ``XPULAUNCH_JOB_ID`` a shell
    kept after its job)."""
    if not inventory.devices:
        return {}
    from xpulaunch.probing.gpu_processes import gpu_processes

    found, problems = gpu_processes(
        inventory.devices, proc_root=env.get("XPULAUNCH_PROCFS_ROOT") or "/proc"
    )
    notes += [str(p) for p in problems[:2]]
    per_device: dict[str, list[str]] = {}
    for process in found:
        if (process.device_key, process.job_id) in holding:
            continue
        memory = (
            "" if process.memory_bytes is None else f" ({process.memory_bytes / 1024**3:.1f} GiB)"
        )
        command = cut(process.command or "?", 50)
        text = f"pid {process.pid}  {process.user or '?'}  {command}{memory}"
        per_device.setdefault(process.device_key, []).append(text)
    return per_device


def _summary(snapshot: listing.Snapshot) -> str:
    counts = Counter(listing.shown_state(job) for job in snapshot.jobs if not job.state.ended)
    counts["waiting"] += len(snapshot.waiters)
    order = ("running", "starting", "waiting", "queued", "held")
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s)) or "empty"


def _live(frame: Callable[[], Frame], interval_s: float, term: str) -> None:
    import curses
    import locale

    locale.setlocale(locale.LC_ALL, "")
    # curses.initscr() takes the terminal type from TERM in this process's environment, and
    # Python has no newterm() to give it another: a fallback type has to be put there.
    os.environ["TERM"] = term
    curses.wrapper(_loop, frame, interval_s)


def _loop(screen: Any, frame: Callable[[], Frame], interval_s: float) -> None:
    import curses

    with contextlib.suppress(curses.error):  # a terminal without an invisible cursor
        curses.curs_set(0)
    screen.timeout(KEY_POLL_MS)
    current = frame()
    next_s = time.monotonic() + interval_s
    _draw(screen, current)
    while True:
        key = screen.getch()
        if key in (ord("q"), ord("Q")):
            return
        if time.monotonic() >= next_s:
            current = frame()
            next_s = time.monotonic() + interval_s
            _draw(screen, current)
        elif key == curses.KEY_RESIZE:
            _draw(screen, current)


def _draw(screen: Any, current: Frame) -> None:
    """Redraw into curses' buffer; doupdate() sends the terminal only the changes."""
    import curses

    height, width = screen.getmaxyx()
    screen.erase()
    for row, line in enumerate(render(current, width, height)):
        # The last cell of the last row cannot be written without scrolling: stop before it.
        room = width - 1 if row == height - 1 else width
        try:
            screen.addnstr(row, 0, line.text, room, curses.A_BOLD if line.strong else 0)
        except curses.error:
            break  # a terminal shrunk under us: the next refresh fits it again
    screen.noutrefresh()
    curses.doupdate()
