"""A c10d node's agent, started before we know how to run it.

Under ``--rdzv-backend c10d`` a node's one supervised process is torch's elastic agent
(:mod:`xpulaunch.core.elastic`), and torch's c10d rendezvous completes about one state poll
after the first node has joined it: every moment between our start and the agent's join
delays the job on every node. The agent spends most of that moment importing torch, which
needs nothing from our plan. So the command line's entry (:mod:`xpulaunch.cli.entry`) forks
first, before it imports anything else of ours: the child imports torch's agent while the
parent probes, plans and leases, then waits for one message saying how to run (argv,
environment, working directory, the lease descriptors). The supervisor adopts the child as the
agent's first start (:func:`adopt`) instead of starting a second interpreter; when the plan
has no agent, or the command line ends first, :func:`discard` ends the child.

The child is set up as :mod:`xpulaunch.proc.spawn` sets up a worker: its own session,
/dev/null for stdin, pipes for stdout and stderr, SIGKILL when the supervisor dies. The
parent moves it into the worker's cgroup before sending the message, so the agent's workers
are born there. What differs from a worker's start, and why that is safe:

* It is a fork of this interpreter, not an exec. Nothing of ours but the entry point and this
  module is loaded at that point, so the child carries no state of the command line.
* It imported torch under the command line's environment, not the worker's. The agent is
  adopted only when the two differ in variables that torch's agent reads while it runs
  (:func:`_read_at_run_time`: device visibility, thread count, our markers); otherwise it is
  started fresh.
* Its ``/proc/PID/environ`` is the command line's (variables set after an exec do not show
  there), so the agent is found by its session, as every worker's leader is, and its
  workers carry the job's marker as before. Its start predates the job's, which is why the
  supervisor looks back to it (:func:`started_ticks`).

``XPULAUNCH_PRESTART=0`` turns this off. docs/DECISIONS.md says why it exists.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping, Sequence
    from typing import IO

# The module torch's agent runs as (xpulaunch.core.elastic's AGENT_MODULE; a test holds the
# two equal: core cannot import this side-effect layer, and this module must stay light).
AGENT_MODULE = "xpulaunch.integrations.torch_agent"
# What the agent imports before it joins the rendezvous, AGENT_MODULE's own imports first.
# (AGENT_MODULE itself is left out: runpy warns about a module it runs as __main__ that is
# already imported.) The c10d backend is imported by torch only once it makes the handler.
AGENT_IMPORTS = (
    "torch.distributed.run",
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)
OFF_VAR = "XPULAUNCH_PRESTART"
_BACKEND_OPTIONS = ("--rdzv-backend", "--rdzv_backend")
_NNODES_OPTION = "--nnodes"
# Words after which the command does not run a job (or torchrun runs no agent of torch's).
_NO_AGENT = frozenset({"--dry-run", "--help", "-h", "--version", "--standalone"})
_MAX_FDS = 64  # lease descriptors: one per leased device at most
_FIRST_READ_BYTES = 64 * 1024


@dataclass(slots=True)
class _Early:
    """The child, as the parent holds it until it is adopted or ended."""

    pid: int
    control: socket.socket
    stdout: int
    stderr: int
    environ: dict[str, str]  # the environment it imported torch under


# The child of this process's start(), until adopted or ended (a process has at most one).
_pending: list[_Early] = []


def own_words(args: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """The command line's words before any ``--`` (ours, never the program's), or None when
    nothing may start before the parse (``XPULAUNCH_PRESTART=0``, or no fork here)."""
    if environ.get(OFF_VAR) == "0" or not hasattr(os, "fork"):
        return None
    return list(args[: args.index("--")] if "--" in args else args)


def wanted(args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this command line runs torch's c10d agent, guessed from its words alone
    (before click is even imported): ``--rdzv-backend c10d`` before any ``--``, not a dry
    run nor help, and with ``xpulaunch torchrun`` more than one node (one node runs no agent
    there). A wrong yes costs a child that is ended unused; a wrong no, the agent's start as
    it was."""
    words = own_words(args, environ)
    if words is None or _NO_AGENT.intersection(words):
        return False
    backend = nnodes = None
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
        if name in _BACKEND_OPTIONS:
            backend = value
        elif name == _NNODES_OPTION:
            nnodes = value
    if backend != "c10d":
        return False
    return words[:1] != ["torchrun"] or nnodes not in (None, "1", "1:1")


