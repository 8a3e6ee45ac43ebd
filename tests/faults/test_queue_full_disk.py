"""The queue on a full disk (its lock directory on a small tmpfs of the test's own, filled
while a job runs): a cancel still stops and records the job, and a job that ends meanwhile
is recorded as it ended, with its own end time, also when that record has to wait."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from queue_kit import QueueBox, wait_gone

pytestmark = pytest.mark.slow


def _on_small_disk(box: QueueBox, small_disk: Callable[[int], Path]) -> Path:
    disk = small_disk(1 << 30)  # nothing filled yet
    box.lock_dir = disk / "locks"
    return disk


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:  # to the last block: ENOSPC ends it
                os.write(fd, bytes(4096))
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0


def test_cancel_on_a_full_disk_stops_and_records_the_job(
    box: QueueBox, small_disk: Callable[[int], Path]
) -> None:
    """(Before, cancel failed with "database or disk is full" before it signalled the run: a
    job filling the disk could not be stopped.)"""
    disk = _on_small_disk(box, small_disk)
    job = box.submit("--gpus", "1", "--grace", "1", "--", "sh", "-c", "echo started; sleep 60")
    queued = box.submit("--gpus", "1", "--hold", "--", "true")
    box.wait_states({job: "running"})
    _fill(disk)
    done = box.cli("cancel", "--lock-dir", box.lock_dir, str(job), str(queued), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"job {job}: stopping (SIGTERM; its workers get 1 s to exit)",
        f"job {queued}: cancelled (it had not started)",
    ]
    jobs = box.wait_states({job: "cancelled", queued: "cancelled"})  # the disk still full
    assert jobs[str(job)]["exit_code"] != 0
    assert os.statvfs(disk).f_bavail == 0


def test_a_job_that_ends_on_a_full_disk_is_recorded_with_its_own_end(
    box: QueueBox, small_disk: Callable[[int], Path]
) -> None:
    """(Before, it stayed "running" while the disk was full, and once there was room it was
    recorded as ending then: a runtime of however long the disk had been full.)"""
    disk = _on_small_disk(box, small_disk)
    release = box.root / "release"
    wait = f"while [ ! -e {release} ]; do sleep 0.05; done"
    job = box.submit("--gpus", "1", "--", "sh", "-c", wait)
    box.wait_states({job: "running"})
    _fill(disk)
    released_s = time.time()
    release.touch()
    full_for_s = 3.0  # the disk stays full this long after the job's end
    time.sleep(full_for_s)
    (disk / "filler").unlink()
    box.wait_states({job: "done"})
    with contextlib.closing(sqlite3.connect(f"file:{box.database()}?mode=ro", uri=True)) as db:
        (ended_s,) = db.execute("SELECT ended_s FROM jobs WHERE id = ?", (job,)).fetchone()
    assert released_s <= ended_s < released_s + full_for_s - 1.0


def test_an_end_that_could_not_be_written_is_written_later_with_its_own_time(
    box: QueueBox,
) -> None:
    """The runner's write of a job's end fails (here: its store kept locked by another
    process past XPULAUNCH_LOCK_TIMEOUT, as a full disk with no reserve left would fail it);
    it tries again each turn, and records the end as it happened, not when the write got
    through. (Before, the end was the time of the write that succeeded.)"""
    release = box.root / "release"
    wait = f"while [ ! -e {release} ]; do sleep 0.05; done"
    done = box.cli(
        "submit",
        "--lock-dir",
        box.lock_dir,
        "--inventory",
        box.inventory,
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        wait,
        XPULAUNCH_LOCK_TIMEOUT="0.2",
    )
    job = int(done.stdout)
    run = box.wait_states({job: "running"})[str(job)]["pid"]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            f"db = sqlite3.connect({str(box.database())!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE'); print('locked', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        released_s = time.time()
        release.touch()
        wait_gone(run)
        locked_for_s = 3.0  # the store stays locked this long after the job's end
        time.sleep(locked_for_s)
        assert box.jobs()[str(job)]["state"] == "running"  # not written yet
    finally:
        holder.communicate(input="", timeout=30)
    box.wait_states({job: "done"})
    with contextlib.closing(sqlite3.connect(f"file:{box.database()}?mode=ro", uri=True)) as db:
        (ended_s,) = db.execute("SELECT ended_s FROM jobs WHERE id = ?", (job,)).fetchone()
    assert released_s <= ended_s < released_s + locked_for_s - 1.0
