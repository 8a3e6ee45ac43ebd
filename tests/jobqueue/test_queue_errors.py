"""Bad input to the queue is one clear line, and nothing is lost: unknown ids, other users'
jobs, a corrupt or locked database, a lock directory on NFS, a job that can never run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import one_line_error
from queue_kit import NOBODY, QueueBox

pytestmark = pytest.mark.slow
HUGE = "9" * 23  # past SQLite's 64-bit INTEGER
UNKNOWN = "no job 99 in the queue of {lock_dir} (jobs 1-1 exist; see xpulaunch queue -a)"


def lines(box: QueueBox, command: str, *args: str, **env: str) -> tuple[int, str]:
    done = box.cli(command, "--lock-dir", str(box.lock_dir), *args, check=False, **env)
    return done.returncode, one_line_error(done.stderr) if done.returncode else done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cancel", "99"), UNKNOWN),
        (("hold", "99"), UNKNOWN),
        (("logs", "99"), UNKNOWN),
        (("cancel", "1x"), "'1x' is not a job id: expected a number such as 17, a job's --name, "
         "or w4242"),
        (("cancel", "x1"), "no job of yours is named x1; see xpulaunch queue -a"),
        (("hold", "x1"), "no job of yours is named x1; see xpulaunch queue -a"),
        (("logs", "x1"), "no job of yours is named x1; see xpulaunch queue -a; nor is x1 a "
         "directory here"),
        (("wait", "x1"), "no job of yours is named x1; see xpulaunch queue -a"),
        (("wait", "99"), UNKNOWN),
        (("cancel",), "give job ids (as xpulaunch queue shows them) or --all, not both"),
        (("cancel", "w1"), "w1: no launch with pid 1 waits for devices in {lock_dir}"),
        (("logs", "1"), "job 1 has not started yet (held); 'xpulaunch logs -f 1' waits for it"),
        (("hold", HUGE), UNKNOWN.replace("99", HUGE, 1)),
        (("cancel", HUGE), UNKNOWN.replace("99", HUGE, 1)),
        (("logs", HUGE), UNKNOWN.replace("99", HUGE, 1)),
        (("hold", "w1"), "w1 is a launch waiting with --wait, not a queued job: only queued jobs "
         "can be held ('xpulaunch cancel w1' stops it)"),
        (("release", "w1"), "w1 is a launch waiting with --wait, not a queued job: only queued "
         "jobs can be released ('xpulaunch cancel w1' stops it)"),
    ],
)  # fmt: skip
def test_unknown_or_wrong_ids(box: QueueBox, args: tuple[str, ...], message: str) -> None:
    box.submit("--hold", "--", "true")
    code, line = lines(box, *args)
    assert code != 0
    assert line == "xpulaunch: error: " + message.format(lock_dir=box.lock_dir)
    assert [(j["id"], j["state"]) for j in box.queue()["jobs"]] == [(1, "held")]


def test_only_a_held_job_is_released_and_an_ended_one_not_cancelled(box: QueueBox) -> None:
    box.submit("--hold", "--", "true")
    box.cli("cancel", "--lock-dir", box.lock_dir, "1")
    assert lines(box, "release", "1") == (
        1,
        "xpulaunch: error: job 1 is cancelled: only a held job can be released",
    )
    assert lines(box, "cancel", "1") == (1, "xpulaunch: error: job 1 has already ended (cancelled)")


def test_an_id_refused_does_not_stop_the_next(box: QueueBox) -> None:
    # as cancel does: each id is tried, each refused one is a line, and the status is 1
    box.submit("--hold", "--", "true")
    box.submit("--after", "1", "--", "true")  # queued behind the held job 1
    held = box.cli("hold", "--lock-dir", str(box.lock_dir), "99", "2", check=False)
    assert (held.returncode, held.stdout) == (1, "job 2: held\n")
    assert one_line_error(held.stderr).startswith("xpulaunch: error: no job 99 in the queue of")
    assert [(j["id"], j["state"]) for j in box.queue()["jobs"]] == [(1, "held"), (2, "held")]
    released = box.cli("release", "--lock-dir", str(box.lock_dir), "99", "1", check=False)
    assert (released.returncode, released.stdout) == (1, "job 1: queued\n")
    assert box.queue()["jobs"][0]["state"] != "held"  # queued, or already started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "3", "--", "true"), "--gpus 3: only 2 free device(s) of 2 visible"),
        (("--nproc-per-node", "0", "--", "true"), "--nproc-per-node: '0': expected a count"),
        (("--after", "7", "--", "true"), "--after 7: no job 7 in the queue of"),
        (("--events", "-", "--", "true"), "--events -: a queued job has no terminal"),
        (("--gpus", "1", "--", "no-such-program-xyz"), "no-such-program-xyz"),
        (("--slots-per-gpu", "2", "--gpu-memory", "1PiB", "--", "true"), "--gpu-memory"),
    ],
)
def test_a_job_that_can_never_run_is_refused_at_submit(
    box: QueueBox, args: tuple[str, ...], message: str
) -> None:
    done = box.cli("submit", "--lock-dir", box.lock_dir, "--inventory", box.inventory, *args,
                   check=False)  # fmt: skip
    assert done.returncode != 0 and done.stdout == ""
    assert message in one_line_error(done.stderr)
    assert box.queue()["jobs"] == [] and box.runner_pids() == {}


def test_a_corrupt_database_is_named_and_left_alone(box: QueueBox) -> None:
    box.submit("--hold", "--", "true")
    box.cli("cancel", "--lock-dir", box.lock_dir, "--all")
    database = box.database()
    for leftover in ("queue.sqlite-journal", "queue.sqlite-wal", "queue.sqlite-shm"):
        (database.parent / leftover).unlink(missing_ok=True)
    garbage = b"this is not a database\n" * 400
    database.write_bytes(garbage)
    for args in (["queue"], ["submit", "--inventory", str(box.inventory), "--", "true"]):
        code, line = lines(box, *args)
        assert code == 1
        assert line == (
            f"xpulaunch: error: queue database {database} is not a usable SQLite database "
            f"(file is not a database); it is left as it is: move it aside (mv {database} "
            f"{database}.bad) to start an empty queue (a runner that has it open takes the new "
            "one; job ids go on from the highest ever given), or restore it"
        )
    assert database.read_bytes() == garbage


def test_a_locked_database_is_waited_for_then_named(box: QueueBox) -> None:
    first = box.submit("--hold", "--", "true")
    database = box.database()
    holder = subprocess.Popen(  # a writer of the user's own (only they can write it)
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         f"db = sqlite3.connect({str(database)!r}, isolation_level=None)\n"
         "db.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        start_s = time.monotonic()
        done = box.cli("submit", "--lock-dir", box.lock_dir, "--inventory", box.inventory,
                       "--", "true", check=False, XPULAUNCH_LOCK_TIMEOUT="1")  # fmt: skip
        assert 1.0 <= time.monotonic() - start_s < 20
        line = one_line_error(done.stderr)
        assert line.startswith(f"xpulaunch: error: queue database {database} stayed locked by ")
        assert f"pid {holder.pid} (" in line and "for 1 s (XPULAUNCH_LOCK_TIMEOUT)" in line
        # Readers do not wait for a writer's transaction: the queue is still listed.
        assert [j["id"] for j in box.queue()["jobs"]] == [first]
    finally:
        holder.kill()
        holder.wait()
    second = box.submit("--hold", "--", "true")
    assert [j["id"] for j in box.queue()["jobs"]] == [first, second]


def test_a_lock_directory_on_nfs_is_refused(box: QueueBox) -> None:
    fake_proc = box.root / "proc" / "self"
    fake_proc.mkdir(parents=True)
    (fake_proc / "mountinfo").write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        f"50 22 0:45 / {box.root} rw,relatime - nfs4 srv:/export rw,vers=4.2\n"
    )
    for args in (["queue"], ["submit", "--inventory", str(box.inventory), "--", "true"]):
        code, line = lines(box, *args, XPULAUNCH_PROCFS_ROOT=str(box.root / "proc"))
        assert code == 1
        assert line == (
            f"xpulaunch: error: lock directory {box.lock_dir} is on nfs4, a network "
            "filesystem, where the queue's SQLite databases (their locks) do not work: use "
            "--lock-dir DIR (or XPULAUNCH_LOCK_DIR) on a local filesystem, such as /tmp or "
            "/var/lib"
        )
    assert not box.lock_dir.exists()


def test_a_runner_lock_named_by_a_digit_int_cannot_read_is_ignored(box: QueueBox) -> None:
    """Anyone may create files in a shared lock directory: a runner lock named or filled with
    "²" (a digit to Unicode, not to int()) is not a runner, and no traceback."""
    box.submit("--gpus", "1", "--", "true")
    (box.lock_dir / "queue-runner-².lock").write_text("²")
    assert "²" not in str(box.runner_pids())


def test_a_database_moved_aside_while_the_runner_runs_loses_no_job_and_reuses_no_id(
    box: QueueBox,
) -> None:
    """The recovery the corrupt-database error gives (move it aside), done while the runner
    is alive: the runner takes the new database, so the next job runs, and its id is new, so
    the old job's folder (console, events, logs) stays as it was. (Before, the runner kept
    the old file open and never saw the job, which waited for ever; and the job got id 1
    again, its submit moving the old job 1's folder aside.)"""
    old = box.submit("--gpus", "1", "--", "sh", "-c", "echo old output")
    box.wait_states({old: "done"})
    runner = box.runner_pids()["root"]
    database = box.database()
    for leftover in database.parent.glob("queue.sqlite*"):
        leftover.rename(leftover.with_name(leftover.name + ".bad"))
    new = box.submit("--gpus", "1", "--", "sh", "-c", "echo new output")
    assert new > old
    box.wait_states({new: "done"}, timeout_s=30)  # well before the runner's idle exit
    assert box.runner_pids()["root"] == runner  # the same runner ran it
    out = box.cli("logs", "--lock-dir", box.lock_dir, str(new)).stdout
    assert "new output" in out and "old output" not in out
    assert not list(box.lock_dir.rglob(f"{old}.old-*"))
    folders = [p for p in box.lock_dir.rglob(str(old)) if p.is_dir()]
    assert "old output" in "".join(p.read_text() for f in folders for p in f.rglob("*.log"))


