"""``xpulaunch logs [RUN] [--rank R] [--attempt N] [-f]``: a run's log files, read back.

RUN is a job id of the queue (``xpulaunch submit``; see :mod:`xpulaunch.cli.job_logs`), or
the ``--log-dir`` the run wrote (default ``XPULAUNCH_LOG_DIR``, else the current
directory); in torchrun's layout also the run's own ``<run_id>_<random>`` directory (a
``--log-dir`` holding several runs means the latest). Without ``--rank`` every worker's lines
are prefixed ``[name]`` as on the console, merged by their time stamps in our layout, worker
after worker (stdout, then stderr) in torchrun's, whose lines carry no time. ``--attempt``
defaults to the last one, and then ``-f`` goes on into each attempt a restart starts (a
line on stderr says so). ``-f`` keeps printing new lines until the run is over: its
supervisor gone (or, for a run of an older version, its ``summary.json`` written), or its
directory removed (or Ctrl-C). Lines are streamed, never held in memory all at once. For a
queue job, ``-f`` then exits with the job's exit status (as ``xpulaunch wait`` does).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS, completer
from xpulaunch.cli.job_logs import final_status, is_job_id, job_log_dir
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import UsageError
from xpulaunch.joblog.log_reader import LogFollower, RunLogs, open_run, run_ended

FOLLOW_INTERVAL_S = 0.5  # how often -f looks for new lines (tail -f looks every second)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument(
    "run_dir",
    metavar="[RUN]",
    required=False,
    envvar="XPULAUNCH_LOG_DIR",
    shell_complete=completer("complete_run"),
)
@click.option("--rank", "ranks", metavar="LIST", help="Only these workers, e.g. 0 or 0,2.")
@click.option("--attempt", type=click.IntRange(min=0), help="Which attempt (default: the last).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@lock_dir_option
def logs(
    run_dir: str | None, ranks: str | None, attempt: int | None, follow: bool, lock_dir: str | None
) -> int:
    """Print the log files of a queued job (its ID) or of a run started with --log-dir."""
    job = run_dir if run_dir is not None and is_job_id(run_dir) else None
    if job is not None:
        found = job_log_dir(job, lock_dir, follow=follow)
        if found is None:  # its run's console was printed: no worker wrote a log
            return final_status(job, lock_dir) if follow else 0
        run_dir = str(found)
    given = Path(run_dir or ".")
    run = open_run(given)
    if run.runs > 1:
        click.echo(f"xpulaunch: {run.root}: the latest of {run.runs} runs", err=True)
    elif run.root != given:
        click.echo(f"xpulaunch: reading {run.root}", err=True)  # found below RUN
    known = run.attempts()
    chosen = known[-1] if attempt is None else attempt
    if chosen not in known:
        raise UsageError(f"--attempt {chosen}: {run.root} has attempts {_listing(known)}")
    follower = LogFollower(_files(run, chosen, ranks), stamped=run.stamped)
    while True:
        ended = not follow or run_ended(run.root)
        if follow and attempt is None:  # following "the last attempt": a restart makes one
            chosen = _follow_newer(run, chosen, ranks, follower)
        prefix = len({name for name, _ in follower.files}) > 1
        _print(follower.lines(), prefix=prefix)  # after the end: all it wrote before it
        if ended:
            return final_status(job, lock_dir) if follow and job is not None else 0
        time.sleep(FOLLOW_INTERVAL_S)


def _follow_newer(run: RunLogs, chosen: int, ranks: str | None, follower: LogFollower) -> int:
    """The run's last attempt now, its files added to those followed: a restart's new
    attempt, or a worker whose log came after ``logs -f`` began. Added after the others:
    those are read to their end (a worker restarted alone, without a gang, is one attempt
    ahead of the others, which still write to theirs)."""
    try:
        latest = max(run.attempts(), default=chosen)
        names = run.workers(latest)
    except (OSError, UsageError):  # the run's directory going away: the loop sees it end
        return chosen
    wanted = _wanted(names, ranks)
    known = {path for _, path in follower.files}
    new = [(name, path) for name in wanted for path in run.files(latest, name)]
    follower.files += [(name, path) for name, path in new if path not in known]
    if latest != chosen:
        click.echo(f"xpulaunch: attempt {latest} started (a restart)", err=True)
    return latest


def _files(run: RunLogs, attempt: int, ranks: str | None) -> list[tuple[str, Path]]:
    names = run.workers(attempt)
    wanted = _wanted(names, ranks)
    unknown = [r for r in wanted if r not in names]
    if unknown:
        raise UsageError(
            f"--rank {','.join(unknown)}: no log in attempt {attempt}; there are {_listing(names)}"
        )
    return [(name, path) for name in wanted for path in run.files(attempt, name)]


def _wanted(names: list[str], ranks: str | None) -> list[str]:
    """The workers ``--rank`` names (all of ``names`` without it)."""
    return names if not ranks else [r.strip() for r in ranks.split(",")]


def _listing(items: list[int] | list[str]) -> str:
    return ",".join(str(i) for i in items) or "none"


def _print(lines: Iterable[tuple[str, bytes]], *, prefix: bool) -> None:
    out = sys.stdout.buffer
    for name, line in lines:
        out.write((f"[{name}] ".encode() if prefix else b"") + line + b"\n")
    out.flush()
