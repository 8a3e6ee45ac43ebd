"""``probe_isolated``: probe this host in a forked child, so that the supervisor stays small.

NVML leaves pynvml and the driver's ``libnvidia-ml`` resident in the process that used it:
on 2x H200 the supervisor of ``xpulaunch run`` peaked at 38.6 MiB instead of 18.0 MiB
(docs/BENCHMARKS.md), for the whole life of the job. A forked child pays that instead and
hands back the inventory document through a pipe. ``fork`` costs ~1 ms here, and it is only
used while this process runs one thread (forking a multi-threaded process can deadlock the
child on a lock another thread held), which is the case in the CLI before the supervisor
starts. The Python API's :func:`xpulaunch.probe` stays in-process: an application may have
threads.
"""

from __future__ import annotations

import os
import threading

from xpulaunch.core.inventory import dumps, loads
from xpulaunch.model import Inventory, Problem
from xpulaunch.probe.host import probe_from_env

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Mapping


def probe_isolated(env: Mapping[str, str]) -> Inventory:
    """:func:`~xpulaunch.probe.host.probe_from_env` in a forked child (in-process when other
    threads run, or when the child fails, which is then recorded as a problem)."""
    if threading.active_count() > 1:
        return probe_from_env(env)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(env, read_fd, write_fd)  # never returns
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        payload = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    if code == 0:
        return loads(payload.decode(), source="the forked probe")
    inventory = probe_from_env(env)
    problem = Problem("probe", f"the forked probe failed (exit status {code}); probed in-process")
    return Inventory(devices=inventory.devices, problems=(*inventory.problems, problem))


def _child(env: Mapping[str, str], read_fd: int, write_fd: int) -> None:
    """Probe, write the document, and leave at once: no atexit hook, no buffer or lease of
    the parent's may be flushed or released twice."""
    status = 1
    try:
        os.close(read_fd)
        payload = dumps(probe_from_env(env)).encode()
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        status = 0
    finally:
        os._exit(status)
