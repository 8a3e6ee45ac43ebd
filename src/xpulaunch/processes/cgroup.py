"""A cgroup v2 of the job's own, where the host allows one: no descendant can leave it.

Session ids and the ``XPULAUNCH_JOB_ID`` marker find every process a job starts, unless one
leaves both: ``setsid`` plus a cleared environment (sudo, ssh, a daemon). Such a process also
inherits the device-lease descriptors and so keeps the devices leased. A process cannot leave
its cgroup without write access to a common ancestor's ``cgroup.procs``, so where the
supervisor may create a child of its own cgroup (root, or a systemd-delegated user scope),
each worker starts in ``<own cgroup>/xpulaunch-<job>/w-<worker>`` and the job is found and
killed by cgroup as well (``cgroup.kill``, Linux 5.14; else SIGKILL to each member until none
is left). No controller is enabled, so nothing is limited or accounted: the cgroup is only a
container the job cannot escape (systemd's scopes use it the same way).

Where it is not available (cgroup v1 only, no write access, no cgroup2 mount), the job runs
without one and cleanup relies on sessions and the marker, as the README says.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from xpulaunch.errors import UsageError, XpulaunchError

_CGROUP2_FSTYPE = "cgroup2"
_KILL_TRIES = 100


def own_cgroup_dir(mountinfo: str, proc_cgroup: str) -> str | None:
    """The directory of this process's cgroup v2, from ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup`` (``0::/user.slice/...``); None without a cgroup2 mount."""
    relative = next((line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if relative is None or relative.endswith("(deleted)"):
        return None
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields = before.split()
        if after.split()[:1] == [_CGROUP2_FSTYPE] and len(fields) >= 5 and fields[3] == "/":
            return os.path.normpath(os.path.join(fields[4], relative.lstrip("/")))
    return None


@dataclass(frozen=True, slots=True)
class JobCgroup:
    """The job's cgroup directory; one leaf per worker below it."""

    path: str

    @classmethod
    def create(cls, job_id: str) -> tuple[JobCgroup | None, str]:
        """The job's new cgroup, or None and why there is none."""
        try:
            with open("/proc/self/mountinfo") as mounts, open("/proc/self/cgroup") as own:
                parent = own_cgroup_dir(mounts.read(), own.read())
        except OSError as exc:
            return None, f"cannot read /proc/self/cgroup ({exc.strerror})"
        if parent is None:
            return None, "no cgroup v2 hierarchy is mounted for this process"
        path = os.path.join(parent, f"xpulaunch-{job_id}")
        try:
            os.mkdir(path)
        except OSError as exc:
            return None, f"cannot create a cgroup under {parent} ({exc.strerror})"
        return cls(path), ""

    def leaf(self, worker: str) -> str:
        """The worker's leaf cgroup (created on first use)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in worker)
        path = os.path.join(self.path, f"w-{safe}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        return path

    def open_procs(self, worker: str) -> int:
        """A descriptor of the leaf's ``cgroup.procs``: a child writes ``0`` to it to join."""
        return os.open(os.path.join(self.leaf(worker), "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def members(self) -> dict[int, str]:
        """Every process in the job's cgroup: pid -> worker leaf name (``w-0`` -> ``0``)."""
        found: dict[int, str] = {}
        for directory, _, _ in os.walk(self.path):
            name = os.path.basename(directory).removeprefix("w-")
            for pid in _read_pids(os.path.join(directory, "cgroup.procs")):
                found[pid] = name
        return found

    def kill(self) -> None:
        """SIGKILL every member, those that left their sessions and markers too."""
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "w") as handle:
                handle.write("1")
            return
        except OSError:  # Linux < 5.14: no cgroup.kill
            pass
        for _ in range(_KILL_TRIES):  # members may fork while we kill: repeat until empty
            members = self.members()
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self, wait_s: float = 2.0) -> bool:
        """Remove the (empty) cgroup; False while a member is left (EBUSY). A killed member
        counts until its parent reaps it (an orphan: init, soon), so EBUSY is retried for up
        to ``wait_s``."""
        deadline_s = time.monotonic() + wait_s
        while not self._try_remove():
            if time.monotonic() >= deadline_s:
                return False
            time.sleep(0.01)
        return True

    def _try_remove(self) -> bool:
        """Remove the tree bottom-up: a worker may have made cgroups of its own below its
        leaf (a container runtime, ``systemd-run`` in a delegated tree, a program that sets
        limits for its children), and a cgroup with children cannot be removed (EBUSY)."""
        try:
            for directory, _, _ in os.walk(self.path, topdown=False):
                with contextlib.suppress(FileNotFoundError):  # removed by the guardian too
                    os.rmdir(directory)
        except OSError:
            return False
        return True


def job_cgroup(job_id: str, env: Mapping[str, str]) -> JobCgroup | None:
    """The job's cgroup unless ``XPULAUNCH_CGROUP=0``. Unset: one if the host allows it;
    ``1``: one is required, an error where there is none."""
    setting = check_cgroup_setting(env)
    if setting == "0":
        return None
    cgroup, why = JobCgroup.create(job_id)
    if cgroup is None and setting == "1":
        raise XpulaunchError(f"XPULAUNCH_CGROUP=1, but the job cannot have a cgroup: {why}")
    return cgroup


def check_cgroup_setting(env: Mapping[str, str]) -> str:
    """``XPULAUNCH_CGROUP``: ``0``, ``1`` or unset (``""``); anything else is a one-line
    UsageError (it used to be taken as unset, silently)."""
    setting = env.get("XPULAUNCH_CGROUP", "")
    if setting not in ("", "0", "1"):
        raise UsageError(
            f"XPULAUNCH_CGROUP={setting[:40]!r}: expected 0 (no job cgroup) or 1 (require "
            "one), or leave it unset (one where the host allows it)"
        )
    return setting


def _read_pids(path: str) -> list[int]:
    try:
        with open(path) as handle:
            return [int(word) for word in handle.read().split()]
    except (OSError, ValueError):  # removed meanwhile
        return []
