"""Fault-sweep trials for the job queue (round 4's findings 1, 2 and 8, and two small ones),
registered into ``bench/fault_sweep.py``'s trials: another user's SQL against the records,
a store moved aside while its runner runs, a full lock-dir disk, ``--after`` twice or empty,
``logs -f`` of a held job then cancelled.

Each trial ends the runner and the job runs it started (by their pids, from ``queue
--json``): ``submit`` starts them detached, so the scratch's own clean-up does not see them.
The two-user trial needs root (``setpriv`` to nobody), the full-disk ones a tmpfs (root).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from sweep_kit import Outcome, Scratch, Skip, judge, trial, wait_until

NOBODY = 65534


def _queue(s: Scratch, env: dict[str, str] | None = None) -> dict[str, Any]:
    status, out, err = s.run("queue", "--json", "-a", env=env)
    if status != 0:
        raise RuntimeError(f"queue --json: {err.strip()[-200:]}")
    document: dict[str, Any] = json.loads(out)
    return document


def _states(s: Scratch, env: dict[str, str] | None = None) -> dict[int, str]:
    return {j["id"]: j["state"] for j in _queue(s, env)["jobs"] if isinstance(j["id"], int)}


def _reach(
    s: Scratch,
    wanted: dict[int, str],
    o: Outcome,
    env: dict[str, str] | None = None,
    timeout_s: float = 30,
) -> bool:
    if wait_until(lambda: all(_states(s, env).get(i) == v for i, v in wanted.items()), timeout_s):
        return True
    o.fail("hang", f"states {wanted} not reached: {_states(s, env)}")
    return False


def _submit(s: Scratch, o: Outcome, *args: str, env: dict[str, str] | None = None) -> int:
    status, out, err = s.run("submit", "--gpus", "none", *args, env=env)
    judge(o, status, err)
    return int(out) if out.strip().isdigit() else 0


def _end_queue(s: Scratch, env: dict[str, str] | None = None) -> None:
    """SIGKILL the runners and job runs of the scratch's queue (and wait for them)."""
    with contextlib.suppress(Exception):
        document = _queue(s, env)
        pids = [*document["runners"].values(), *(j["pid"] for j in document["jobs"] if j["pid"])]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # each in a session of its own
        wait_until(lambda: not any(_alive(p) for p in pids), 10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


ATTACK = """
import os, pathlib, sqlite3, sys
changed = 0
for path in pathlib.Path(sys.argv[1]).rglob("queue.sqlite"):
    try:
        db = sqlite3.connect(path)
        db.execute("DELETE FROM jobs WHERE id = ?", (int(sys.argv[2]),))
        db.execute("UPDATE jobs SET state = 'done' WHERE id = ?", (int(sys.argv[3]),))
        db.commit()
        changed += 1
    except sqlite3.Error:
        pass
    try:
        os.rename(path, str(path) + ".gone")
        changed += 1
    except OSError:
        pass
print(changed)
"""


@trial("Q1 another user deletes and rewrites queue records with SQL")
def _other_user_sql(s: Scratch, o: Outcome) -> None:
    if os.getuid() != 0:
        raise Skip("needs root (setpriv to nobody)")
    s.root.chmod(0o755)  # nobody reaches the lock directory
    try:
        running = _submit(s, o, "--grace", "1", "--", "sh", "-c", "sleep 30")
        held = _submit(s, o, "--hold", "--", "true")
        if not _reach(s, {running: "running", held: "held"}, o):
            return
        argv = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            ATTACK,
            str(s.root / "locks"),
            str(held),
            str(running),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.stdout.strip() != "0":
            o.fail("wrong", f"nobody changed {done.stdout.strip()} of root's files: {done.stderr}")
        states = _states(s)
        if states != {running: "running", held: "held"}:
            o.fail("wrong", f"root's jobs after the attack: {states}")
    finally:
        _end_queue(s)


@trial("Q2 queue store moved aside while its runner runs")
def _moved_aside(s: Scratch, o: Outcome) -> None:
    try:
        old = _submit(s, o, "--", "sh", "-c", "echo OLDJOB-OUTPUT")
        if not _reach(s, {old: "done"}, o):
            return
        runner = _queue(s)["runners"].get("root")
        for path in (s.root / "locks").rglob("queue.sqlite*"):
            path.rename(f"{path}.bad")
        new = _submit(s, o, "--", "sh", "-c", "echo NEWJOB-OUTPUT")
        if new == old:
            o.fail("wrong", f"the new job got the old id {old}")
        if _reach(s, {new: "done"}, o) and _queue(s)["runners"].get("root") != runner:
            o.fail("wrong", "another runner ran it")
        _, out, _ = s.run("logs", str(new))
        if "NEWJOB-OUTPUT" not in out or "OLDJOB" in out:
            o.fail("wrong", f"logs {new}: {out[-120:]!r}")
        logs = [p for p in (s.root / "locks").rglob("*.log") if "OLDJOB" in p.read_text()]
        if not logs:
            o.fail("wrong", "the old job's output is gone")
    finally:
        _end_queue(s)


def _full_disk_queue(s: Scratch) -> tuple[Path, dict[str, str]]:
    disk = s.small_disk(1 << 30)  # nothing filled yet
    return disk, {"XPULAUNCH_LOCK_DIR": str(disk / "locks")}


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, bytes(4096))
    finally:
        os.close(fd)


