"""What a run refuses before it plans, shared by the dry run and the real run so that the two
cannot drift (both call :func:`xpulaunch.launch.run.refuse_early`, which also checks the
``XPULAUNCH_CGROUP`` setting, and loads this module only where there is something here to
check): torch for a c10d rendezvous, and the ``--log-dir`` and ``--events`` paths. Nothing is
created: a path is checked for what the real run will do there (make the directory, open the
file to append).

Leases are the other half of "refuse what a real run refuses": both go through
:class:`~xpulaunch.leases.LeaseManager` (``preview`` and ``allocate``), also for an
``--inventory`` document.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from typing import TYPE_CHECKING

from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from xpulaunch.launch.request import RunRequest
    from xpulaunch.nodes.settings import NodeSettings


def preflight(request: RunRequest, nodes: NodeSettings) -> None:
    """Raise the one-line :class:`UsageError` a real run of ``request`` would end with before
    it starts anything; return quietly otherwise."""
    if nodes.elastic is not None:
        need_torch()
    if request.log_dir is not None:
        check_log_dir(request.log_dir)
    if request.events is not None and request.events != "-":
        check_events(request.events)


def need_torch() -> None:
    """c10d runs torch's elastic agent: say so in one line where torch is missing (looked up,
    not imported: the supervisor never imports torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "--rdzv-backend c10d runs torch's elastic agent, and torch is not installed for "
            f"{sys.executable}; install your vendor's torch build, or use --rdzv-backend static"
        )


def check_log_dir(path: str) -> None:
    """``--log-dir``: an existing writable directory, or one that can be made in its nearest
    existing parent (as :func:`~xpulaunch.joblog.logs.make_log_dir` does)."""
    problem = _dir_problem(path)
    if problem is not None:
        raise UsageError(
            f"--log-dir {path}: cannot create or write it ({problem}); give a writable directory"
        )


def check_events(path: str) -> None:
    """``--events FILE``: a file that can be opened to append (a FIFO without a reader yet is
    fine: the run opens it later), or one that can be made in its directory."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _events_error(path, exc.strerror) from exc
    if mode is None:
        parent = os.path.dirname(os.path.abspath(path))
        problem = _create_problem(parent)
    elif stat.S_ISDIR(mode):
        problem = os.strerror(errno.EISDIR)
    elif stat.S_ISFIFO(mode) or os.access(path, os.W_OK):
        problem = None
    else:
        problem = os.strerror(errno.EACCES)
    if problem is not None:
        raise _events_error(path, problem)


def _events_error(path: str, problem: str | None) -> UsageError:
    return UsageError(f"--events {path}: cannot write it ({problem})")


def _dir_problem(path: str) -> str | None:
    """Why ``os.makedirs(path)`` and writing into it would fail, or None."""
    if os.path.isdir(path):
        return None if os.access(path, os.W_OK | os.X_OK) else os.strerror(errno.EACCES)
    if os.path.lexists(path):  # a file, or a symbolic link to nothing: makedirs says so
        return os.strerror(errno.EEXIST)
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return os.strerror(errno.ENOTDIR)
    return _create_problem(parent)


def _create_problem(directory: str) -> str | None:
    """Whether something can be made in ``directory``, which is left as it was. Permission
    bits do not tell (root passes every ``access()`` check, and ``/proc`` refuses new entries
    to root too), so it is tried: an unnamed ``O_TMPFILE`` file, which never appears in the
    directory; where the file system has no such files, a directory made and removed."""
    try:
        os.close(os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600))
        return None
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return exc.strerror
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".xpulaunch-check-", dir=directory))
    except OSError as exc:
        return exc.strerror
    return None