def start() -> None:
    """Fork the agent's child (see the module's docstring). In the child this never returns:
    it runs the agent when told to, and exits."""
    import socket  # here: only this path needs it

    parent, environ = os.getpid(), dict(os.environ)
    control, theirs = socket.socketpair()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (control.detach(), out_read, err_read):
            os.close(fd)
        _child(parent, theirs, out_write, err_write)
    for fd in (out_write, err_write):
        os.close(fd)
    theirs.close()
    _pending.append(_Early(pid, control, out_read, err_read, environ))


def started_ticks() -> int | None:
    """When the child waiting for adoption started, in clock ticks after boot; None without
    one. The supervisor looks for the job's processes from then on."""
    if not _pending:
        return None
    from xpulaunch.proc.processes import process_info

    info = process_info(_pending[0].pid)
    return info.start_ticks if info is not None else None


def adopt(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    cgroup_fd: int | None = None,
) -> Adopted | None:
    """The waiting child as the started process of ``argv`` (``python -m`` the agent) with
    ``env``; None when there is none to adopt for it, and then the caller starts one. Once
    asked, the child is this start's or ends: it is never adopted later."""
    early = _take()
    if early is None:
        return None
    if tuple(argv[:3]) != (sys.executable, "-m", AGENT_MODULE) or not _read_at_run_time(
        _changed(early.environ, env)
    ):
        _end(early)
        return None
    if cgroup_fd is not None:  # before the agent hears it may start: its workers are born here
        with contextlib.suppress(OSError):  # EBUSY/EOPNOTSUPP: uncontained, as spawn's child
            os.write(cgroup_fd, str(early.pid).encode())
    if not _send(early, argv, env, cwd, pass_fds):
        _end(early)
        return None
    return Adopted(early.pid, _reader(early.stdout), _reader(early.stderr))


def discard() -> None:
    """End a child that was not adopted (the plan has no agent; the command line ends)."""
    early = _take()
    if early is not None:
        _end(early)


def _take() -> _Early | None:
    return _pending.pop() if _pending else None


class Adopted:
    """The adopted child, with what a worker uses of a started ``subprocess.Popen``."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None

    def wait(self) -> int:
        """Reap it; its status as Popen's ``returncode`` says it (-N: killed by signal N)."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _changed(before: Mapping[str, str], after: Mapping[str, str]) -> set[str]:
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def _read_at_run_time(names: set[str]) -> bool:
    """Whether every one of ``names`` is a variable that torch's agent reads only once it runs
    (so one imported before it was set sees it in time), not while importing torch. These
    are the ones a plan sets for a worker: device visibility and order, the thread count
    (read by the OpenMP runtime at load: the agent runs no kernels, its workers start
    fresh), xpulaunch's markers, torchelastic's start variables and the shared-store switch."""
    from xpulaunch.core.elastic import DISABLE_SHARED_STORE
    from xpulaunch.core.visibility import CUDA_ORDER_VAR, PCI_ORDER_VAR, VENDOR_VARS

    exact = {CUDA_ORDER_VAR, PCI_ORDER_VAR, DISABLE_SHARED_STORE, "OMP_NUM_THREADS"}
    exact.update(name for names in VENDOR_VARS.values() for name in names)
    return all(name in exact or name.startswith(("XPULAUNCH_", "TORCHELASTIC_")) for name in names)