@trial("Q3 cancel on a full lock-dir disk")
def _cancel_full(s: Scratch, o: Outcome) -> None:
    disk, env = _full_disk_queue(s)
    try:
        job = _submit(s, o, "--grace", "1", "--", "sh", "-c", "sleep 30", env=env)
        if not _reach(s, {job: "running"}, o, env):
            return
        _fill(disk)
        status, _, err = s.run("cancel", str(job), env=env)
        judge(o, status, err)
        _reach(s, {job: "cancelled"}, o, env)
    finally:
        _end_queue(s, env)


@trial("Q4 a job ends on a full lock-dir disk: recorded with its own end")
def _end_full(s: Scratch, o: Outcome) -> None:
    disk, env = _full_disk_queue(s)
    release = s.root / "release"
    try:
        job = _submit(
            s, o, "--", "sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done", env=env
        )
        if not _reach(s, {job: "running"}, o, env):
            return
        _fill(disk)
        released_s = time.time()
        release.touch()
        time.sleep(3)  # full for 3 s after its end
        (disk / "filler").unlink()
        if not _reach(s, {job: "done"}, o, env):
            return
        (database,) = (disk / "locks").rglob("queue.sqlite")
        with contextlib.closing(sqlite3.connect(database)) as db:
            (ended_s,) = db.execute("SELECT ended_s FROM jobs WHERE id = ?", (job,)).fetchone()
        if not released_s <= ended_s < released_s + 2:
            o.fail("wrong", f"recorded as ending {ended_s - released_s:.1f} s after it did")
    finally:
        _end_queue(s, env)


@trial("Q5 submit --after the same job twice, and --after ''")
def _after_twice(s: Scratch, o: Outcome) -> None:
    try:
        first = _submit(s, o, "--hold", "--", "true")
        second = _submit(s, o, "--after", str(first), "--after", str(first), "--", "true")
        job = next(j for j in _queue(s)["jobs"] if j["id"] == second)
        if job["after"] != [first]:
            o.fail("wrong", f"after {job['after']}")
        status, _, err = s.run("submit", "--gpus", "none", "--after", "", "--", "true")
        judge(o, status, err, good=False, expect=2)
        if "--after needs a job id" not in err:
            o.fail("wrong", f"--after '': {err.strip()[-120:]}")
    finally:
        _end_queue(s)


@trial("Q6 logs -f of a held job, then cancelled")
def _logs_cancelled(s: Scratch, o: Outcome) -> None:
    try:
        held = _submit(s, o, "--hold", "--", "true")
        follow = s.start("logs", "-f", str(held))
        time.sleep(0.5)
        s.run("cancel", str(held))
        status, _, err = _finish(follow)
        judge(o, status, err, good=False, expect=1)
        if f"job {held} was cancelled before it started" not in err:
            o.fail("wrong", f"logs -f said {err.strip()[-120:]!r}")
    finally:
        _end_queue(s)


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int | None, str, str]:
    from sweep_kit import finish

    return finish(proc, 30)
