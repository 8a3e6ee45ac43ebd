"""The queue with real processes: ``xpulaunch submit`` to a two-device fixture inventory, the
runner started on demand, jobs run by ``xpulaunch run --wait`` holding real leases, and
``xpulaunch queue --json`` read as a user would."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import lock_is_free, processes_marked, wait_for
from queue_kit import JOB, QueueBox, elapsed, overlaps, wait_gone
from xpulaunch.jobqueue import actions, job_process, runner as runner_module
from xpulaunch.jobqueue.files import JobSpec, RunnerLock
from xpulaunch.jobqueue.policy import Job, JobState
from xpulaunch.jobqueue.runner import Runner
from xpulaunch.jobqueue.store import Store
from xpulaunch.leases.lock_directory import LockDirectory

pytestmark = pytest.mark.slow

# Each job's states as `queue` may show them, in the only order they may come.
PROGRESS = ("held", "queued", "starting", "waiting", "running", "done")


class Watcher:
    """Polls ``queue --json -a`` in a thread and keeps each job's states as seen."""

    def __init__(self, box: QueueBox) -> None:
        self.box = box
        self.seen: dict[str, list[str]] = {}
        self.reasons: dict[str, set[str]] = {}
        self.most_running = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _watch(self) -> None:
        while not self._stop.is_set():
            jobs = self.box.jobs()
            running = 0
            for job_id, job in jobs.items():
                states = self.seen.setdefault(job_id, [])
                if not states or states[-1] != job["state"]:
                    states.append(job["state"])
                if job["reason"]:
                    self.reasons.setdefault(job_id, set()).add(job["reason"])
                running += job["state"] == "running"
            self.most_running = max(self.most_running, running)
            self._stop.wait(0.1)


def _hold(box: QueueBox, name: str, *args: str) -> tuple[Any, Path]:
    """A plain launch (not queued) holding devices until its release file appears."""
    info = box.root / name
    launch = box.start(
        "run", "--lock-dir", box.lock_dir, "--inventory", box.inventory, *args,
        "--", sys.executable, JOB, "hold", info,
    )  # fmt: skip
    wait_for(info.exists, f"{name} to hold its devices")
    return launch, info


def test_twenty_jobs_run_two_at_a_time_in_order(box: QueueBox) -> None:
    blocker, info = _hold(box, "blocker", "--gpus", "2")
    ids = {}
    with Watcher(box) as watch:
        for n in range(1, 21):
            extra = ["--priority", "5"] if n in (8, 15) else []
            if n == 5:
                continue  # submitted last, --after job 12
            ids[n] = box.submit("--gpus", "1", *extra, *box.audit_job(f"j{n}", 0.4))
        ids[5] = box.submit("--gpus", "1", "--after", str(ids[12]), *box.audit_job("j5", 0.4))
        first = box.jobs()[str(ids[1])]
        assert first["state"] == "waiting"
        assert f"leased by pid {blocker.pid} (root)" in first["reason"]
        (Path(f"{info}.release")).touch()  # the plain launch ends: its devices go to the queue
        box.wait_states(dict.fromkeys(ids.values(), "done"), timeout_s=120)
        blocker.communicate(timeout=30)
    records = {r["tag"]: r for r in box.records()}
    assert len(records) == 20
    # Two at a time, each device to one job at a time.
    assert overlaps(list(records.values())) <= 2
    for device in {r["device"] for r in records.values()}:
        assert overlaps([r for r in records.values() if r["device"] == device]) == 1
    assert watch.most_running <= 2
    # Job 1 waited in the lease line first; then priority, then submission order.
    order = [r["tag"] for r in sorted(records.values(), key=lambda r: r["start_s"])]
    assert order[0] == "j1"
    assert order[1:3] == ["j8", "j15"]
    plain = [t for t in order if t not in ("j1", "j8", "j15", "j5")]
    assert plain == sorted(plain, key=lambda t: int(t[1:]))
    assert records["j5"]["start_s"] >= records["j12"]["end_s"]  # --after: once 12 succeeded
    # `queue` showed every job's states in order, and each state at least once overall.
    for job_id, states in watch.seen.items():
        positions = [PROGRESS.index(s) for s in states]
        assert positions == sorted(positions), (job_id, states)
    assert {"queued", "waiting", "running", "done"} <= {s for v in watch.seen.values() for s in v}
    assert any(r.startswith("after job") for r in watch.reasons.get(str(ids[5]), ()))
    assert box.status()["leases"] == []


