"""``xpulaunch logs [RUN] [--rank R] [--attempt N] [-f]``: a run's log files, read back.

RUN is the ``--log-dir`` the run wrote (default ``XPULAUNCH_LOG_DIR``, else the current
directory). Without ``--rank`` every worker's lines are merged by their time stamps and
prefixed ``[name]`` as on the console; ``--attempt`` defaults to the last one. ``-f`` keeps
printing new lines until the run writes its ``summary.json`` (or Ctrl-C).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from xpulaunch.cli.options import CONTEXT_SETTINGS
from xpulaunch.errors import UsageError
from xpulaunch.proc.log_reader import LogFollower, attempts, run_ended, worker_names

FOLLOW_INTERVAL_S = 0.5  # how often -f looks for new lines (tail -f looks every second)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("run_dir", metavar="[RUN]", required=False, envvar="XPULAUNCH_LOG_DIR")
@click.option("--rank", "ranks", metavar="LIST", help="Only these workers, e.g. 0 or 0,2.")
@click.option("--attempt", type=click.IntRange(min=0), help="Which attempt (default: the last).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
def logs(run_dir: str | None, ranks: str | None, attempt: int | None, follow: bool) -> int:
    """Print the log files of a run started with --log-dir."""
    root = Path(run_dir or ".")
    known = attempts(root)
    chosen = known[-1] if attempt is None else attempt
    if chosen not in known:
        raise UsageError(f"--attempt {chosen}: {root} has attempts {_listing(known)}")
    follower = LogFollower(_files(root, chosen, ranks))
    prefix = len(follower.files) > 1
    _print(follower.read(), prefix=prefix)
    while follow and not run_ended(root):
        time.sleep(FOLLOW_INTERVAL_S)
        _print(follower.read(), prefix=prefix)
    if follow:
        _print(follower.read(), prefix=prefix)  # what came before summary.json
    return 0


def _files(root: Path, attempt: int, ranks: str | None) -> dict[str, Path]:
    names = worker_names(root, attempt)
    wanted = names if not ranks else [r.strip() for r in ranks.split(",")]
    unknown = [r for r in wanted if r not in names]
    if unknown:
        raise UsageError(
            f"--rank {','.join(unknown)}: no log in attempt {attempt}; there are {_listing(names)}"
        )
    return {name: root / f"attempt_{attempt}" / f"{name}.log" for name in wanted}


def _listing(items: list[int] | list[str]) -> str:
    return ",".join(str(i) for i in items) or "none"


def _print(lines: list[tuple[str, bytes]], *, prefix: bool) -> None:
    out = sys.stdout.buffer
    for name, line in lines:
        out.write((f"[{name}] ".encode() if prefix else b"") + line + b"\n")
    out.flush()
