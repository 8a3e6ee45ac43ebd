"""``xpulaunch wait ID... | --all``: wait until jobs of the queue have ended, and exit with
the job's exit status, as task-spooler's ``ts -w`` does.

For several jobs, the exit status is the first non-zero one in the order given (``--all``:
in id order), 0 when all succeeded. A job that ended with no exit status (cancelled before it
started, could not start) counts as 1. A name or an array's first id means all of its jobs;
anyone's jobs can be waited for (reading the queue is open to all). ``--timeout`` gives up
with 124 (as ``timeout(1)``), the jobs left as they are.
"""

from __future__ import annotations

import os
import time

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS, completer
from xpulaunch.cli.job_logs import exit_status
from xpulaunch.cli.params import POSITIVE_SECONDS
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import QueueError, UsageError
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.policy import Job
from xpulaunch.jobqueue.store import Store

POLL_S = 0.2  # a look at the stores' change counters: a few small reads
TIMED_OUT = 124


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("ids", nargs=-1, metavar="ID...", shell_complete=completer("complete_waitable"))
@click.option("--all", "everything", is_flag=True, help="Every job of yours not ended yet.")
@click.option(
    "--timeout", "timeout_s", type=POSITIVE_SECONDS, metavar="SECONDS", help="Give up (124)."
)
@lock_dir_option
def wait(
    ids: tuple[str, ...], everything: bool, timeout_s: float | None, lock_dir: str | None
) -> int:
    """Wait for jobs to end; exit with the (first non-zero) exit status."""
    if bool(ids) == everything:
        raise UsageError("give job ids or names (as xpulaunch queue shows them) or --all")
    refs = actions.parse_ids(ids)
    waiters = [r for r in refs if actions.is_waiter(r)]
    if waiters:
        raise UsageError(f"{waiters[0]} is a launch waiting with --wait, not a queued job")
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    store = Store.open(directory, env, create=False)
    if store is None:
        if everything:
            return 0
        raise QueueError(f"no job {refs[0]}: {directory.root} has no queue")
    with store:
        if everything:
            wanted = [j.id for j in store.jobs() if j.uid == os.getuid()]
        else:
            wanted = [int(i) for i in actions.expand(store, refs)]
        for job_id in wanted:
            if store.job(job_id) is None:
                actions.own_job(store, job_id, "wait for")  # the unknown-id message
        ended = _wait(store, wanted, timeout_s)
    if ended is None:
        click.echo(f"xpulaunch: gave up waiting after {timeout_s:g} s", err=True)
        return TIMED_OUT
    statuses = [exit_status(job) for job in ended]
    for job, status in zip(ended, statuses, strict=True):
        if status != 0 and len(ended) > 1:
            click.echo(f"xpulaunch: job {job.id} {job.state.value} (exit {status})", err=True)
    return next((s for s in statuses if s != 0), 0)


def _wait(store: Store, wanted: list[int], timeout_s: float | None) -> list[Job] | None:
    """The jobs once all have ended, in ``wanted``'s order; None at the timeout."""
    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    seen: tuple[object, ...] | None = None
    while True:
        version = store.data_version()
        if version != seen:
            seen = version
            jobs = [store.job(i) for i in wanted]
            found = [j for j in jobs if j is not None]
            if all(j.state.ended for j in found):
                return found
        if deadline_s is not None and time.monotonic() >= deadline_s:
            return None
        time.sleep(POLL_S)
