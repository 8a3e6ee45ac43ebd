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
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS, completer
from xpulaunch.cli.terminal import output_width
from xpulaunch.cli.top_keys import HELP, View, keeps, on_key
from xpulaunch.cli.top_view import DeviceRow, Frame, History, ProcessRow, render, sorted_processes
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import UsageError, XpulaunchError
from xpulaunch.jobqueue import actions, listing
from xpulaunch.jobqueue.policy import Job, JobState, short_devices
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.leases.lock_files import HolderInfo
from xpulaunch.leases.manager import StatusReport
from xpulaunch.model import Device, Inventory

if TYPE_CHECKING:
    from xpulaunch.probing.sampler import Sample, Sampler

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
    shell_complete=completer("complete_file"),
    help="Show this inventory document's devices instead of probing [env: XPULAUNCH_INVENTORY].",
)
@click.option("--json", "as_json", is_flag=True, help="With --once: the frame as JSON.")
@lock_dir_option
def top(
    once: bool, interval: float, inventory: str | None, as_json: bool, lock_dir: str | None
) -> int:
    """Live view of devices, their processes and jobs, and the queue (? lists the keys)."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    if as_json and not once:
        raise UsageError("--json goes with --once (the live view is for people)")
    loaded = None  # the file's devices, read once; else the host is sampled at each refresh
    if inventory is not None:
        from xpulaunch.api import load_inventory

        loaded = load_inventory(inventory)
    if once:
        taken = _probe_once(env) if loaded is None else None
        frame = gather(directory, env, loaded, sample=taken)
        if as_json:
            click.echo(json.dumps(frame_document(frame), indent=2))
            return 0
        lines = render(frame, output_width())
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
    with contextlib.ExitStack() as stack:
        sampler = None
        if loaded is None:  # one sampler for the whole view (probing/sampler.py says why)
            from xpulaunch.probing.sampler import Sampler

            sampler = stack.enter_context(Sampler(env, interval))
        live = LiveView(directory, env, loaded, sampler, notes)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C quits as q does
            _live(live, interval, drawn_as)
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
    directory: LockDirectory,
    env: Mapping[str, str],
    loaded: Inventory | None,
    live: bool = False,
    *,
    sample: Sample | None = None,
    view: View | None = None,
    history: History | None = None,
) -> Frame:
    """One frame: the devices (``loaded``, else the ``sample``'s), the leases and the queue
    as they are now; with a ``view`` (the live one), its sort, filter and legend."""
    notes: list[str] = []
    try:
        snapshot = listing.take(directory, env)
    except XpulaunchError as exc:  # a locked database: say so, keep showing the devices
        notes.append(f"queue: {exc.cli_message()}")
        snapshot = listing.Snapshot(str(directory.root), directory.shared, time.time())
    view = view or View()
    if loaded is None and sample is not None:
        inventory = sample.inventory
        processes = _process_rows(sample, snapshot, view)
        notes += list(sample.problems[:2])
    elif loaded is None:
        inventory, processes = Inventory(devices=()), {}
        notes.append("devices: waiting for the first sample")
    else:
        inventory, processes = loaded, {}
        notes.append("processes: not listed (the devices come from an inventory file)")
    by_pid = {j.pid: j for j in snapshot.jobs if j.pid and j.state in _HOLDING}
    rows = []
    for device in inventory.devices:
        row = _device_row(device, snapshot.leases, by_pid, ())
        if history is not None:
            history.record(
                device.key,
                device.utilization_percent,
                device.memory_used_bytes,
                device.memory_total_bytes,
            )
            util, memory = history.of(device.key)
            row = dataclasses.replace(row, utilization_history=util, memory_history=memory)
        rows.append(
            dataclasses.replace(
                row,
                processes=sorted_processes(processes.get(device.key, ()), view.sort),
                temperature_celsius=_reading(device, "temperature_celsius"),
                power_watts=_reading(device, "power_watts"),
            )
        )
    runners = ", ".join(f"{u} pid {p}" for u, p in listing.runner_names(snapshot).items())
    kind = "shared" if directory.shared else "private"
    title = f"xpulaunch top  {time.strftime('%H:%M:%S')}"
    title += f"  {directory.root} ({kind})  runner: {runners or 'none'}"
    return Frame(
        title=title,
        devices=tuple(rows),
        queue_summary=_summary(snapshot),
        queue_header=listing.HEADER,
        queue_rows=tuple(listing.table_rows(snapshot)) if view.queue else (),
        notes=tuple(notes),
        legend=view.legend() if live else "",
        extra=HELP if view.help else (() if view.queue else ("(queue hidden: Tab shows it)",)),
    )


def _reading(device: Device, key: str) -> float | None:
    value = device.extra.get(key)
    return float(value) if isinstance(value, int | float) else None


def _probe_once(env: Mapping[str, str]) -> Sample:
    """``--once`` on this host: one sample taken here (a short-lived process may load NVML)."""
    from xpulaunch.probing.sampler import sample_here

    return sample_here(env)


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


def _process_rows(
    sample: Sample, snapshot: listing.Snapshot, view: View
) -> dict[str, list[ProcessRow]]:
    """Each device's processes: pid, user, the queue job (by its lease's job id) or the
    model a llama-server serves, memory, command; those the view's filter keeps."""
    by_lease = {j.lease_job: j.id for j in snapshot.jobs if j.lease_job}
    me = actions.user_name(os.getuid())
    rows: dict[str, list[ProcessRow]] = {}
    for process in sample.processes:
        owner = _owner(process.job_id, process.command or "", by_lease)
        if not keeps(view, process.user, owner, me):
            continue
        command = process.command or "?"
        row = ProcessRow(process.pid, process.user, owner, process.memory_bytes, command)
        rows.setdefault(process.device_key, []).append(row)
    return rows


