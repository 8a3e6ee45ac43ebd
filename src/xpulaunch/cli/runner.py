"""``xpulaunch runner [--foreground] [--idle-exit S]``: start this user's queue runner.

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
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.files import runner_pid


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--foreground", is_flag=True, help="Run here until stopped (for systemd).")
@click.option(
    "--idle-exit",
    type=SECONDS,
    metavar="SECONDS",
    help="Leave after this long with no job of yours (default: never, in the foreground).",
)
@lock_dir_option
def runner(foreground: bool, idle_exit: float | None, lock_dir: str | None) -> int:
    """Start the runner that starts your queued jobs (one per user and lock directory)."""
    env = dict(os.environ)
    directory = actions.queue_directory(lock_dir, env)
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