def test_jobs_outlive_a_killed_runner_and_the_next_runner_adopts_them(box: QueueBox) -> None:
    ids = [box.submit("--gpus", "1", *box.audit_job(f"k{n}", 2.5)) for n in range(1, 5)]
    jobs = box.wait_states({ids[0]: "running", ids[1]: "running", ids[2]: "waiting"})
    runner = box.runner_pids()["root"]
    # A submit that came before the runner held its lock started a runner of its own, which
    # tries the lock for a second and then leaves: once this one is killed, such a runner
    # would take over (rightly), and the queue would not be left without one.
    wait_for(lambda: not _other_runners(box, runner), "the runners that lost the lock to leave")
    os.kill(runner, signal.SIGKILL)
    wait_gone(runner)
    run_pids = [jobs[str(i)]["pid"] for i in ids[:3]]
    # The running jobs finish without a runner; their leases end with them.
    wait_for(lambda: {"k1", "k2"} <= {r["tag"] for r in box.records()}, "k1 and k2 to finish")
    for pid in run_pids[:2]:
        wait_gone(pid)
    holders = {lease["pid"] for lease in box.status()["leases"]}
    assert not holders & set(run_pids[:2])
    # The job waiting in the lease line takes a device on its own; the fourth stays queued.
    wait_for(lambda: "k3" in {r["tag"] for r in box.records()}, "k3 to run without a runner")
    assert box.jobs()[str(ids[3])]["state"] == "queued"
    assert box.runner_pids() == {}
    # Ended, but no runner noted it: the listing says its "running" may be stale, and why.
    stale = box.jobs()[str(ids[0])]
    assert stale["state"] == "running" and stale["reason"] == (
        "no runner of user root watches it: xpulaunch runner records its end"
    )
    started = box.cli("runner", "--lock-dir", box.lock_dir)
    assert "runner started" in started.stderr
    jobs = box.wait_states(dict.fromkeys(ids, "done"), timeout_s=60)
    assert [jobs[str(i)]["exit_code"] for i in ids] == [0, 0, 0, 0]
    assert sorted(r["tag"] for r in box.records()) == ["k1", "k2", "k3", "k4"]
    assert box.status()["leases"] == []
    log = (box.lock_dir / "queue-jobs-0" / "runner.log").read_text()
    assert f"job {ids[2]}: adopted its run" in log


def _other_runners(box: QueueBox, runner: int) -> list[Any]:
    """The box's runner processes other than ``runner``."""
    return [
        p for p in processes_marked((str(box.lock_dir),))
        if p.pid != runner and {"runner", "--foreground"} <= set(p.info["cmdline"] or ())
    ]  # fmt: skip