def test_what_anyone_may_plant_in_a_shared_lock_directory_holds_no_queue_up(
    box: QueueBox,
) -> None:
    """Another user's folder, FIFO or link named as some runner's lock or wake-up FIFO: no
    runner, nobody to wake. (Before, a lock that was not a regular file failed every `queue`,
    `top` and runner; a wake-up "FIFO" that was a folder failed every submit, cancel and
    release after its change was committed, so a retried submit queued the job twice.)"""
    box.submit("--hold", "--", "true")
    box.stop_runner()
    os.mkdir(box.lock_dir / "queue-runner-4242.lock")
    os.mkfifo(box.lock_dir / "queue-runner-4343.lock")
    os.symlink("/etc/hostname", box.lock_dir / "queue-runner-4444.lock")
    os.mkdir(box.lock_dir / "queue-wake-4242")
    for name in ("queue-runner-4242.lock", "queue-runner-4343.lock", "queue-wake-4242"):
        os.chown(box.lock_dir / name, NOBODY, NOBODY)
    os.lchown(box.lock_dir / "queue-runner-4444.lock", NOBODY, NOBODY)
    job = box.submit("--gpus", "1", "--", "true")
    assert box.wait_states({job: "done"})[str(job)]["exit_code"] == 0
    assert set(box.runner_pids()) == {"root"}
    assert lines(box, "cancel", "1") == (0, "job 1: cancelled (it had not started)\n")
    assert [j["id"] for j in box.queue()["jobs"]] == [1, job]


