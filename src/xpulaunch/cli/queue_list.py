"""``xpulaunch queue [--json] [-a] [--lock-dir DIR]``: the jobs of the queue, everyone's.

One row per job: id, user, state, devices, how long it waited and ran, its exit status, and
its command; under a job that waits, why (``waiting for 2 devices: nvidia 0, 1 leased by job
17``). Launches waiting with ``xpulaunch run --wait`` are listed too, as ``w<pid>``.
"""

from __future__ import annotations

import json
import os

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.terminal import aligned, cut, one_line, output_width, terminal_safe
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.jobqueue import actions, listing


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--json", "as_json", is_flag=True, help="Print the queue as JSON.")
@click.option("-a", "--all", "everything", is_flag=True, help="Also the jobs that ended.")
@lock_dir_option
def queue(as_json: bool, everything: bool, lock_dir: str | None) -> int:
    """List the queued, running and (with -a) ended jobs, and why each waits."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    snapshot = listing.take(directory, env, ended=everything)
    for problem in snapshot.problems:  # some user's jobs left out: the rest still listed
        click.echo(terminal_safe(f"xpulaunch: warning: {one_line(problem)}"), err=True)
    if as_json:
        click.echo(json.dumps(listing.document(snapshot), indent=2))
        return 0
    click.echo(terminal_safe(queue_text(snapshot, output_width())))
    return 0


def queue_text(snapshot: listing.Snapshot, width: int | None) -> str:
    """The table, its lines cut to ``width`` columns (None: whole; the command runs free at
    the end)."""
    rows = listing.table_rows(snapshot)
    drains = [
        f"the runner of {name} drains: it starts none of their jobs (xpulaunch runner --resume)"
        for name in listing.document_draining(snapshot)
    ]
    if not rows:
        return "\n".join([f"no jobs in the queue of {snapshot.lock_dir}", *drains])
    width = None if width is None else max(width, 40)
    header, *table = aligned([listing.HEADER, *(cells for cells, _ in rows)])
    lines = [cut(header, width).rstrip()]
    for line, (_, reason) in zip(table, rows, strict=True):
        lines.append(cut(line, width).rstrip())
        if reason:
            # A --wait launch's reason is its own text (other users' command lines in it).
            lines.append(cut("      " + one_line(reason), width))
    return "\n".join([*lines, *drains])
