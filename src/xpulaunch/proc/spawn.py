"""Starting one worker process: argv list, fresh env, own session, parent-death signal.

Choices, each for a reason:

* ``argv`` is a list and there is never a shell, so no quoting bugs and no extra process
  between us and the worker.
* ``start_new_session=True``: the worker leads its own session and process group, so a stop
  signal reaches its whole tree with one ``killpg`` and the terminal's Ctrl-C reaches only
  the supervisor, which forwards it once (torch PR #113231).
* ``PR_SET_PDEATHSIG=SIGKILL`` is set in the child (``preexec_fn``) so the kernel kills the
  worker if the supervisor dies, even by SIGKILL. It fires when the parent *thread* exits
  (prctl(2)), so every worker is spawned from the supervisor's one loop thread, which lives
  until every worker is gone; never from a short-lived helper thread. The child re-checks its
  parent after the prctl in case the supervisor died in between (the documented race).
* Children get stdout/stderr pipes (read by the loop, prefixed, written to the console and
  log files) and /dev/null as stdin: a worker in its own session cannot read the terminal.
* No fork after probing: the supervisor never initialises a GPU runtime (pitfall 5).
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import IO

_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's ``prctl``, resolved in the parent with its argument types.

    The child between fork and exec should do as little as possible, and the parent waits
    for its exec: looking the symbol up there (``CDLL.__getattr__`` builds the function
    object) cost every spawn ~0.3 ms (issue 4).
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    ulong = ctypes.c_ulong
    prctl.argtypes = (ctypes.c_int, ulong, ulong, ulong, ulong)
    prctl.restype = ctypes.c_int
    return prctl


def _child_setup(prctl: Callable[..., int], parent_pid: int, death_signal: int) -> None:
    if prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != parent_pid:  # the supervisor died before the prctl took effect
        os._exit(126)


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    death_signal: int | None = 9,
) -> subprocess.Popen[bytes]:
    """Start one worker; raises ``OSError`` when the program cannot be executed."""
    parent_pid = os.getpid()
    preexec = None
    if death_signal:
        prctl, signum = _prctl(), death_signal

        def preexec() -> None:
            _child_setup(prctl, parent_pid, signum)

    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        preexec_fn=preexec,  # noqa: PLW1509  (only prctl + getppid; see module docstring)
    )
    for stream in _pipes(proc):
        os.set_blocking(stream.fileno(), False)
    return proc


def _pipes(proc: subprocess.Popen[bytes]) -> list[IO[bytes]]:
    return [s for s in (proc.stdout, proc.stderr) if s is not None]


def open_pidfd(pid: int) -> int | None:
    """A pidfd that becomes readable when ``pid`` exits; None where the kernel has none.

    Waiting on pidfds in one ``selectors`` loop is what lets one thread supervise hundreds
    of idle workers without polling (Linux >= 5.3).
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:  # ENOSYS on old kernels; the caller falls back to a waiter thread
        return None
    return fd
