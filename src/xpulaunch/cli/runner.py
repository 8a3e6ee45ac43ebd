"""``xpulaunch runner [--foreground] [--idle-exit S] [--drain | --resume]``: start this
user's queue runner, or have it drain (finish its running jobs, start none, then leave) and
resume.

``submit`` starts one on demand (it leaves after five idle minutes); under systemd run it in
the foreground (``Type=notify``: it says READY=1 once it serves; examples/systemd/). It stops
on SIGTERM, and the jobs it started keep running for the next runner to adopt.
"""

from __future__ import annotations

import os

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.params import SECONDS
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import UsageError
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.files import notify, runner_pid, set_drain
from xpulaunch.leases.lock_directory import LockDirectory


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--foreground", is_flag=True, help="Run here until stopped (for systemd).")
@click.option(
    "--idle-exit",
    type=SECONDS,
    metavar="SECONDS",
    help="Leave after this long with no job of yours (default: never, in the foreground).",
)
@click.option(
    "--drain",
    is_flag=True,
    help="Your runner finishes its running jobs, starts none, then leaves (until --resume).",
)
@click.option("--resume", is_flag=True, help="Undo --drain: start queued jobs again.")
@lock_dir_option
def runner(
    foreground: bool, idle_exit: float | None, drain: bool, resume: bool, lock_dir: str | None
) -> int:
    """Start the runner that starts your queued jobs (one per user and lock directory)."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
    if drain or resume:
        if (drain and resume) or foreground:
            raise UsageError("--drain and --resume go alone (not with each other, --foreground)")
        return _drain(directory, env, on=drain)
    if not foreground:
        started = actions.ensure_runner(directory, env)
        pid = started or runner_pid(directory, os.getuid())
        state = "started" if started else "already running"
        click.echo(f"xpulaunch: runner {state} (pid {pid}) for {directory.root}", err=True)
        return 0
    from xpulaunch.jobqueue.runner import Runner

    if not Runner(directory, env, idle_exit_s=idle_exit).serve():
        pid = runner_pid(directory, os.getuid())
        click.echo(f"xpulaunch: a runner already serves {directory.root} (pid {pid})", err=True)
    return 0


def _drain(directory: LockDirectory, env: dict[str, str], *, on: bool) -> int:
    """Mark this user's runner draining (a file it reads each turn), or not, and wake it."""
    uid = os.getuid()
    changed = set_drain(directory, uid, on=on)
    notify(directory)
    pid = runner_pid(directory, uid)
    if on:
        where = f"runner pid {pid}" if pid is not None else "no runner runs; none"
        again = "" if changed else " (it drained already)"
        click.echo(
            f"xpulaunch: draining{again}: {where} finishes its running jobs and starts none; "
            "'xpulaunch runner --resume' starts queued jobs again",
            err=True,
        )
        return 0
    started = actions.ensure_runner(directory, env)
    state = f"runner pid {started or pid} starts queued jobs"
    click.echo(f"xpulaunch: {'resumed' if changed else 'not draining'}: {state}", err=True)
    return 0
