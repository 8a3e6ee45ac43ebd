"""The job queue's pure decisions: order, dependencies, who starts next, why a job waits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from xpulaunch.jobqueue.policy import (
    Holding,
    Job,
    JobState,
    QueueView,
    Waiter,
    format_duration,
    never_runs,
    next_to_start,
    queue_order,
    short_devices,
    wanted_text,
)

ROOT, BOB = 0, 1000


def job(job_id: int, state: JobState = JobState.QUEUED, **fields: object) -> Job:
    values: dict[str, object] = {
        "id": job_id, "uid": ROOT, "user": "root", "state": state,
        "command": ("python", f"job{job_id}.py"), "submitted_s": 1000.0 + job_id,
    }  # fmt: skip
    values.update(fields)
    return Job(**values)  # type: ignore[arg-type]


def test_order_is_priority_then_submission() -> None:
    jobs = [job(1), job(2, priority=5), job(3), job(4, priority=5), job(5, JobState.RUNNING)]
    assert [j.id for j in queue_order(jobs)] == [2, 4, 1, 3]


def test_held_jobs_keep_their_place_but_do_not_start() -> None:
    jobs = [job(1, JobState.HELD), job(2)]
    assert [j.id for j in queue_order(jobs)] == [1, 2]
    assert next_to_start(jobs, {ROOT}) == jobs[1]


def test_one_job_waits_in_the_lease_line_at_a_time() -> None:
    jobs = [job(1, JobState.STARTING), job(2)]
    assert next_to_start(jobs, {ROOT}) is None
    assert next_to_start([replace(jobs[0], state=JobState.RUNNING), jobs[1]], {ROOT}) == jobs[1]


def test_a_starting_job_of_a_user_without_runner_holds_nobody_up() -> None:
    jobs = [job(1, JobState.STARTING, uid=BOB, user="bob"), job(2)]
    assert next_to_start(jobs, {ROOT}) == jobs[1]


def test_a_user_without_runner_is_skipped_not_waited_for() -> None:
    jobs = [job(1, uid=BOB, user="bob"), job(2)]
    assert next_to_start(jobs, {ROOT}) == jobs[1]
    assert next_to_start(jobs, {ROOT, BOB}) == jobs[0]  # bob's runner starts it, root's waits


@pytest.mark.parametrize(
    ("after_state", "exit_code", "ready", "never"),
    [
        (JobState.DONE, 0, True, False),
        (JobState.RUNNING, None, False, False),
        (JobState.QUEUED, None, False, False),
        (JobState.FAILED, 3, False, True),
        (JobState.CANCELLED, None, False, True),
    ],
)
def test_after_waits_for_success(
    after_state: JobState, exit_code: int | None, ready: bool, never: bool
) -> None:
    jobs = [job(1, after_state, exit_code=exit_code), job(2, after=(1,))]
    assert (next_to_start(jobs, {ROOT}) == jobs[1]) is ready
    doomed = never_runs(jobs)
    assert bool(doomed) is never
    if after_state is JobState.FAILED:
        assert doomed[0][1] == "--after 1: job 1 failed (exit status 3)"


# (--after kind, the other job's state, whether this job may start, whether it never will)
_KINDS = [
    ("after", JobState.DONE, True, False),
    ("after", JobState.FAILED, False, True),
    ("after", JobState.CANCELLED, False, True),
    ("after", JobState.RUNNING, False, False),
    ("after_any", JobState.DONE, True, False),
    ("after_any", JobState.FAILED, True, False),
    ("after_any", JobState.CANCELLED, True, False),
    ("after_any", JobState.QUEUED, False, False),
    ("after_any", JobState.RUNNING, False, False),
    ("after_fail", JobState.DONE, False, True),
    ("after_fail", JobState.FAILED, True, False),
    ("after_fail", JobState.CANCELLED, True, False),
    ("after_fail", JobState.HELD, False, False),
    ("after_fail", JobState.STARTING, False, False),
]


@pytest.mark.parametrize(("kind", "other_state", "ready", "never"), _KINDS)
def test_each_dependency_kind(kind: str, other_state: JobState, ready: bool, never: bool) -> None:
    jobs = [job(1, other_state, uid=BOB, user="bob"), job(2, **{kind: (1,)})]
    assert (next_to_start(jobs, {ROOT}) == jobs[1]) is ready
    assert bool(never_runs(jobs)) is never


def test_dependency_texts() -> None:
    ok = [job(1, JobState.DONE, exit_code=0), job(2, after_fail=(1,))]
    assert never_runs(ok)[0][1] == "--after-fail 1: job 1 succeeded"
    waiting = [job(1, JobState.RUNNING), job(2, after_any=(1,), after_fail=(1,))]
    assert QueueView(waiting, runner_uids={ROOT}).why(waiting[1]) == (
        "after job 1 to end (running), job 1 to fail (running)"
    )
    assert never_runs([job(2, after_any=(1,))])[0][1] == "job 1 is not in the queue any more"


def test_a_cpu_job_is_not_held_behind_a_gpu_job_waiting_for_devices() -> None:
    gpu_waits = job(1, JobState.STARTING, gpus="2", reason="waiting for 2 devices")
    jobs = [gpu_waits, job(2, gpus="2"), job(3, gpus="none"), job(4, gpus="1")]
    assert next_to_start(jobs, {ROOT}) == jobs[2]  # the CPU job, past the GPU job 2
    view = QueueView(jobs, runner_uids={ROOT})
    assert view.why(jobs[2]) == "queued: starts next"
    assert view.why(jobs[1]) == "queued: job 1 waits for devices first"
    # A CPU job starting holds no GPU job up either, and higher priority still goes first.
    cpu_starts = [job(1, JobState.STARTING, gpus="none"), job(2, gpus="2")]
    assert next_to_start(cpu_starts, {ROOT}) == cpu_starts[1]
    first = [gpu_waits, job(2, gpus="none"), job(3, gpus="none", priority=5)]
    assert next_to_start(first, {ROOT}) == first[2]


def test_a_draining_runner_is_said() -> None:
    jobs = [job(1)]
    view = QueueView(jobs, runner_uids={ROOT}, draining_uids={ROOT})
    assert view.why(jobs[0]) == "the runner of user root drains: xpulaunch runner --resume"


def test_after_a_job_that_is_gone_never_runs() -> None:
    assert never_runs([job(2, after=(1,))])[0][1] == "job 1 is not in the queue any more"


def test_a_waiting_dependency_does_not_block_later_jobs() -> None:
    jobs = [job(1, JobState.RUNNING), job(2, after=(1,)), job(3)]
    assert next_to_start(jobs, {ROOT}) == jobs[2]


def test_why_a_queued_job_waits() -> None:
    jobs = [
        job(1, JobState.STARTING, reason="1 earlier launch(es) go first"),
        job(2, priority=1),
        job(3),
        job(4, after=(1,)),
        job(5, JobState.HELD),
        job(6, uid=BOB, user="bob"),
    ]
    view = QueueView(
        jobs,
        waiters=[Waiter(77, "bob", 900.0, ("xpulaunch", "x.py"), "--gpus 2: ...")],
        runner_uids={ROOT},
    )
    assert view.why(jobs[0]) == "waiting behind 1 earlier launch(es) in the lease line: w77 (bob)"
    assert view.why(jobs[1]) == "queued: job 1 waits for devices first"
    assert view.why(jobs[2]) == "queued: job 1 waits for devices first; 1 queued job first (2)"
    assert view.why(jobs[3]) == "after job 1 (starting)"
    assert view.why(jobs[4]) == "held: xpulaunch release 5"
    assert view.why(jobs[5]) == "no runner of user bob is running: xpulaunch runner"


def test_why_a_started_job_waits_names_the_jobs_holding_devices() -> None:
    waiting = job(3, JobState.STARTING, gpus="2", reason="--gpus 2: only 0 free device(s)")
    holdings = [
        Holding(11, "root", ("nvidia 0 (0000:00:06.0)",), job=1),
        Holding(12, "bob", ("0000:00:07.0",)),
    ]
    view = QueueView([waiting], holdings=holdings)
    assert view.why(waiting) == (
        "waiting for 2 devices: nvidia 0 leased by job 1; 0000:00:07.0 leased by pid 12 (bob)"
    )
    assert QueueView([waiting]).why(waiting) == (
        "waiting for 2 devices: --gpus 2: only 0 free device(s)"
    )


def test_why_for_running_and_ended_jobs() -> None:
    view = QueueView([], runner_uids={ROOT})
    assert view.why(job(1, JobState.RUNNING)) == ""
    assert view.why(job(1, JobState.FAILED, reason="gave up")) == "gave up"
    # No runner of its user: nobody records its end, so "running" may be stale.
    assert QueueView([]).why(job(1, JobState.RUNNING)) == (
        "no runner of user root watches it: xpulaunch runner records its end"
    )


@pytest.mark.parametrize(
    ("gpus", "wanted", "shares", "text"),
    [
        ("2", (), False, "2 devices"),
        ("1", (), True, "a slot on 1 device"),
        ("auto", (), False, "a free device"),
        ("0,1", ("nvidia 0 (a)", "nvidia 1 (b)"), False, "nvidia 0, 1"),
        ("intel:0.1", ("intel 0 (0000:29:00.0) tile 1",), False, "intel 0.1"),
    ],
)
def test_wanted_text(gpus: str, wanted: tuple[str, ...], shares: bool, text: str) -> None:
    assert wanted_text(job(1, gpus=gpus, wanted=wanted, shares=shares)) == text


def test_short_devices_groups_by_vendor() -> None:
    labels = ["nvidia 0 (0000:00:06.0)", "nvidia 1 (0000:00:07.0)", "amd 2", "0000:99:00.0"]
    assert short_devices(labels) == "nvidia 0, 1, amd 2, 0000:99:00.0"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.4, "0s"), (59, "59s"), (61, "1m01s"), (3725, "1h02m"), (90000, "1d01h")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_waited_and_runtime() -> None:
    running = job(1, JobState.RUNNING, leased_s=1011.0)
    assert running.waited_s == 10.0
    assert running.runtime_s(1021.0) == 10.0
    assert job(2).waited_s is None
