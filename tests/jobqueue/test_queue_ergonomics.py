"""The queue's ergonomics with real processes: ``--name``, ``--array``, ``--after-any`` and
``--after-fail``, ``xpulaunch wait``, ``logs -f`` ending with the job's exit status,
``runner --drain``, ``--notify``, CPU jobs past a GPU job waiting for devices, and
``queue --json`` for every state."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from helpers import wait_for
from queue_kit import JOB, NOBODY, QueueBox, wait_gone

pytestmark = pytest.mark.slow


def q(box: QueueBox, command: str, *args: str | Path, uid: int = 0, check: bool = True,
      **env: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``xpulaunch COMMAND --lock-dir D ARGS`` as ``uid``."""
    return box.cli(command, "--lock-dir", box.lock_dir, *args, uid=uid, check=check, **env)


def submit(box: QueueBox, *args: str | Path, uid: int = 0, **env: str) -> tuple[int, str]:
    """``submit`` with the box's inventory: the id it printed, and its stderr."""
    done = q(box, "submit", "--inventory", box.inventory, *args, uid=uid, **env)
    assert done.stdout.strip().isdigit(), done.stdout
    return int(done.stdout), done.stderr


def one_line_error(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert done.returncode == code, done
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert text in done.stderr, done.stderr


def test_names_and_arrays_stand_for_their_jobs(box: QueueBox) -> None:
    train, _ = submit(box, "--hold", "--name", "train", "--", "true")
    again = q(box, "submit", "--inventory", box.inventory, "--name", "train", "--", "true",
              check=False)  # fmt: skip
    one_line_error(again, 1, f"--name train: job {train} of yours has that name")
    theirs, _ = submit(box, "--hold", "--name", "train", "--", "true", uid=NOBODY)  # their own
    assert q(box, "cancel", "train").stdout == f"job {train}: cancelled (it had not started)\n"
    jobs = box.jobs()
    assert (jobs[str(train)]["state"], jobs[str(theirs)]["state"]) == ("cancelled", "held")
    assert jobs[str(theirs)]["name"] == "train"
    q(box, "cancel", "train", uid=NOBODY)
    # An array: one job per index, the first id on stdout, the name and first id for all.
    first, said = submit(
        box, "--hold", "--array", "2-4", "--name", "sweep", "--",
        "sh", "-c", 'touch "$0/index-$XPULAUNCH_ARRAY_INDEX"', box.root,
    )  # fmt: skip
    assert f"an array of 3 (XPULAUNCH_ARRAY_INDEX 2-4); {first} or sweep means all" in said
    members = [j for j in box.jobs().values() if j["array"] == first]
    assert [(j["name"], j["array_index"], j["state"]) for j in members] == [
        ("sweep", 2, "held"), ("sweep", 3, "held"), ("sweep", 4, "held"),
    ]  # fmt: skip
    assert f"{first} sweep[2]" in q(box, "queue").stdout
    q(box, "release", "sweep")
    assert q(box, "wait", str(first)).returncode == 0  # waits for the whole array
    assert sorted(p.name for p in box.root.glob("index-*")) == ["index-2", "index-3", "index-4"]
    assert q(box, "logs", "sweep").stdout == ""  # a name in logs: its (latest) job
    held, _ = submit(box, "--hold", "--array", "3", "--", "true")
    assert q(box, "cancel", str(held)).stdout.count("cancelled (it had not started)") == 3
    assert {j["state"] for j in box.jobs().values() if j["array"] == held} == {"cancelled"}
    for args, code, text in [
        (["--array", "0"], 2, "--array '0': no index in it"),
        (["--array", "100000"], 2, "--array '100000': 100000 jobs; one array has 1000 at most"),
        (["--array", "x"], 2, "--array 'x': expected a count (4) or a range (0-9)"),
        (["--name", "12"], 2, "--name '12': a name starts with a letter"),
        (["--after", "nosuch"], 1, "no job of yours is named nosuch"),
        (["--name", "loop", "--after", "loop"], 1, "no job of yours is named loop"),  # a cycle
        (["--after-fail", ""], 2, "--after-fail needs a job id"),
    ]:
        done = q(box, "submit", "--inventory", box.inventory, *args, "--", "true", check=False)
        one_line_error(done, code, text)
    one_line_error(q(box, "cancel", "nosuch", check=False), 1, "no job of yours is named nosuch")


def test_after_any_and_after_fail(box: QueueBox) -> None:
    failed, _ = submit(box, "--gpus", "none", "--name", "bad", "--", "sh", "-c", "exit 3")
    ok, _ = submit(box, "--gpus", "none", "--", "true")
    any_end, _ = submit(box, "--gpus", "none", "--after-any", "bad", "--", "true")
    on_fail, _ = submit(box, "--gpus", "none", "--after-fail", str(failed), "--", "true")
    not_run, _ = submit(box, "--gpus", "none", "--after-fail", str(ok), "--", "true")
    success, _ = submit(box, "--gpus", "none", "--after", str(failed), "--", "true")
    jobs = box.wait_states({failed: "failed", ok: "done", any_end: "done", on_fail: "done",
                            not_run: "cancelled", success: "cancelled"})  # fmt: skip
    assert jobs[str(not_run)]["reason"] == f"never started: --after-fail {ok}: job {ok} succeeded"
    assert jobs[str(any_end)]["after_any"] == [failed]
    assert jobs[str(on_fail)]["after_fail"] == [failed]


def test_wait_and_logs_follow_end_with_the_jobs_exit_status(box: QueueBox) -> None:
    three, _ = submit(box, "--gpus", "none", "--hold", "--", "sh", "-c", "echo out; exit 3")
    waiting = box.start("wait", "--lock-dir", box.lock_dir, str(three))
    following = box.start("logs", "-f", "--lock-dir", box.lock_dir, str(three))
    q(box, "release", str(three))
    out, err = following.communicate(timeout=60)
    assert following.returncode == 3, err  # it was 0 however the job ended
    assert "out" in out
    assert waiting.wait(timeout=60) == 3
    assert q(box, "logs", "-f", str(three), check=False).returncode == 3
    assert q(box, "logs", str(three)).returncode == 0  # without -f: as before
    ok, _ = submit(box, "--gpus", "none", "--", "true")
    assert q(box, "wait", str(ok), str(three), check=False).returncode == 3  # first non-zero
    assert q(box, "wait", "--all").returncode == 0  # nothing of ours left to end
    held, _ = submit(box, "--hold", "--", "true")
    assert q(box, "wait", "--timeout", "0.5", str(held), check=False).returncode == 124
    q(box, "cancel", str(held))
    done = q(box, "logs", "-f", str(held), check=False)
    one_line_error(done, 1, f"job {held} was cancelled before it started")
    assert q(box, "wait", str(held), check=False).returncode == 1  # ended with no status
    one_line_error(q(box, "wait", "99999", check=False), 1, "no job 99999 in the queue")


def test_runner_drain_finishes_running_jobs_and_starts_none(box: QueueBox) -> None:
    info = box.root / "hold.json"
    running, _ = submit(box, "--gpus", "none", "--", box.python(), JOB, "hold", info)
    box.wait_states({running: "running"})
    wait_for(info.exists, "the job to start")
    runner = box.runner_pids()["root"]
    assert "finishes its running jobs and starts none" in q(box, "runner", "--drain").stderr
    later, said = submit(box, "--gpus", "none", "--", "true")
    assert "queued; your runner drains" in said
    assert "the runner of root drains" in q(box, "queue").stdout
    assert box.queue()["draining"] == ["root"]
    Path(f"{info}.release").touch()
    wait_gone(runner)  # drained: it left once its running job ended
    jobs = box.jobs()
    assert (jobs[str(running)]["state"], jobs[str(later)]["state"]) == ("done", "queued")
    assert "drains: xpulaunch runner --resume" in jobs[str(later)]["reason"]
    q(box, "runner", "--resume")
    assert q(box, "wait", str(later)).returncode == 0
    assert box.queue()["draining"] == []


def test_notify_runs_when_a_job_ends_and_its_failure_is_only_logged(box: QueueBox) -> None:
    seen = box.root / "notified"
    record = f'echo "$XPULAUNCH_JOB_ID $XPULAUNCH_JOB_NAME $XPULAUNCH_JOB_STATE $XPULAUNCH_JOB_EXIT_CODE" >> {seen}'  # noqa: E501
    slow = {"XPULAUNCH_NOTIFY_TIMEOUT": "1"}  # the runner's (the first submit starts it)
    failed, _ = submit(box, "--gpus", "none", "--name", "n1", "--notify", record, "--",
                       "sh", "-c", "exit 3", **slow)  # fmt: skip
    broken, _ = submit(box, "--gpus", "none", "--notify", "false", "--", "true")
    hangs, _ = submit(box, "--gpus", "none", "--notify", "sleep 100", "--", "true")
    held, _ = submit(box, "--hold", "--notify", record, "--", "true")
    later, _ = submit(box, "--hold", "--name", "n2", "--notify", record, "--", "true")
    q(box, "cancel", str(held))
    box.wait_states({failed: "failed", broken: "done", hangs: "done", held: "cancelled"})
    log = box.lock_dir / "queue-jobs-0" / "runner.log"
    wait_for(lambda: "--notify still ran after 1 s" in log.read_text(), "the hung one killed")
    wait_for(lambda: seen.exists() and seen.read_text().count("\n") == 2, "two notifications")
    assert sorted(seen.read_text().splitlines()) == sorted(
        [f"{failed} n1 failed 3", f"{held}  cancelled "]
    )
    assert f"job {broken}: --notify failed (exit status 1)" in log.read_text()
    assert box.jobs()[str(broken)]["state"] == "done"  # the job's own state, untouched
    # Cancelled while no runner of ours runs: the next runner notifies it (once).
    box.stop_runner()
    q(box, "cancel", str(later))
    q(box, "runner")
    wait_for(lambda: seen.read_text().count("\n") == 3, "the next runner's notification")
    assert seen.read_text().splitlines()[-1] == f"{later} n2 cancelled "
    done = q(box, "submit", "--inventory", box.inventory, "--notify", "no-such-program x",
             "--", "true", check=False)  # fmt: skip
    one_line_error(done, 2, "no-such-program is not an executable program here")


def test_a_cpu_job_passes_a_gpu_job_waiting_and_json_has_every_state(box: QueueBox) -> None:
    info = box.root / "hold.json"
    holder, _ = submit(box, "--gpus", "2", "--nproc-per-node", "1", "--",
                       box.python(), JOB, "hold", info)  # fmt: skip
    box.wait_states({holder: "running"})
    gpu, _ = submit(box, "--gpus", "2", "--", "true")
    box.wait_states({gpu: "waiting"})
    cpu, _ = submit(box, "--gpus", "none", "--", "true")
    failed, _ = submit(box, "--gpus", "none", "--", "sh", "-c", "exit 3")
    held, _ = submit(box, "--hold", "--", "true")
    queued, _ = submit(box, "--after", str(holder), "--", "true")
    cancelled, _ = submit(box, "--hold", "--", "true")
    q(box, "cancel", str(cancelled))
    states = {holder: "running", gpu: "waiting", cpu: "done", failed: "failed", held: "held",
              queued: "queued", cancelled: "cancelled"}  # fmt: skip
    jobs = box.wait_states(states, timeout_s=30)  # the CPU jobs ran while the GPU job waits
    assert {j["state"] for j in jobs.values()} == set(states.values())
    document = json.loads(q(box, "queue", "--json", "-a").stdout)
    keys = {"id", "name", "user", "state", "after", "after_any", "after_fail", "array",
            "array_index", "gpus", "exit_code", "reason", "command"}  # fmt: skip
    assert all(keys <= set(j) for j in document["jobs"])
    assert jobs[str(failed)]["exit_code"] == 3
    Path(f"{info}.release").touch()
    box.wait_states({holder: "done", gpu: "done", queued: "done"})


def test_a_schema_1_store_is_read_by_others_and_upgraded_by_its_owner(box: QueueBox) -> None:
    job, _ = submit(box, "--hold", "--", "true")
    database = box.database()
    with contextlib.closing(sqlite3.connect(database)) as db:  # as an older xpulaunch made it
        for column in ("name", "after_any", "after_fail", "array_first", "array_index"):
            db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 1")
        db.commit()
    theirs = {j["id"]: j for j in box.queue(uid=NOBODY)["jobs"]}  # read-only, not upgraded
    assert (theirs[job]["state"], theirs[job]["name"], theirs[job]["after_any"]) == (
        "held", None, [],
    )  # fmt: skip
    named, _ = submit(box, "--hold", "--name", "later", "--after-any", str(job), "--", "true")
    with contextlib.closing(sqlite3.connect(database)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (2,)
    jobs = box.jobs(uid=NOBODY)
    assert (jobs[str(named)]["name"], jobs[str(named)]["after_any"]) == ("later", [job])
    assert jobs[str(job)]["state"] == "held"
