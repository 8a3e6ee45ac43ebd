"""``xpulaunch cancel ID... | --all``: a queued job is dropped; a started one's run gets
SIGTERM, and its workers their ``--grace``. ``wPID`` cancels a launch waiting with
``--wait``. Only your own jobs."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS, completer
from xpulaunch.cli.hold import each_job
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import QueueError, UsageError
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.store import Store

if TYPE_CHECKING:
    from xpulaunch.leases.lock_directory import LockDirectory


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("ids", nargs=-1, metavar="ID...", shell_complete=completer("complete_cancellable"))
@click.option("--all", "everything", is_flag=True, help="Every job of yours that has not ended.")
@lock_dir_option
def cancel(ids: tuple[str, ...], everything: bool, lock_dir: str | None) -> int:
    """Cancel jobs of yours: queued ones are dropped, running ones stopped."""
    if bool(ids) == everything:
        raise UsageError("give job ids (as xpulaunch queue shows them) or --all, not both")
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    wanted = actions.parse_ids(ids)
    store = Store.open(directory, env, create=False)
    if store is None:
        if everything:
            return _nothing_to_cancel(directory)
        numbers = [i for i in wanted if not actions.is_waiter(i)]
        if numbers:
            raise QueueError(f"no job {numbers[0]}: {directory.root} has no queue")
    with store or contextlib.nullcontext():
        wanted = actions.expand(store, wanted)  # a name, an array's first id: all its jobs
        if everything and store is not None:
            wanted = [j.id for j in store.jobs() if j.uid == os.getuid()]
            if not wanted:
                return _nothing_to_cancel(directory)
        failed = each_job(wanted, lambda job_id: _cancel(directory, store, job_id, everything))
    return 1 if failed else 0


def _nothing_to_cancel(directory: LockDirectory) -> int:
    """``cancel --all`` that found no job: said, so that silence never reads as done."""
    click.echo(f"no job of yours to cancel in {directory.root}")
    return 0


def _cancel(
    directory: LockDirectory, store: Store | None, job_id: int | str, ended_ok: bool
) -> str:
    if isinstance(job_id, str):  # expanded: only a wPID is left as text
        return actions.cancel_waiter(directory, int(job_id[1:]))
    assert store is not None  # a job id with no queue was refused above
    return actions.cancel(directory, store, job_id, ended_ok=ended_ok)