def test_two_users_share_one_queue_and_cannot_cancel_each_other(box: QueueBox) -> None:
    mine = box.submit("--gpus", "1", "--hold", *box.audit_job("root-job", 0))
    job = box.audit_job("nobody-job", 0, uid=65534)
    theirs = box.submit("--gpus", "1", "--hold", *job, uid=65534)
    as_root, as_nobody = box.queue(), box.queue(uid=65534)
    seen = [[(j["id"], j["user"], j["state"]) for j in q["jobs"]] for q in (as_root, as_nobody)]
    assert seen[0] == seen[1] == [(mine, "root", "held"), (theirs, "nobody", "held")]
    users = {j["id"]: j["user"] for j in as_root["jobs"]}
    assert users == {mine: "root", theirs: "nobody"}
    # Each user's submit started that user's runner (it takes its lock once it runs).
    wait_for(lambda: set(box.runner_pids()) == {"root", "nobody"}, "a runner of each user")
    refused = box.cli("cancel", "--lock-dir", box.lock_dir, str(mine), uid=65534, check=False)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"xpulaunch: error: job {mine} belongs to root: only root can cancel it\n"
    )
    refused = box.cli("cancel", "--lock-dir", box.lock_dir, str(theirs), check=False)
    assert refused.stderr == (
        f"xpulaunch: error: job {theirs} belongs to nobody: only nobody can cancel it\n"
    )
    box.cli("release", "--lock-dir", box.lock_dir, str(theirs), uid=65534)
    # nobody's job after root's: it waits for root's job, whose runner is not nobody's.
    after_mine = box.submit("--after", str(mine), *job, uid=65534)
    jobs = box.wait_states({theirs: "done", mine: "held"})
    assert jobs[str(mine)]["reason"] == f"held: xpulaunch release {mine}"
    assert jobs[str(after_mine)]["state"] == "queued"
    assert jobs[str(after_mine)]["reason"] == f"after job {mine} (held)"
    (record,) = box.records()
    assert record["uid"] == 65534 and record["queue_job"] == str(theirs)
    out = box.cli("cancel", "--lock-dir", box.lock_dir, str(mine)).stdout
    assert out == f"job {mine}: cancelled (it had not started)\n"
    jobs = box.wait_states({mine: "cancelled", after_mine: "cancelled"})
    assert jobs[str(after_mine)]["reason"] == (
        f"never started: --after {mine}: job {mine} was cancelled"
    )


def test_slots_four_one_device_jobs_on_two_devices(box: QueueBox) -> None:
    ids = [
        box.submit("--gpus", "1", "--slots-per-gpu", "2", *box.audit_job(f"s{n}", 2.0))
        for n in range(1, 6)
    ]
    jobs = box.wait_states(dict.fromkeys(ids[:4], "running") | {ids[4]: "waiting"})
    assert jobs[str(ids[4])]["reason"] == (
        f"waiting for a slot on 1 device: nvidia 0 shared by job {ids[0]}, job {ids[1]}; "
        f"nvidia 1 shared by job {ids[2]}, job {ids[3]}"
    )
    shared = box.status()["slots"]
    assert sorted((s["device"], s["slot"]) for s in shared) == sorted(
        (device, slot) for device in ("0000:00:06.0", "0000:00:07.0") for slot in (0, 1)
    )
    box.wait_states(dict.fromkeys(ids, "done"), timeout_s=60)
    records = {r["tag"]: r for r in box.records()}
    first_four = [records[f"s{n}"] for n in range(1, 5)]
    assert overlaps(first_four) == 4  # all four at once
    for device in (
        "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04",
        "GPU-e436550d-4102-c58c-de2e-988dc6aaa541",
    ):
        on_it = [r for r in records.values() if r["cuda_visible_devices"] == device]
        assert overlaps(on_it) == 2  # never three on one
    assert records["s5"]["start_s"] >= min(r["end_s"] for r in first_four)


def test_cancel_a_running_job_and_a_wait_launch(box: QueueBox) -> None:
    running = box.submit("--gpus", "2", "--grace", "2", *box.audit_job("long", 60))
    queued = box.submit("--gpus", "1", *box.audit_job("never", 0))
    box.wait_states({running: "running", queued: "waiting"})
    waiter = box.start(
        "run", "--wait", "--lock-dir", box.lock_dir, "--inventory", box.inventory, "--gpus", "1",
        "--", "true",
    )  # fmt: skip
    jobs = wait_for(lambda: box.jobs().get(f"w{waiter.pid}"), "the --wait launch in the queue")
    assert jobs["state"] == "waiting" and jobs["reason"].startswith("xpulaunch --wait: ")
    reason = box.jobs()[str(queued)]["reason"]
    assert reason == f"waiting for 1 device: nvidia 0, 1 leased by job {running}"
    out = box.cli("cancel", "--lock-dir", box.lock_dir, f"w{waiter.pid}").stdout
    assert out == f"w{waiter.pid}: stopped waiting (SIGTERM)\n"
    assert waiter.wait(timeout=30) == -signal.SIGTERM
    out = box.cli("cancel", "--lock-dir", box.lock_dir, "--all").stdout
    assert out.splitlines() == [
        f"job {running}: stopping (SIGTERM; its workers get 2 s to exit)",
        f"job {queued}: stopping (SIGTERM; its workers get 10 s to exit)",
    ]
    jobs = box.wait_states({running: "cancelled", queued: "cancelled"})
    assert jobs[str(running)]["exit_code"] == 128 + signal.SIGTERM
    assert box.records() == []
    wait_for(lambda: box.status()["leases"] == [], "the leases to end")
    for name in os.listdir(box.lock_dir):
        if name.startswith("unit-") and name.endswith(".lock"):
            assert lock_is_free(box.lock_dir / name)