@pytest.mark.parametrize(
    ("name", "plant"),
    [
        ("queue-wake-0", lambda path: path.write_text("")),
        ("queue-wake-0", os.mkfifo),
        ("queue-runner-0.lock", lambda path: path.write_text("")),
        ("queue-runner-0.lock", os.mkdir),
    ],
)
def test_a_runner_that_could_not_start_is_said_at_submit(
    box: QueueBox, name: str, plant: Callable[[Path], object]
) -> None:
    """Another user's file in the way of this user's runner: submit says so and queues
    nothing. (Before, it queued the job and printed its id; the runner it started died at
    once, in its log, and the job waited for ever; `xpulaunch runner` said "started".)"""
    box.submit("--hold", "--", "true")
    box.stop_runner()
    (box.lock_dir / name).unlink()
    plant(box.lock_dir / name)
    os.chown(box.lock_dir / name, NOBODY, NOBODY)
    expected = (
        f"xpulaunch: error: {box.lock_dir / name} (made by user nobody) is not your runner's: "
        "no runner of yours can start while it is there; have its owner (or root) remove it, "
        "or use --lock-dir DIR (or XPULAUNCH_LOCK_DIR)"
    )
    assert lines(box, "submit", "--inventory", str(box.inventory), "--", "true") == (1, expected)
    assert lines(box, "runner") == (1, expected)
    assert [(j["id"], j["state"]) for j in box.queue()["jobs"]] == [(1, "held")]


def test_after_the_same_job_twice_is_once_and_an_empty_after_says_what_it_needs(
    box: QueueBox,
) -> None:
    """(Before, ``--after 1 --after 1`` was listed as ``after job 1 (held), job 1 (held)``,
    and ``--after ''`` (``"$id"`` of a submit that failed) said click's "'' is not a valid
    integer range".)"""
    first = box.submit("--hold", "--", "true")
    second = box.submit("--after", str(first), "--after", str(first), "--", "true")
    job = box.jobs()[str(second)]
    assert (job["after"], job["reason"]) == ([first], f"after job {first} (held)")
    done = box.cli("submit", "--lock-dir", box.lock_dir, "--after", "", "--", "true", check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert one_line_error(done.stderr) == (
        "xpulaunch: error: --after needs a job id (a number such as 17, as xpulaunch submit "
        "prints it) or a job's --name, not an empty value"
    )
    assert [j["id"] for j in box.queue()["jobs"]] == [first, second]


def test_logs_f_of_a_held_job_then_cancelled_says_so(box: QueueBox) -> None:
    """(Before, ``logs -f`` of a held job that was then cancelled ended with status 0 and
    printed nothing, as if the job had run and said nothing.)"""
    held = box.submit("--hold", "--", "true")
    follow = box.start("logs", "-f", "--lock-dir", box.lock_dir, str(held))
    box.cli("cancel", "--lock-dir", box.lock_dir, str(held))
    out, err = follow.communicate(timeout=60)
    assert (follow.returncode, out) == (1, "")
    assert err == f"xpulaunch: error: job {held} was cancelled before it started\n"
    assert lines(box, "logs", str(held)) == (
        1,
        f"xpulaunch: error: job {held} was cancelled before it started",
    )
