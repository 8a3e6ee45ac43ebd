"""Starting one worker process: argv list, fresh env, own session, parent-death signal; and
enough open-file descriptors for all of them.

Choices, each for a reason:

* ``argv`` is a list and there is never a shell, so no quoting bugs and no extra process
  between us and the worker.
* ``start_new_session=True``: the worker leads its own session and process group, so a stop
  signal reaches its whole tree with one ``killpg`` and the terminal's Ctrl-C reaches only
  the supervisor, which forwards it once (torch PR #113231).
* ``PR_SET_PDEATHSIG=SIGKILL`` is set in the child so the kernel kills the worker if the
  supervisor dies, even by SIGKILL. It fires when the parent *thread* exits (prctl(2)), so
  every worker is spawned from the supervisor's one loop thread, which lives until every
  worker is gone; never from a short-lived helper thread. Two ways to set it:

  - util-linux's ``setpriv --pdeathsig KILL -- PROGRAM...`` (2.33+) sets it and execs the
    program: no Python runs in the child, so CPython can use ``vfork`` and this process
    waits only for the exec, not for a full fork + ``preexec_fn`` (and ctypes is never
    imported). Used only when the exec is sure to succeed (:func:`_exec_will_succeed`), so that a
    program that cannot run is still an ``OSError`` here, not a worker exiting 126/127.
  - otherwise ``preexec_fn`` calls prctl through ctypes, then re-checks the parent in case
    the supervisor died in between (the documented race). setpriv does not re-check: a
    worker orphaned in that window is killed by the guardian (it carries the job's marker).
* Children get stdout/stderr pipes (read by the loop, prefixed, written to the console and
  log files) and /dev/null as stdin: a worker in its own session cannot read the terminal.
* No fork after probing: the supervisor never initialises a GPU runtime, whose state does
  not survive ``fork(2)`` (a CUDA context is not usable in a forked child).
* A worker whose environment has ``XPULAUNCH_CPUS`` (``--cpu-bind``) is bound to those CPUs
  in the child, between fork and exec (``sched_setaffinity``): the program's first thread
  starts bound and every thread and process it creates inherits the mask (sched_setaffinity(2)),
  with no ``taskset``/``numactl`` needed on the host and the argv left as planned. That takes
  the ``preexec_fn`` way, as a cgroup does.
* Enough open-file descriptors for the job, checked before anything starts
  (:func:`ensure_open_files`). The supervisor holds about :data:`FDS_PER_WORKER` descriptors per
  worker (its stdout and stderr pipes and a pidfd) besides its own. At the usual default
  ``ulimit -n`` of 1024 that caps a job near 330 workers, and the failure surfaced as a worker
  that "cannot be started" (EMFILE), blaming the program. So the soft limit is raised to what
  the job needs, never above the hard limit (an unprivileged process may do that: setrlimit(2));
  where the hard limit is too low, the error says how many are needed. Only a job that needs
  more raises it, so most workers inherit the limit they would have had without xpulaunch (a
  program using ``select(2)`` breaks with descriptors above 1023).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import resource
import signal
import subprocess
from shutil import which
from typing import TYPE_CHECKING

from xpulaunch.errors import XpulaunchError
from xpulaunch.model import CPUS_VAR
from xpulaunch.processes.program import find_executable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

PR_SET_PDEATHSIG = 1


@functools.cache
def libc_prctl() -> Callable[..., int]:
    """libc's ``prctl``, resolved in the parent with its argument types.

    The child between fork and exec should do as little as possible, and the parent waits
    for its exec, so the symbol is looked up (``CDLL.__getattr__`` builds the function
    object) once, here.
    """
    import ctypes  # here: only the preexec_fn way needs it

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    ulong = ctypes.c_ulong
    prctl.argtypes = (ctypes.c_int, ulong, ulong, ulong, ulong)
    prctl.restype = ctypes.c_int
    return prctl


def _child_setup(
    prctl: Callable[..., int],
    parent_pid: int,
    death_signal: int,
    cgroup_fd: int | None,
    cpus: frozenset[int] | None = None,
) -> None:
    if cgroup_fd is not None:  # join the worker's cgroup before anything can fork
        # EBUSY/EOPNOTSUPP (a parent with controllers enabled): run uncontained, not fail.
        with contextlib.suppress(OSError):
            os.write(cgroup_fd, b"0")
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:  # EINVAL: none of them is allowed here (a cpuset changed)
            os.write(2, f"xpulaunch: cannot bind to CPUs {sorted(cpus)}: {exc}\n".encode())
            os._exit(126)
    if not death_signal:
        return
    if prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
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
    cgroup_fd: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start one worker; raises ``OSError`` when the program cannot be executed.

    ``cgroup_fd``: a leaf's ``cgroup.procs``, which the child joins before it execs (so the
    preexec way is taken: setpriv cannot join a cgroup)."""
    argv, parent_pid, preexec = list(argv), os.getpid(), None
    cpus = bound_cpus(env)
    setpriv = _setpriv() if death_signal and cgroup_fd is None and not cpus else None
    if death_signal and setpriv and _exec_will_succeed(argv[0], env, cwd):
        argv = [setpriv, "--pdeathsig", signal.Signals(death_signal).name, "--", *argv]
    elif death_signal or cgroup_fd is not None or cpus:
        prctl, signum = libc_prctl(), death_signal or 0

        def preexec() -> None:
            _child_setup(prctl, parent_pid, signum, cgroup_fd, cpus)

    proc = subprocess.Popen(
        argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        preexec_fn=preexec,  # noqa: PLW1509  (only prctl + getppid; see module docstring)
    )
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            os.set_blocking(stream.fileno(), False)
    return proc


