"""The supervisor's side of its guardian (:mod:`xpulaunch.processes.guardian`): it notices the
guardian's death and starts a new one.

A guardian killed by mistake (``kill``, an OOM kill, ``pkill -f xpulaunch`` aimed at something
else) leaves the job without its last line of defence: if the supervisor died next, a worker's
own children would survive it. So the guardian's pidfd sits in the supervisor's loop like a
worker's, and its death is one warning and a new guardian (at most
:data:`MAX_GUARDIAN_STARTS` per job: one that keeps dying is given up, with a warning).
"""

from __future__ import annotations

import os
import selectors
from collections.abc import Callable
from typing import TYPE_CHECKING

from xpulaunch.processes.procfs import start_ticks
from xpulaunch.processes.signals import signal_name
from xpulaunch.processes.spawn import open_pidfd

if TYPE_CHECKING:
    from xpulaunch.processes.guardian import GuardianHandle
    from xpulaunch.processes.records import JobRecord
    from xpulaunch.supervisor.loop import Loop

MAX_GUARDIAN_STARTS = 5

# Starts a new guardian holding these lease descriptors; None when it cannot be started.
StartGuardian = Callable[[tuple[int, ...]], "GuardianHandle | None"]


class GuardianKeeper:
    """Holds the current guardian; :meth:`watch` (on the loop thread) starts watching it."""

    def __init__(
        self,
        handle: GuardianHandle | None,
        start: StartGuardian | None,
        *,
        lease_fds: tuple[int, ...],
        record: JobRecord,
        say: Callable[[str], None],
    ) -> None:
        self.handle = handle
        self._start, self._lease_fds, self._record, self._say = start, lease_fds, record, say
        self._starts = 1
        self._loop: Loop | None = None
        self._pidfd: int | None = None

    @property
    def pid(self) -> int:
        return self.handle.pid if self.handle is not None else 0

    def watch(self, loop: Loop) -> None:
        self._loop = loop
        self._watch_current()

    def _watch_current(self) -> None:
        if self._loop is None or self.handle is None:
            return
        self._pidfd = open_pidfd(self.handle.pid)
        if self._pidfd is not None:  # kernel < 5.3: not watched
            self._loop.selector.register(self._pidfd, selectors.EVENT_READ, self._died)

    def _unwatch(self) -> None:
        if self._pidfd is not None and self._loop is not None:
            self._loop.selector.unregister(self._pidfd)
            os.close(self._pidfd)
        self._pidfd = None

    def _died(self) -> None:
        self._unwatch()
        old = self.handle
        if old is None:
            return
        how = _how(old.proc.wait())  # it has exited: no wait
        old.close()
        self.handle = None
        if self._start is None or self._starts >= MAX_GUARDIAN_STARTS:
            self._say(f"warning: the guardian (pid {old.pid}) {how}; going on without one")
            return
        self._starts += 1
        self.handle = self._start(self._lease_fds)
        if self.handle is None:
            self._say(f"warning: the guardian (pid {old.pid}) {how}; a new one cannot start")
            return
        ticks = start_ticks(self.handle.pid)
        if ticks is not None:
            self._record.add_guardian([self.handle.pid, ticks])
        self._say(f"warning: the guardian (pid {old.pid}) {how}; started pid {self.handle.pid}")
        self._watch_current()

    def close(self, *, done: bool, wait: bool) -> None:
        """The job is over (``done``) or the supervisor crashed; see GuardianHandle.close."""
        self._unwatch()
        if self.handle is not None:
            self.handle.close(done=done, wait=wait)


def _how(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    return f"exited with code {returncode}"