def _owner(job_id: str | None, command: str, by_lease: Mapping[str, int]) -> str:
    if job_id is not None and job_id in by_lease:
        return f"job {by_lease[job_id]}"
    words = command.split()
    if words and os.path.basename(words[0]).startswith("llama-server"):
        for flag in ("--alias", "-a", "--model", "-m"):
            if flag in words[:-1]:
                return "model " + os.path.basename(words[words.index(flag) + 1])
    return "xpulaunch" if job_id is not None else "-"


def frame_document(frame: Frame) -> dict[str, object]:
    """``top --once --json``: what the frame shows, as data."""
    devices = []
    for d in frame.devices:
        devices.append(
            {
                "device": d.label,
                "name": d.name,
                "memory_used_bytes": d.memory_used_bytes,
                "memory_total_bytes": d.memory_total_bytes,
                "utilization_percent": d.utilization_percent,
                "temperature_celsius": d.temperature_celsius,
                "power_watts": d.power_watts,
                "held_by": list(d.holders),
                "processes": [dataclasses.asdict(p) for p in d.processes],
            }
        )
    queue: list[dict[str, str | None]] = []
    for cells, reason in frame.queue_rows:
        queue.append(
            {**dict(zip(frame.queue_header, cells, strict=True)), "reason": reason or None}
        )
    return {
        "schema": "xpulaunch.top/1",
        "devices": devices,
        "queue": queue,
        "queue_summary": frame.queue_summary,
        "notes": list(frame.notes),
    }


def _summary(snapshot: listing.Snapshot) -> str:
    counts = Counter(listing.shown_state(job) for job in snapshot.jobs if not job.state.ended)
    counts["waiting"] += len(snapshot.waiters)
    order = ("running", "starting", "waiting", "queued", "held")
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s)) or "empty"


class LiveView:
    """What the live view keeps between frames: the sampler, the histories, the key state."""

    def __init__(
        self,
        directory: LockDirectory,
        env: Mapping[str, str],
        loaded: Inventory | None,
        sampler: Sampler | None,
        notes: tuple[str, ...],
    ) -> None:
        self.directory, self.env, self.loaded, self.sampler = directory, env, loaded, sampler
        self.notes = notes
        self.view = View()
        self.history = History()

    def frame(self, *, record: bool = True) -> Frame:
        sample = None if self.sampler is None else self.sampler.latest(wait_s=10.0)
        notes = self.notes
        if self.sampler is not None and (status := self.sampler.ended()) is not None:
            notes = (*notes, f"devices: the sampler ended (exit status {status}); restart top")
        frame = gather(
            self.directory,
            self.env,
            self.loaded,
            live=True,
            sample=sample,
            view=self.view,
            history=self.history if record else None,
        )
        return _noted(frame, notes)

    def key(self, key: str) -> bool:
        """Act on a key; False to quit."""
        self.view, action = on_key(self.view, key)
        if action is None:
            return True
        if action.kind == "quit":
            return False
        self.view = dataclasses.replace(self.view, message=self._cancel(action.job_id or 0))
        return True

    def _cancel(self, job_id: int) -> str:
        from xpulaunch.jobqueue.store import Store

        try:
            store = Store.open(self.directory, self.env, create=False)
            if store is None:
                return f"no job {job_id}: {self.directory.root} has no queue"
            with store:
                return actions.cancel(self.directory, store, job_id)
        except XpulaunchError as exc:
            return exc.cli_message()


def _live(live: LiveView, interval_s: float, term: str) -> None:
    import curses
    import locale

    locale.setlocale(locale.LC_ALL, "")
    # curses.initscr() takes the terminal type from TERM in this process's environment, and
    # Python has no newterm() to give it another: a fallback type has to be put there.
    os.environ["TERM"] = term
    curses.wrapper(_loop, live, interval_s)


def _loop(screen: Any, live: LiveView, interval_s: float) -> None:
    import curses

    with contextlib.suppress(curses.error):  # a terminal without an invisible cursor
        curses.curs_set(0)
    screen.timeout(KEY_POLL_MS)
    current = live.frame()
    next_s = time.monotonic() + interval_s
    _draw(screen, current)
    while True:
        key = screen.getch()
        if key == curses.KEY_RESIZE:
            _draw(screen, current)
        elif key != -1:
            if not live.key(_key_text(key)):
                return
            current = live.frame(record=False)  # the key's effect at once, no new sample
            _draw(screen, current)
        if time.monotonic() >= next_s:
            current = live.frame()
            next_s = time.monotonic() + interval_s
            _draw(screen, current)


def _key_text(key: int) -> str:
    import curses

    if key in (curses.KEY_ENTER, 10, 13):
        return "\n"
    if key in (curses.KEY_BACKSPACE, 127, 8):
        return "\x7f"
    return chr(key) if 0 <= key < 0x110000 else ""


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
