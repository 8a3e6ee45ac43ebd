"""What the fault sweep's trials share (``bench/fault_sweep.py`` and each area's
``bench/sweep_*.py``): a scratch directory per trial, the outcome it records, how a launch is
ended and judged, and the registry the ``@trial`` decorator fills."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE_LLAMA = ROOT / "tests" / "llamacpp" / "fake_cuda_server.py"
BUS = "0000:01:00.0"
KINDS = ("hang", "traceback", "double-booked", "good job failed", "wrong")


@dataclass
class Outcome:
    found: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def fail(self, kind: str, note: str) -> None:
        self.found.add(kind)
        self.notes.append(f"{kind}: {note}")


class Skip(Exception):
    pass


@dataclass
class Scratch:
    """One trial's directory, environment and started processes."""

    root: Path
    src: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # others to end (escapees)
    mounts: list[Path] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)  # made by a trial's escapee

    @property
    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("XPULAUNCH_")}
        return {**base, "PYTHONPATH": str(self.src), "XDG_RUNTIME_DIR": str(self.root),
                "XPULAUNCH_LOCK_DIR": str(self.root / "locks")}  # fmt: skip

    def start(self, *args: str, env: dict[str, str] | None = None, **popen: object):  # type: ignore[no-untyped-def]
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
        argv = [sys.executable, "-m", "xpulaunch", *args]
        proc = subprocess.Popen(argv, env={**self.env, **(env or {})}, cwd=self.root, **popen)  # type: ignore[call-overload]
        self.started.append(proc)
        return proc

    def run(self, *args: str, timeout_s: float = 60, **kw: object) -> tuple[int | None, str, str]:
        """(status, stdout, stderr); status None when it had to be killed (a hang)."""
        proc = self.start(*args, **kw)
        return finish(proc, timeout_s)

    def inventory(self, cards: int = 1) -> str:
        path = self.root / f"inventory-{cards}.json"
        devices = [{"vendor": "nvidia", "index": i, "name": "NVIDIA H100",
                    "pci_bus_id": f"0000:0{i + 1}:00.0"} for i in range(cards)]  # fmt: skip
        path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": devices}))
        return str(path)

    def small_disk(self, left_bytes: int) -> Path:
        mount = self.root / "small-disk"
        mount.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                              capture_output=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise Skip("cannot mount a tmpfs (needs root)")
        self.mounts.append(mount)
        st = os.statvfs(mount)
        with open(mount / "filler", "wb") as handle:
            handle.write(b"\0" * max(st.f_bavail * st.f_frsize - left_bytes, 0))
        return mount

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=30)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        for mount in self.mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        for cgroup in self.cgroups:  # empty once its member is reaped
            wait_until(lambda c=cgroup: _rmdir(c), 5)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def finish(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int | None, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        status = None
    return status, _text(out), _text(err)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode(errors="replace")


def wait_until(condition: Callable[[], object], timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def judge(outcome: Outcome, status: int | None, err: str, *, good: bool = True,
          expect: int | None = 0) -> None:  # fmt: skip
    """The common checks: no hang, no traceback, a good job's status kept."""
    if status is None:
        outcome.fail("hang", "killed at its bound")
        return
    if "Traceback" in err:
        outcome.fail("traceback", err.strip().splitlines()[-1][:160])
    if good and status != 0:
        outcome.fail("good job failed", f"status {status}: {err.strip()[-160:]}")
    elif expect is not None and status != expect:
        outcome.fail("wrong", f"status {status}, expected {expect}: {err.strip()[-160:]}")


TRIALS: dict[str, Callable[[Scratch, Outcome], None]] = {}


def trial(
    name: str,
) -> Callable[[Callable[[Scratch, Outcome], None]], Callable[[Scratch, Outcome], None]]:
    def register(fn: Callable[[Scratch, Outcome], None]) -> Callable[[Scratch, Outcome], None]:
        TRIALS[name] = fn
        return fn

    return register