def bound_cpus(env: Mapping[str, str]) -> frozenset[int] | None:
    """The CPUs ``XPULAUNCH_CPUS`` binds a child to; None when unset or empty. A value that
    is not a CPU list is an ``OSError`` (EINVAL), as an unusable program is."""
    text = env.get(CPUS_VAR)
    if not text:
        return None
    from xpulaunch.core.cpu_bind import parse_cpulist  # --cpu-bind only

    try:
        return parse_cpulist(text) or None
    except ValueError as exc:
        raise OSError(errno.EINVAL, f"{CPUS_VAR}={text!r}: {exc}") from None


# setpriv is looked for in the system's directories only, never on a user's PATH.
SETPRIV_PATH = "/usr/bin:/bin"
SETPRIV_MIN_VERSION = (2, 33)  # util-linux 2.33 (2018) added --pdeathsig
_SETPRIV_TIMEOUT_S = 5.0


@functools.cache
def _setpriv() -> str | None:
    """util-linux's setpriv when it has ``--pdeathsig``, else None; asked once per process.

    ``setpriv --version`` says ``setpriv from util-linux 2.38.1``. busybox's setpriv applet
    has no ``--pdeathsig`` and does not answer so, nor does anything else named setpriv.
    """
    path = which("setpriv", path=SETPRIV_PATH)
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=_SETPRIV_TIMEOUT_S,
            env={"LC_ALL": "C"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    version = util_linux_version(done.stdout)
    return path if version is not None and version >= SETPRIV_MIN_VERSION else None


def util_linux_version(text: str) -> tuple[int, ...] | None:
    """``(2, 38, 1)`` from ``setpriv from util-linux 2.38.1``; None for anything else."""
    words = text.split()
    if len(words) < 4 or words[1:3] != ["from", "util-linux"]:
        return None
    numbers = words[3].split("-")[0].split(".")
    if not all(n.isdigit() for n in numbers[:2]) or len(numbers) < 2:
        return None
    return tuple(int(n) for n in numbers if n.isdigit())


def _exec_will_succeed(program: str, env: Mapping[str, str], cwd: str | None) -> bool:
    """Will ``execve`` of ``program`` succeed, as Popen would run it? Decides whether setpriv
    may run it: only a sure yes counts, an executable regular file (found as
    :func:`~xpulaunch.processes.program.find_executable` finds it) that is an ELF binary or a
    script whose ``#!`` interpreter is an executable file. (Left out: a binary for another
    machine, which the kernel refuses with ENOEXEC; it then exits 126 with setpriv's message.)
    """
    path = find_executable(program, env.get("PATH", os.defpath), cwd)
    if path is None:
        return False
    head = _head(path)
    if head.startswith(b"\x7fELF"):
        return True
    # No #!: Popen raises ENOEXEC for it (no /bin/sh fallback, unlike execvp).
    interpreter = _interpreter(head) or ""
    return os.path.isabs(interpreter) and find_executable(interpreter, "", None) is not None


def script_interpreter(path: str) -> str | None:
    """The interpreter named by the ``#!`` line of the file at ``path``, as the kernel reads
    it; None for a file that cannot be read or has no ``#!`` line."""
    return _interpreter(_head(path))


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(256)
    except OSError:
        return b""


def _interpreter(head: bytes) -> str | None:
    """The first word of a ``#!`` line, ended by a space or a tab only, as binfmt_script ends
    it: a carriage return left by Windows line endings is part of the name, and the kernel
    then finds no such interpreter (bytes.split() would drop it and call the exec sure)."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].replace(b"\t", b" ").lstrip(b" ")
    return os.fsdecode(line.split(b" ", 1)[0]) or None


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


FDS_PER_WORKER = 3  # stdout and stderr pipes, pidfd
FDS_RESERVE = 64  # the interpreter, leases, the guardian's pipe, a spawn's pipes, a health check


def ensure_open_files(workers: int, log_files_per_worker: int = 0) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to what ``workers`` need; an error if the hard limit
    is too low. ``log_files_per_worker``: files each worker's log keeps open (``--log-dir``:
    1 in our layout, stdout and stderr in torchrun's)."""
    needed = (FDS_PER_WORKER + log_files_per_worker) * workers + FDS_RESERVE
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
