"""``probe_isolated``: probe this host in a forked child, so that the supervisor stays small.

NVML leaves pynvml and the driver's ``libnvidia-ml`` resident in the process that used it,
which on an NVIDIA host about doubles the supervisor's memory for the whole life of the job
(docs/BENCHMARKS.md). A forked child pays that instead and hands back the inventory document
through a pipe. ``fork`` is only used while this process runs one thread (forking a
multi-threaded process can deadlock the child on a lock another thread held), which is the
case in the CLI before the supervisor starts. The Python API's :func:`xpulaunch.probe` stays
in-process: an application may have threads.

A run starts the probe once its command line is parsed, so that the probe runs while the
supervisor is imported; the child starts NVML first (:mod:`xpulaunch.probing.nvml_start`), so
that NVML's start overlaps the child's imports of the probe.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
from typing import TYPE_CHECKING

from xpulaunch.errors import InventoryError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xpulaunch.model import Inventory


def _probe(env: Mapping[str, str]) -> Inventory:
    """The probe itself, imported where it runs: in the child, while the parent imports the
    supervisor, which never needs the probe's modules."""
    from xpulaunch.probing.host import probe_from_env

    return probe_from_env(env)


def probe_isolated(env: Mapping[str, str]) -> Inventory:
    """:func:`~xpulaunch.probing.host.probe_from_env` in a forked child (in-process when other
    threads run, or when the child fails, which is then recorded as a problem)."""
    with ForkedProbe(env) as probe:
        return probe.result()


class ForkedProbe:
    """A probe started in a forked child; the caller may do other work (import the
    supervisor) until :meth:`result`. As a context manager, leaving it kills a child whose
    result was not collected."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self._pid: int | None = None
        self._read_fd = -1
        if threading.active_count() > 1:
            return  # result() probes in-process
        self._read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child(env, self._read_fd, write_fd)  # never returns
        os.close(write_fd)
        self._pid = pid

    def result(self) -> Inventory:
        """The inventory: the child's, or probed here when there is no child or it failed."""
        pid, self._pid = self._pid, None
        if pid is None:
            return _probe(self.env)
        with os.fdopen(self._read_fd, "rb") as pipe:
            payload = pipe.read()
        inventory = _document(payload)
        if inventory is not None:
            # A whole document means the probe succeeded: closing the pipe was the child's
            # last act. Its exit (tearing down a copy of this process) is reaped by a thread
            # of its own instead of being waited for here. A bare _thread thread: it holds no
            # lock while it waits, and threading.active_count() does not count it, so a later
            # ForkedProbe still forks, and safely.
            _thread.start_new_thread(os.waitpid, (pid, 0))
            return inventory
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        inventory = _probe(self.env)
        from xpulaunch.model import Inventory, Problem

        problem = Problem("probe", f"the forked probe failed (exit status {code}); probed here")
        return Inventory(devices=inventory.devices, problems=(*inventory.problems, problem))

    def cancel(self) -> None:
        """Kill and reap the child if its result was not collected."""
        pid, self._pid = self._pid, None
        if pid is None:
            return
        os.close(self._read_fd)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    def __enter__(self) -> ForkedProbe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


def _document(payload: bytes) -> Inventory | None:
    """The child's inventory; None for no document or part of one (the child failed)."""
    from xpulaunch.core.inventory import loads

    try:
        return loads(payload.decode(), source="the forked probe")
    except (InventoryError, UnicodeDecodeError):
        return None


def _child(env: Mapping[str, str], read_fd: int, write_fd: int) -> None:
    """Probe, write the document, and leave at once: no atexit hook, no buffer or lease of
    the parent's may be flushed or released twice."""
    status = 1
    try:
        os.close(read_fd)
        from xpulaunch.probing.nvml_start import start_nvml

        start_nvml(env)
        from xpulaunch.core.inventory import dumps

        payload = dumps(_probe(env)).encode()
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        status = 0
    finally:
        os._exit(status)


CHILD_PROBE_TIMEOUT_S = 60.0


def probe_in_child(
    env: Mapping[str, str], *, timeout_s: float = CHILD_PROBE_TIMEOUT_S
) -> Inventory:
    """The probe run as ``python -m xpulaunch devices --json``: for a process that already
    runs threads (the model router), where forking is unsafe and probing in-process would
    leave NVML resident. Raises :class:`InventoryError` when it does not answer with a
    document."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "xpulaunch", "devices", "--json"]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            env=dict(env),
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InventoryError(f"xpulaunch devices --json did not answer ({exc})") from exc
    inventory = _document(done.stdout)
    if inventory is None:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise InventoryError(f"xpulaunch devices --json failed: {last}")
    return inventory
