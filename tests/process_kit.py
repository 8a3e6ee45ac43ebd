"""Tiny real child programs for the process tests, written into each test's tmp_path; a
pytest plugin (tests/conftest.py loads it), so every package's tests have its fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from helpers import reap, wait_for
from xpulaunch.model import Backend, Plan, WorkerPlan

VISIBILITY_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ONEAPI_DEVICE_SELECTOR",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "XPULAUNCH_JOB_ID",
    "XPULAUNCH_WORKER",
)

CHILDREN = {
    # exit_with.py CODE [SIGNAL]: say something on both streams, then exit or die by signal.
    "exit_with.py": """
        import os, signal, sys
        print("out line from", os.environ.get("XPULAUNCH_WORKER"), flush=True)
        print("error: going to exit", sys.argv[1], file=sys.stderr, flush=True)
        if len(sys.argv) > 2:
            os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        sys.exit(int(sys.argv[1]))
    """,
    # sleeper.py [--ignore-term] [--exit-7-on-int] [--exit-7-on-quit] [--pidfile F]: wait to
    # be stopped.
    "sleeper.py": """
        import os, signal, sys, time
        if "--ignore-term" in sys.argv:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        def on_int(signum, frame):
            print("got", signal.Signals(signum).name, flush=True)
            sys.exit(7)
        if "--exit-7-on-int" in sys.argv:
            signal.signal(signal.SIGINT, on_int)
        if "--exit-7-on-quit" in sys.argv:
            signal.signal(signal.SIGQUIT, on_int)
        if "--pidfile" in sys.argv:
            path = sys.argv[sys.argv.index("--pidfile") + 1]
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(path + ".tmp", path)
        print("sleeping", flush=True)
        while True:
            time.sleep(60)
    """,
    # tree.py OUTDIR [--ignore-term | --note-term]: a child in our group, and a grandchild
    # that left it with setsid (double fork, so it is reparented away from us). Each writes
    # its pid; with --note-term each also records the SIGTERM it got before exiting.
    "tree.py": """
        import os, signal, sys, time
        out = sys.argv[1]
        ignore = "--ignore-term" in sys.argv
        def noted(signum, frame):
            open(os.path.join(out, f"{os.getpid()}.term"), "w").close()
            os._exit(0)
        def park(tag):
            if ignore:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if "--note-term" in sys.argv:
                signal.signal(signal.SIGTERM, noted)
            with open(os.path.join(out, f"{tag}.{os.getpid()}.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(out, f"{tag}.{os.getpid()}.tmp"),
                      os.path.join(out, f"{tag}.{os.getpid()}.pid"))
            while True:
                time.sleep(60)
        if os.fork() == 0:
            park("child")
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                park("setsid")
            os._exit(0)
        park("worker")
    """,
    "print_env.py": """
        import json, os, sys
        names = sys.argv[1:]
        print("ENV " + json.dumps({n: os.environ.get(n) for n in names}), flush=True)
    """,
    # flood.py N LENGTH: write N long lines as fast as possible, in small unaligned writes.
    "flood.py": """
        import os, sys
        name = os.environ["XPULAUNCH_WORKER"]
        n, length = int(sys.argv[1]), int(sys.argv[2])
        for i in range(n):
            line = (f"{name}:{i}:" + name * length)[:length] + "\\n"
            data = line.encode()
            for start in range(0, len(data), 1000):
                os.write(1, data[start:start + 1000])
    """,
    # flaky.py DIR CODE: fail with CODE on the first run (marker file), succeed after.
    "flaky.py": """
        import os, sys
        marker = os.path.join(sys.argv[1], "ran-once." + os.environ["XPULAUNCH_WORKER"])
        count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        print("restart count", count, flush=True)
        if not os.path.exists(marker):
            open(marker, "w").close()
            print("first run fails", file=sys.stderr, flush=True)
            sys.exit(int(sys.argv[2]))
        print("second run succeeds", flush=True)
    """,
    # ready_after.py FILE DELAY: create FILE after DELAY seconds, then wait.
    "ready_after.py": """
        import os, sys, time
        time.sleep(float(sys.argv[2]))
        open(sys.argv[1], "w").close()
        print("ready", flush=True)
        while True:
            time.sleep(60)
    """,
}


@pytest.fixture(autouse=True)
def _no_gpu_visibility(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children must never inherit the host's GPU visibility (STYLE habit 14)."""
    for name in VISIBILITY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def child(tmp_path: Path) -> Callable[..., list[str]]:
    """``child("exit_with.py", "3")`` -> argv running that child script (stdlib only)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, source in CHILDREN.items():
        (folder / name).write_text(textwrap.dedent(source))

    def argv(name: str, *args: object) -> list[str]:
        return [sys.executable, "-S", str(folder / name), *map(str, args)]

    return argv


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    return tmp_path / "records"


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (zombies hold nothing but a pid)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pids_in(folder: Path, tag: str = "") -> list[int]:
    return [int(p.read_text()) for p in folder.glob(f"{tag}*.pid")]


def make_plan(argvs: list[list[str]], *, isolate: bool = False, env: dict | None = None) -> Plan:
    workers = tuple(
        WorkerPlan(str(i), i, i, tuple(argv), {"RANK": str(i), **(env or {})})
        for i, argv in enumerate(argvs)
    )
    return Plan(Backend.CPU, (), workers, None, isolate=isolate)


DRIVER = Path(__file__).with_name("drive_plan.py")


@pytest.fixture
def drive(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``drive_plan.py`` (an xpulaunch-like parent calling supervise) on a plan."""
    started: list[subprocess.Popen[str]] = []

    def start(plan_argvs: list[list[str]], **options: object) -> subprocess.Popen[str]:
        spec = tmp_path / f"plan{len(started)}.json"
        isolate = bool(options.pop("isolate", False))
        spec.write_text(json.dumps({"argvs": plan_argvs, "isolate": isolate, **options}))
        env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    reap(started)


__all__ = ["alive", "pids_in", "wait_for"]