def test_logs_of_a_job(box: QueueBox) -> None:
    printer = ["--", "python3", "-c", "import os; print('hello from', os.environ['RANK'])"]
    job = box.submit("--gpus", "2", "--nproc-per-node", "2", *printer)
    box.wait_states({job: "done"})
    out = box.cli("logs", "--lock-dir", box.lock_dir, str(job)).stdout.splitlines()
    stamp = r"\d{4}-\d\d-\d\dT[\d:.]+Z"  # each line as the worker's log file holds it
    assert [re.sub(stamp + " ", "", line) for line in sorted(out)] == [
        "[0] hello from 0",
        "[1] hello from 1",
    ]
    out = box.cli("logs", "--lock-dir", box.lock_dir, str(job), "--rank", "1").stdout
    assert re.fullmatch(stamp + " hello from 1\n", out)
    held = box.submit("--hold", "--", "true")
    done = box.cli("logs", "--lock-dir", box.lock_dir, str(held), check=False)
    assert done.stderr == (
        f"xpulaunch: error: job {held} has not started yet (held); "
        f"'xpulaunch logs -f {held}' waits for it\n"
    )
    follow = box.start("logs", "-f", "--lock-dir", box.lock_dir, str(held))
    time.sleep(0.5)
    box.cli("release", "--lock-dir", box.lock_dir, str(held))
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert out == ""  # `true` prints nothing; -f ended with the job


def test_jobs_sharing_one_events_file_each_read_their_own(box: QueueBox) -> None:
    events = box.root / "events.jsonl"
    events.touch()
    events.chmod(0o666)
    first = box.submit("--gpus", "2", "--events", events, *box.audit_job("e1", 1.0))
    second = box.submit("--gpus", "1", "--events", events, *box.audit_job("e2", 0))
    jobs = box.wait_states({first: "done", second: "done"})
    assert jobs[str(first)]["devices"] == ["nvidia 0 (0000:00:06.0)", "nvidia 1 (0000:00:07.0)"]
    assert jobs[str(second)]["devices"] == ["nvidia 0 (0000:00:06.0)"]
    kinds = [line.split('"event":"')[1].split('"')[0] for line in events.read_text().splitlines()]
    assert kinds.count("lease_acquired") == 2 and kinds.count("stopped") == 2


@contextlib.contextmanager
def runner_here(box: QueueBox) -> Iterator[tuple[Runner, Store]]:
    """This test as the user's runner (stop the one ``submit`` started first): a
    :class:`Runner` whose turns the test takes, and the queue's store."""
    env = box.env()
    directory = actions.queue_directory(str(box.lock_dir), env)
    lock = RunnerLock(directory, os.getuid())
    assert lock.acquire()
    store = Store.open(directory, env, create=False)
    assert store is not None
    try:
        yield Runner(directory, env, log=lambda line: None), store
    finally:
        store.close()
        lock.release()


