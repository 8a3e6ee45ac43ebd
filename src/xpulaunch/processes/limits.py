"""Enough open-file descriptors for the job, checked before anything starts.

The supervisor holds about :data:`FDS_PER_WORKER` descriptors per worker (its stdout and
stderr pipes and a pidfd) besides its own. At the usual default ``ulimit -n`` of 1024 that
caps a job near 330 workers, and the failure surfaced as a worker that "cannot be started"
(EMFILE), blaming the program. So the soft limit is raised to what the job needs, never above
the hard limit (an unprivileged process may do that: setrlimit(2)); where the hard limit is
too low, the error says how many are needed. Only a job that needs more raises it, so most
workers inherit the limit they would have had without xpulaunch (a program using
``select(2)`` breaks with descriptors above 1023).
"""

from __future__ import annotations

import errno
import resource

from xpulaunch.errors import XpulaunchError

FDS_PER_WORKER = 3  # stdout and stderr pipes, pidfd
FDS_RESERVE = 64  # the interpreter, leases, the guardian's pipe, a spawn's pipes, a health check


def needed_open_files(workers: int, log_files_per_worker: int = 0) -> int:
    """``log_files_per_worker``: files each worker's log keeps open (``--log-dir``: 1 in
    our layout, stdout and stderr in torchrun's)."""
    return (FDS_PER_WORKER + log_files_per_worker) * workers + FDS_RESERVE


def ensure_open_files(workers: int, log_files_per_worker: int = 0) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to what ``workers`` need; an error if the hard limit
    is too low."""
    needed = needed_open_files(workers, log_files_per_worker)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise XpulaunchError(
            f"{workers} workers need about {needed} open files, but 'ulimit -n' allows "
            f"{soft} (hard limit {hard}); raise the hard limit (limits.conf, systemd "
            f"LimitNOFILE=) or start fewer workers"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def out_of_files_message(exc: OSError) -> str | None:
    """For EMFILE/ENFILE (this process, or the whole system, out of file descriptors): what
    to say instead of blaming the program being started; None for any other error."""
    if exc.errno == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f"xpulaunch itself ran out of open files ('ulimit -n' is {soft}); raise it, or "
            "start fewer workers"
        )
    if exc.errno == errno.ENFILE:
        return "the system ran out of open files (fs.file-max); close some, or raise it"
    return None
