"""Hundreds of workers at a low ``ulimit -n``: raised to what the job needs, or a clear error
naming the need (not a worker that 'cannot be started' with status 127)."""

from __future__ import annotations

import resource
from collections.abc import Callable

from fault_cli import Launch, finish


def limited(soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_soft_limit_is_raised_to_what_the_job_needs(launch: Launch) -> None:
    proc = launch("run", "--nproc-per-node", "150", "true", preexec_fn=limited(256, 4096))
    code, _, err = finish(proc, timeout_s=120)
    assert code == 0, err[-2000:]


def test_a_hard_limit_too_low_names_what_is_needed(launch: Launch) -> None:
    proc = launch("run", "--nproc-per-node", "150", "true", preexec_fn=limited(256, 256))
    code, _, err = finish(proc, timeout_s=120)
    assert code == 1, err[-2000:]
    assert err.count("\n") <= 2 and "Traceback" not in err
    assert "150 workers need about 514 open files" in err
    assert "ulimit -n" in err