def _send(
    early: _Early, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
    pass_fds: Sequence[int],
) -> bool:  # fmt: skip
    import json
    import socket

    order = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
    try:  # the descriptors ride on the first bytes; closing marks the order's end
        sent = socket.send_fds(early.control, [order], pass_fds)
        early.control.sendall(order[sent:])
    except OSError:  # the child is gone (killed while it imported torch)
        return False
    early.control.close()
    return True


def _reader(fd: int) -> IO[bytes]:
    os.set_blocking(fd, False)  # the worker's loop reads what is there and goes on
    return open(fd, "rb", buffering=0)  # the worker closes it when the pipe ends


def _end(early: _Early) -> None:
    """Kill and reap the child (it only imported torch: nothing of it needs a goodbye)."""
    early.control.close()
    for fd in (early.stdout, early.stderr):
        os.close(fd)
    try:
        os.kill(early.pid, signal.SIGKILL)
        os.waitpid(early.pid, 0)
    except (ProcessLookupError, ChildProcessError):  # reaped already
        pass


# -- the child ---------------------------------------------------------------------------------
def _child(parent: int, control: socket.socket, stdout: int, stderr: int) -> None:
    os.setsid()  # as start_new_session: a stop reaches its tree with one killpg, Ctrl-C not
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout, 1), (stderr, 2)):
        os.dup2(source, target)
        os.close(source)
    _die_with(parent)
    _import_agent()
    order = _receive(control)
    if order is None:  # the parent ended us: nothing to run
        os._exit(0)
    _run(*order)


def _die_with(parent: int) -> None:
    """SIGKILL when the parent thread (the command line's main thread) exits, as every
    worker gets; and exit now if it already has (the documented prctl race)."""
    from xpulaunch.proc.spawn import PR_SET_PDEATHSIG, libc_prctl

    if libc_prctl()(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
        os._exit(0)


def _import_agent() -> None:
    """Import what the agent needs with the cyclic garbage collector paused, then freeze
    what was imported. Importing torch allocates a great many objects that live as long as
    the process, so the collections it would trigger find next to nothing to free and only
    delay the agent's join; frozen (``gc.freeze``), they are not traversed again either,
    where re-enabling alone would make the next collection walk all of them at once."""
    import gc
    import importlib

    gc.disable()
    try:
        for name in AGENT_IMPORTS:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001  (no torch, a broken one: running the agent raises it again, where its output is read)
        pass
    finally:
        gc.freeze()
        gc.enable()


_Order = tuple[list[str], dict[str, str], str | None, list[int]]  # argv, env, cwd, fds


def _receive(control: socket.socket) -> _Order | None:
    import json
    import socket

    first, fds, _flags, _address = socket.recv_fds(control, _FIRST_READ_BYTES, _MAX_FDS)
    if not first:
        return None
    with control, control.makefile("rb") as rest:  # to the end: the parent closes after it
        order = json.loads(first + rest.read())
    return order["argv"], order["env"], order["cwd"], fds


def _run(argv: list[str], env: dict[str, str], cwd: str | None, fds: list[int]) -> None:
    """Become ``python -m AGENT_MODULE ARGS`` with ``env`` in ``cwd``, holding ``fds`` (the
    leases, as pass_fds would have handed them), and exit with its status."""
    import io
    import runpy

    for fd in fds:
        os.set_inheritable(fd, True)
    if cwd is not None:
        os.chdir(cwd)
    # This process now becomes the worker, so its environment is what execve's would have
    # been: torch's agent reads it (os.getenv) and copies it into every worker it starts.
    os.environ.clear()
    os.environ.update(env)
    if isinstance(sys.stdout, io.TextIOWrapper):  # a fresh interpreter's, on a pipe:
        sys.stdout.flush()  # block-buffered unless PYTHONUNBUFFERED
        sys.stdout.reconfigure(line_buffering=bool(env.get("PYTHONUNBUFFERED")))
    sys.argv = [AGENT_MODULE, *argv[3:]]
    runpy.run_module(AGENT_MODULE, run_name="__main__", alter_sys=True)
    sys.exit(0)
