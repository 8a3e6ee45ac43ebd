"""``xpulaunch hold ID...`` and ``xpulaunch release ID...``: a held job keeps its place in
the queue but does not start until released. Only your own jobs."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS, completer
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import QueueError, UsageError
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.store import Store

_Id = TypeVar("_Id", int, int | str)


def _change(ids: tuple[str, ...], lock_dir: str | None, *, held: bool) -> int:
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    numbers: list[int | str] = []
    for job_id in actions.parse_ids(ids):
        if actions.is_waiter(job_id):  # wPID: a launch waiting with --wait has no queue state
            raise UsageError(
                f"{job_id} is a launch waiting with --wait, not a queued job: only queued jobs "
                f"can be {'held' if held else 'released'} ('xpulaunch cancel {job_id}' stops it)"
            )
        numbers.append(job_id)
    store = Store.open(directory, env, create=False)
    if store is None:
        raise QueueError(
            f"no job {numbers[0] if numbers else ids[0]}: {directory.root} has no queue"
        )
    with store:
        jobs = [int(i) for i in actions.expand(store, numbers)]
        failed = each_job(jobs, lambda job_id: actions.hold(directory, store, job_id, held=held))
    if not held:
        actions.ensure_runner(directory, env)
    return 1 if failed else 0


def each_job(ids: Sequence[_Id], act: Callable[[_Id], str]) -> int:
    """``act`` on each id, printing what it says; an id it refuses is an error line and the
    next id is still tried (one id alone: its error ends the command). How many it refused."""
    failed = 0
    for job_id in ids:
        try:
            click.echo(act(job_id))
        except QueueError as exc:
            if len(ids) == 1:
                raise
            click.echo(f"xpulaunch: error: {exc.cli_message()}", err=True)
            failed += 1
    return failed


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument(
    "ids", nargs=-1, required=True, metavar="ID...", shell_complete=completer("complete_holdable")
)
@lock_dir_option
def hold(ids: tuple[str, ...], lock_dir: str | None) -> int:
    """Keep queued jobs of yours from starting (they keep their place)."""
    return _change(ids, lock_dir, held=True)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument(
    "ids", nargs=-1, required=True, metavar="ID...", shell_complete=completer("complete_held")
)
@lock_dir_option
def release(ids: tuple[str, ...], lock_dir: str | None) -> int:
    """Let held jobs of yours start again."""
    return _change(ids, lock_dir, held=False)