def test_a_job_cancelled_while_its_run_starts_is_stopped_at_once(
    box: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cancel`` lands between the runner marking the job started and recording its run's
    pid: it finds no pid to signal, so the runner must. (Before, the run went on for its
    grace and ten seconds more, then was killed with SIGKILL: its workers got no grace.)"""
    job_id = box.submit("--gpus", "1", "--hold", *box.audit_job("late", 60))
    box.stop_runner()
    env = box.env()
    said = []

    def cancelled_meanwhile(job: Job, spec: JobSpec, where: LockDirectory) -> Any:
        with Store.open(where, env, create=False) as other:  # type: ignore[union-attr]
            said.append(actions.cancel(where, other, job.id))
        return real_start(job, spec, where)

    real_start = job_process.start
    monkeypatch.setattr(job_process, "start", cancelled_meanwhile)
    with runner_here(box) as (runner, store):
        box.cli("release", "--lock-dir", box.lock_dir, str(job_id))
        start_s = time.monotonic()

        def ended() -> Job | None:
            runner.turn(store)
            job = store.job(job_id)
            return job if job is not None and job.state.ended else None

        job = wait_for(ended, "the job cancelled while it started to end", timeout_s=15)
        assert elapsed(start_s) < 10  # its grace is 10 s: it was not waited for
    assert said == [f"job {job_id}: cancelled; its run is ending (its runner records it)"]
    assert job.state is JobState.CANCELLED
    assert job.exit_code == 128 + signal.SIGTERM
    assert box.records() == []
    wait_for(lambda: box.status()["leases"] == [], "the lease to end")


def test_a_job_cancelled_while_its_runner_died_starting_it_never_runs(box: QueueBox) -> None:
    """A runner killed after marking a job started but before starting its run, and the job
    cancelled meanwhile: the next runner ends it; it does not put it back in line."""
    job_id = box.submit("--gpus", "1", "--hold", *box.audit_job("never", 0))
    box.stop_runner()
    database = box.database()
    with contextlib.closing(sqlite3.connect(database, isolation_level=None)) as db:
        db.execute(  # as the runner left it
            "UPDATE jobs SET state = 'starting', started_s = ? WHERE id = ?", (time.time(), job_id)
        )
    out = box.cli("cancel", "--lock-dir", box.lock_dir, str(job_id)).stdout
    assert out == f"job {job_id}: cancelled; its run is ending (its runner records it)\n"
    box.cli("runner", "--lock-dir", box.lock_dir)
    jobs = box.wait_states({job_id: "cancelled"})
    assert jobs[str(job_id)]["reason"] == "cancelled before its run started"
    assert jobs[str(job_id)]["pid"] is None
    assert box.records() == []


class SteppedClock:
    """The runner's ``time`` module with its wall clock stepped by ``step_s`` (NTP, a VM
    resumed); its monotonic clock goes on as the host's."""

    def __init__(self) -> None:
        self.step_s = 0.0
        self.monotonic, self.sleep, self.strftime = time.monotonic, time.sleep, time.strftime

    def time(self) -> float:
        return time.time() + self.step_s


def test_a_clock_stepped_forward_after_a_cancel_leaves_the_workers_their_grace(
    box: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled job's run is killed by its runner only once its grace (and a margin) is
    over, on the monotonic clock. (Before, the runner counted from the wall-clock time of
    the cancel: a clock stepped an hour forward had it SIGKILL the run at once, and the
    workers never got their grace.)"""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    job_id = box.submit("--gpus", "1", "--grace", "2", "--hold", "--", sys.executable, "-c",
                        stubborn)  # fmt: skip
    box.stop_runner()
    clock = SteppedClock()
    monkeypatch.setattr(runner_module, "time", clock)
    with runner_here(box) as (runner, store):

        def reached(state: JobState) -> Job | None:
            runner.turn(store)
            job = store.job(job_id)
            return job if job is not None and job.state in (state, JobState.FAILED) else None

        box.cli("release", "--lock-dir", box.lock_dir, str(job_id))
        running = wait_for(lambda: reached(JobState.RUNNING), "the job to run")
        assert running.state is JobState.RUNNING
        box.cli("cancel", "--lock-dir", box.lock_dir, str(job_id))
        cancelled_s = time.monotonic()
        clock.step_s = 3600.0
        job = wait_for(lambda: reached(JobState.CANCELLED), "the job to end", timeout_s=30)
    assert elapsed(cancelled_s) >= 2.0  # its --grace
    assert (job.state, job.exit_code) == (JobState.CANCELLED, 128 + signal.SIGTERM)
    assert job.reason is not None and "SIGKILL" not in job.reason
    wait_for(lambda: box.status()["leases"] == [], "the lease to end")
