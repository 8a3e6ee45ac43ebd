"""A shared box for the job queue's process tests: a lock directory in /tmp that a second
user can reach, a fixture inventory of two NVIDIA devices, and the real ``xpulaunch``
commands run as root or, through ``setpriv``, as ``nobody``.

Everything a test starts (runners, job runs, their guardians and workers) names the lock
directory on its command line or in its environment (``XPULAUNCH_QUEUE_DIR``), which is how
teardown finds and kills what a failed test left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import xpulaunch
from helpers import INVENTORIES, kill_all, process_gone, processes_marked, wait_for

JOB = Path(__file__).parent / "leases" / "cli_job.py"
NOBODY = 65534
COMMAND_TIMEOUT_S = 60.0


class QueueBox:
    """One lock directory and its queue, driven through the real CLI."""

    def __init__(self, root: Path, inventory: str = "2x-h200.json") -> None:
        self.root = root
        self.lock_dir = root / "locks"
        self.inventory = INVENTORIES / inventory
        self.audit = root / "audit.jsonl"
        self.audit.touch()
        self.audit.chmod(0o666)  # jobs of every user append to it

    def env(self, uid: int = 0, **extra: str) -> dict[str, str]:
        """A clean environment: our sources first, a config home of the user's own."""
        home = self.root / f"home-{uid}"
        if not home.exists():
            home.mkdir(mode=0o755)
            os.chown(home, uid, uid)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "LANG": "C.UTF-8",
        }
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if uid != 0 and self.python(uid) != sys.executable:
            # Our packages for the other interpreter: site-packages, and our sources (an
            # editable install finds them through a .pth file, which PYTHONPATH does not read).
            paths += [str(Path(xpulaunch.__file__).parent.parent), *site.getsitepackages()]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return {**env, **extra}

    @staticmethod
    def python(uid: int = 0) -> str:
        """An interpreter ``uid`` may run: ours, unless it lies under a folder closed to
        others (a venv made from a pyenv in /root); then the system's, given our packages."""
        if uid == 0 or _reachable(Path(sys.executable).resolve()):
            return sys.executable
        system = shutil.which("python3", path="/usr/bin:/bin")
        if system is None:
            pytest.skip("no Python interpreter that another user can run")
        return system

    def argv(self, *args: str | Path, uid: int = 0) -> list[str]:
        command = [self.python(uid), "-m", "xpulaunch", *(str(a) for a in args)]
        if uid == 0:
            return command
        return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]

    def cli(
        self, *args: str | Path, uid: int = 0, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run one command to its end (as ``uid``) in the box's folder."""
        done = subprocess.run(
            self.argv(*args, uid=uid), cwd=self.root, env=self.env(uid, **env),
            capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"{args}: {done.stderr}"
        return done

    def submit(self, *args: str | Path, uid: int = 0) -> int:
        """``xpulaunch submit --lock-dir D --inventory INV ARGS``: the job id it printed."""
        done = self.cli("submit", "--lock-dir", self.lock_dir, "--inventory", self.inventory,
                        *args, uid=uid)  # fmt: skip
        assert done.stdout.strip().isdigit(), done.stdout
        return int(done.stdout)

    def audit_job(self, tag: str, seconds: float, uid: int = 0) -> list[str]:
        """``-- cli_job.py audit AUDIT TAG SECONDS``: a job that records when it ran where."""
        python = self.python(uid)
        return ["--", python, str(JOB), "audit", str(self.audit), tag, f"{seconds:g}"]

    def database(self, uid: int = 0) -> Path:
        """The queue database holding ``uid``'s records (the one file named queue.sqlite
        of theirs under the lock directory, wherever the layout puts it)."""
        (found,) = [p for p in self.lock_dir.rglob("queue.sqlite") if p.stat().st_uid == uid]
        return found

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line]

    def queue(self, uid: int = 0, *, everything: bool = True) -> dict[str, Any]:
        args = ["queue", "--json", "--lock-dir", self.lock_dir] + (["-a"] if everything else [])
        document: dict[str, Any] = json.loads(self.cli(*args, uid=uid).stdout)
        return document

    def jobs(self, uid: int = 0) -> dict[str, dict[str, Any]]:
        """id (as a string: ``17``, ``w4242``) -> the job's record, every job."""
        return {str(j["id"]): j for j in self.queue(uid)["jobs"]}

    def wait_states(
        self, wanted: dict[int, str], timeout_s: float = 60.0
    ) -> dict[str, dict[str, Any]]:
        """Poll ``queue --json`` until each job is in its wanted state."""

        def reached() -> dict[str, dict[str, Any]] | None:
            jobs = self.jobs()
            ok = all(jobs.get(str(i), {}).get("state") == s for i, s in wanted.items())
            return jobs if ok else None

        class Seen:  # made when the message is shown: the states at the timeout, not before
            def __str__(inner) -> str:
                states = {i: (j.get("state"), j.get("reason")) for i, j in self.jobs().items()}
                return f"states {wanted} (last seen: {states})"

        found: dict[str, dict[str, Any]] = wait_for(reached, Seen(), timeout_s)
        return found

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(
            self.cli("status", "--json", "--lock-dir", self.lock_dir).stdout
        )
        return document

    def runner_pids(self) -> dict[str, int]:
        runners: dict[str, int] = self.queue()["runners"]
        return runners

    def stop_runner(self) -> None:
        """Stop the runner that ``submit`` started (SIGTERM: its jobs stay as they are)."""
        pid = wait_for(lambda: self.runner_pids().get("root"), "the runner submit started")
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)

    def start(self, *args: str | Path, uid: int = 0) -> subprocess.Popen[str]:
        """A command in the background (a plain launch, ``top``)."""
        return subprocess.Popen(
            self.argv(*args, uid=uid), cwd=self.root, env=self.env(uid),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def cleanup(self) -> None:
        leftovers = [p for p in processes_marked((str(self.lock_dir),)) if not process_gone(p)]
        kill_all(leftovers)


@pytest.fixture
def box() -> Iterator[QueueBox]:
    """A queue box whose folder a second user (nobody) can reach."""
    root = Path(tempfile.mkdtemp(prefix="xpq-", dir=open_temp_folder()))
    root.chmod(0o755)
    shared = QueueBox(root)
    try:
        yield shared
    finally:
        shared.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def open_temp_folder() -> str:
    """A temporary folder that another user can reach: /tmp is closed (0700) on some hosts."""
    candidates = (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm")
    for folder in candidates:
        path = Path(folder)
        if path.is_dir() and _reachable(path / "x"):
            return folder
    pytest.fail(f"no temporary folder that another user can reach among {candidates}")


def _reachable(path: Path) -> bool:
    """Whether every folder above ``path`` lets other users through."""
    return all(os.stat(folder).st_mode & 0o001 for folder in path.parents)


def overlaps(records: Sequence[dict[str, Any]]) -> int:
    """The most jobs that ran at one time (from their audit start and end)."""
    edges = sorted([(r["start_s"], 1) for r in records] + [(r["end_s"], -1) for r in records])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"

    wait_for(gone, f"pid {pid} to exit", timeout_s)


def elapsed(start_s: float) -> float:
    return time.monotonic() - start_s
