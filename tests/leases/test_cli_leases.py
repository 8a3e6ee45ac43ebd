"""Leases through the real ``xpulaunch run`` command: real launcher processes, real workers,
real SIGKILL, ``xpulaunch status --json``, and the one-line errors of a busy host.

Every launch runs ``.venv/bin/xpulaunch`` with ``--inventory`` (fake NVIDIA cards, so no
probing) and a private ``--lock-dir``; its program is ``cli_job.py`` beside this file. Each
launch gets a folder of its own under ``tmp_path`` with its logs and its ``XDG_RUNTIME_DIR``
(where its guardian's job record goes), so every process it starts -- xpulaunch, guardian,
worker, and what the worker starts -- names that folder on its command line or in its
environment: that is how the tests tell that a launch left nothing running, and how teardown
finds what a failed test left behind.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest

from helpers import (
    ERROR,
    kill_all,
    one_line_error,
    process_gone,
    processes_marked,
    wait_for,
    write_inventory,
)

XPULAUNCH = Path(sys.executable).parent / "xpulaunch"
JOB = Path(__file__).with_name("cli_job.py")
KEYS = [f"0000:{i:02x}:00.0" for i in range(1, 5)]
UUIDS = [f"GPU-5eed{i:04x}-0000-4000-8000-00000000c0de" for i in range(1, 5)]
UUID_OF = dict(zip(KEYS, UUIDS, strict=True))


def _load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli_job = _load_job()


@dataclass
class Launch:
    """One ``xpulaunch`` process and its folder (logs, output files, XDG_RUNTIME_DIR)."""

    proc: subprocess.Popen[bytes]
    home: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def finish(self, timeout_s: float) -> tuple[int, str, str]:
        """Wait for it; its exit status, stdout and stderr."""
        code = self.proc.wait(timeout=timeout_s)
        return code, self.read("out"), self.read("err")

    def read(self, stream: str) -> str:
        return (self.home / f"xpulaunch.{stream}").read_text()


class Cli:
    """Starts real ``xpulaunch`` commands; at teardown nothing they started is left alive."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock_dir = root / "locks"
        self.launches: list[Launch] = []
        self.strays: list[psutil.Process] = []  # processes that name no launch folder

    def inventory(self, count: int) -> Path:
        devices: list[dict[str, object]] = [
            {
                "vendor": "nvidia",
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": KEYS[i],
                "uuid": UUIDS[i],
                "integrated": False,
                "tiles": 1,
                "memory_total_bytes": 85899345920,
                "memory_used_bytes": 0,
                "utilization_percent": 0,
                "mig_devices": [],
            }
            for i in range(count)
        ]
        return write_inventory(self.root / f"inventory-{count}.json", devices)

    def home(self, name: str) -> Path:
        home = self.root / name
        (home / "run").mkdir(parents=True, mode=0o700)
        return home

    def start(self, name: str, inventory: Path, *args: str | Path) -> Launch:
        """``xpulaunch run --inventory INV --lock-dir D ARGS...`` in the background."""
        home = self.home(name)
        argv = [XPULAUNCH, "run", "--inventory", inventory, "--lock-dir", self.lock_dir, *args]
        env = {**os.environ, "XDG_RUNTIME_DIR": str(home / "run")}
        with (home / "xpulaunch.out").open("wb") as out, (home / "xpulaunch.err").open("wb") as err:
            proc = subprocess.Popen(
                [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env
            )
        launch = Launch(proc, home)
        self.launches.append(launch)
        return launch

    def run(self, name: str, inventory: Path, *args: str | Path) -> tuple[int, str, str, float]:
        """Run to the end: exit status, stdout, stderr, seconds it took."""
        start_s = time.monotonic()
        code, out, err = self.start(name, inventory, *args).finish(timeout_s=30)
        return code, out, err, time.monotonic() - start_s

    def status(self) -> dict[str, Any]:
        """``xpulaunch status --json`` (the real command)."""
        done = subprocess.run(
            [str(XPULAUNCH), "status", "--json", "--lock-dir", str(self.lock_dir)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        document: dict[str, Any] = json.loads(done.stdout)
        return document

    def running(self, *names: str) -> list[psutil.Process]:
        """Live processes of the launches ``names``: those naming a launch folder on their
        command line (the guardian: its job record) or in their environment (xpulaunch, its
        workers and everything they start inherit its ``XDG_RUNTIME_DIR``)."""
        found: list[psutil.Process] = processes_marked(
            tuple(f"{self.root / name}/" for name in names)
        )
        return found

    def cleanup(self) -> None:
        for launch in self.launches:
            if launch.proc.poll() is None:
                launch.proc.kill()  # its guardian then kills its job
            launch.proc.wait(timeout=10)
        found = [*self.strays, *self.running(*self._names())]
        leftovers = [proc for proc in found if not process_gone(proc)]
        kill_all(leftovers)

    def _names(self) -> list[str]:
        return [launch.home.name for launch in self.launches]


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    tool = Cli(tmp_path)
    try:
        yield tool
    finally:
        tool.cleanup()


def _info(path: Path) -> dict[str, Any]:
    """The JSON a ``cli_job.py hold`` writes once it runs."""
    wait_for(path.exists, f"{path.name} (the held job to start)")
    info: dict[str, Any] = json.loads(path.read_text())
    return info


def _audit(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _audit_job(audit: Path, tag: str, seconds: float = 0, *alive: str) -> list[str]:
    """``-- cli_job.py audit AUDIT TAG SECONDS [PID:TICKS ...]``: the program and its args."""
    return ["--", str(JOB), "audit", str(audit), tag, f"{seconds:g}", *alive]


def _identity(proc: psutil.Process) -> str:
    """``PID:TICKS``, the form ``cli_job.py audit`` checks for a live old process."""
    return f"{proc.pid}:{cli_job.start_ticks(proc.pid)}"


def _no_leases_soon(cli: Cli) -> dict[str, Any]:
    """Status right after a finished ``xpulaunch run``: it unlocks its leases once every process
    of its job is gone, before it returns, so its devices are free at once."""
    status = cli.status()
    assert not status["leases"], status
    return status


@pytest.mark.slow
def test_32_waiting_launches_on_4_devices_never_share_one(cli: Cli) -> None:
    inventory = cli.inventory(4)
    audit = cli.root / "audit.jsonl"
    start_s = time.monotonic()
    wait = ["--gpus", "1", "--wait", "--wait-timeout", "120"]
    # No stagger: all 32 contend for the allocation lock and queue at once.
    launches = [
        cli.start(f"job{i}", inventory, *wait, *_audit_job(audit, str(i), 0.3)) for i in range(32)
    ]
    for launch in launches:
        code, _out, err = launch.finish(timeout_s=150)
        assert code == 0, err
    elapsed_s = time.monotonic() - start_s

    records = _audit(audit)
    assert sorted(int(r["tag"]) for r in records) == list(range(32))  # each ran exactly once
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for record in records:
        # One unit each, and the child's CUDA mask names that very card.
        assert record["device"] in KEYS, record
        assert record["cuda_visible_devices"] == UUID_OF[record["device"]], record
        spans[record["device"]].append((record["start_s"], record["end_s"], record["tag"]))
    for key, held in spans.items():
        held.sort()
        for (_b1, end1, tag1), (begin2, _e2, tag2) in itertools.pairwise(held):
            assert end1 <= begin2, f"{key}: jobs {tag1} and {tag2} held it at the same time"
    assert sorted(spans) == KEYS  # all 4 devices were used: the jobs did run side by side
    status = _no_leases_soon(cli)
    assert status["waiting"] == []  # every ticket left the queue
    assert cli.running(*(f"job{i}" for i in range(32))) == []
    print(f"32 launches on 4 devices: {elapsed_s:.1f} s")


@pytest.mark.slow
def test_sigkilled_xpulaunch_keeps_the_device_until_its_job_is_gone(cli: Cli) -> None:
    inventory = cli.inventory(1)
    info_path = cli.root / "old-info.json"
    old = cli.start("old", inventory, "--gpus", "1", "--", JOB, "hold", info_path, "--grandchild")
    info = _info(info_path)
    supervisor = psutil.Process(old.pid)
    members = [supervisor, *supervisor.children(recursive=True)]
    cli.strays += members  # teardown kills them if the test fails half-way
    by_pid = {p.pid: p for p in members}
    assert info["pid"] in by_pid and info["grandchild"] in by_pid
    guardians = [p for p in members if any("guardian.py" in a for a in p.cmdline())]
    assert len(guardians) == 1  # besides xpulaunch, the worker and the grandchild
    old_ids = [_identity(p) for p in members]
    audit = cli.root / "audit.jsonl"

    # Without --wait, while the old job lives: one line naming the holder, at once.
    code, _out, err, took_s = cli.run("busy", inventory, "--gpus", "1", *_audit_job(audit, "busy"))
    assert code == 1 and took_s < 10
    assert f"leased by pid {old.pid} (xpulaunch " in one_line_error(err)
    assert _audit(audit) == [] and cli.running("busy") == []

    # A launch queued before the kill retries every 0.2 s through the whole kill...
    wait = ["--gpus", "1", "--wait", "--wait-timeout", "30"]
    queued = cli.start("queued", inventory, *wait, *_audit_job(audit, "queued", 0.3, *old_ids))
    wait_for(lambda: cli.status()["waiting"], "the queued launch to wait")
    alive_before_kill_s = time.monotonic()
    os.kill(old.pid, signal.SIGKILL)
    # ... and one started right after it.
    late = cli.start("late", inventory, *wait, *_audit_job(audit, "late", 0, *old_ids))

    # Poll the old job: last_alive_s is taken *before* a look that still saw one of them, so
    # it is a time at which the old job certainly still ran.
    last_alive_s, gone_s = alive_before_kill_s, None
    deadline_s = alive_before_kill_s + 20
    while gone_s is None:
        looked_s = time.monotonic()
        if all(process_gone(p) for p in members):
            gone_s = time.monotonic()
        else:
            last_alive_s = looked_s
            left = [p for p in members if not process_gone(p)]
            assert looked_s < deadline_s, f"20 s after the SIGKILL, the old job still runs: {left}"
            time.sleep(0.005)
    old.proc.wait(timeout=10)

    for launch in (queued, late):
        code, _out, err = launch.finish(timeout_s=40)
        assert code == 0, err
    records = {r["tag"]: r for r in _audit(audit)}
    assert sorted(records) == ["late", "queued"]
    for record in records.values():
        assert record["device"] == KEYS[0]
        assert record["old_alive"] == []  # at its start, no process of the old job was alive
        assert record["start_s"] > last_alive_s
        assert record["start_s"] < gone_s + 10  # and it did not wait long once they were gone
    first, second = records["queued"], records["late"]
    assert first["end_s"] <= second["start_s"]  # first come, first served; never together
    assert _no_leases_soon(cli)["waiting"] == []
    print(
        f"old job gone {gone_s - alive_before_kill_s:.3f} s after SIGKILL (last seen alive at "
        f"+{last_alive_s - alive_before_kill_s:.3f} s); queued worker started at "
        f"+{first['start_s'] - alive_before_kill_s:.3f} s, late one at "
        f"+{second['start_s'] - alive_before_kill_s:.3f} s"
    )


@pytest.mark.slow
def test_status_json_shows_a_running_job_and_its_waiter_then_none(cli: Cli) -> None:
    inventory = cli.inventory(1)
    info_path = cli.root / "info.json"
    holder = cli.start("holder", inventory, "--gpus", "1", "--", JOB, "hold", info_path)
    info = _info(info_path)
    audit = cli.root / "audit.jsonl"
    wait = ["--gpus", "1", "--wait", "--wait-timeout", "30"]
    waiter = cli.start("waiter", inventory, *wait, *_audit_job(audit, "waiter"))
    wait_for(lambda: any(w["waiting_for"] for w in cli.status()["waiting"]), "a waiter")

    document = cli.status()
    assert document["schema"] == "xpulaunch.status/1"
    assert document["lock_dir"] == str(cli.lock_dir)
    [lease] = document["leases"]
    assert lease["device"] == KEYS[0] == info["device"]
    assert lease["pid"] == holder.pid and lease["holder_alive"] is True
    assert lease["command"] == ["xpulaunch", str(JOB), "hold", str(info_path)]
    assert lease["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert isinstance(lease["job_id"], str) and lease["job_id"] == info["job_id"]  # one job id
    [queued] = document["waiting"]
    assert queued["position"] == 1 and queued["pid"] == waiter.pid
    assert queued["command"][:3] == ["xpulaunch", str(JOB), "audit"]
    assert "--gpus 1" in queued["waiting_for"] and f"pid {holder.pid}" in queued["waiting_for"]

    Path(f"{info_path}.release").touch()  # the held job ends by itself, exit status 0
    assert holder.finish(timeout_s=20)[0] == 0
    code, _out, err = waiter.finish(timeout_s=30)
    assert code == 0, err
    assert [r["device"] for r in _audit(audit)] == [KEYS[0]]
    document = _no_leases_soon(cli)
    assert document["leases"] == [] and document["waiting"] == []


@pytest.mark.slow
def test_shared_uses_a_leased_device_named_explicitly_and_leases_nothing(cli: Cli) -> None:
    inventory = cli.inventory(4)
    info_path = cli.root / "info.json"
    holder = cli.start("holder", inventory, "--gpus", "all", "--", JOB, "hold", info_path)
    info = _info(info_path)
    assert info["device"] == ",".join(KEYS)
    held_by = psutil.Process(info["pid"])
    audit = cli.root / "audit.jsonl"

    shared = ["--gpus", KEYS[1], "--shared", *_audit_job(audit, "shared", 0, _identity(held_by))]
    code, _out, err, _s = cli.run("shared", inventory, *shared)
    assert code == 0, err
    [record] = _audit(audit)
    assert record["device"] == KEYS[1] and record["cuda_visible_devices"] == UUIDS[1]
    assert record["old_alive"] == [held_by.pid]  # it ran while the holder's job ran
    leases = cli.status()["leases"]
    assert [(e["device"], e["pid"]) for e in leases] == [(k, holder.pid) for k in KEYS]

    # The same request without --shared is refused, naming the holder and the way out.
    code, _out, err, _s = cli.run("unshared", inventory, "--gpus", KEYS[1], *_audit_job(audit, "x"))
    assert code == 1
    line = one_line_error(err)
    assert KEYS[1] in line and f"leased by pid {holder.pid} " in line and "--shared" in line
    # --shared shares what is named explicitly; a count still takes only free devices.
    code, _out, err, _s = cli.run(
        "count", inventory, "--gpus", "1", "--shared", *_audit_job(audit, "y")
    )
    assert code == 1 and "--gpus 1: only 0 free device(s) of 4" in one_line_error(err)
    assert [r["tag"] for r in _audit(audit)] == ["shared"]
    assert cli.running("shared", "unshared", "count") == []
    Path(f"{info_path}.release").touch()
    assert holder.finish(timeout_s=20)[0] == 0


@pytest.mark.slow
def test_a_busy_host_fails_fast_with_one_line_and_starts_nothing(cli: Cli) -> None:
    inventory = cli.inventory(4)
    info_path = cli.root / "info.json"
    holder = cli.start("holder", inventory, "--gpus", "4", "--", JOB, "hold", info_path)
    _info(info_path)
    audit = cli.root / "audit.jsonl"

    code, _out, err, took_s = cli.run(
        "count", inventory, "--gpus", "1", *_audit_job(audit, "count")
    )
    assert code == 1 and took_s < 10
    line = one_line_error(err)
    assert line.startswith(f"{ERROR}--gpus 1: only 0 free device(s) of 4 visible")
    assert all(f"{key}): skipped, leased by pid {holder.pid} " in line for key in KEYS)

    wait = ["--gpus", "1", "--wait-timeout", "0.5"]
    code, _out, err, took_s = cli.run("timeout", inventory, *wait, *_audit_job(audit, "timeout"))
    assert code == 1 and took_s < 10
    assert "gave up after waiting" in one_line_error(err.splitlines(keepends=True)[-1])
    assert all(line.startswith(("xpulaunch: waiting ", ERROR)) for line in err.splitlines())

    assert not audit.exists()  # neither program ever ran
    assert cli.running("count", "timeout") == []
    document = cli.status()
    assert document["waiting"] == []  # the timed-out launch left the queue
    assert {e["pid"] for e in document["leases"]} == {holder.pid}
    assert holder.proc.poll() is None  # and the holder was never disturbed
    Path(f"{info_path}.release").touch()
    assert holder.finish(timeout_s=20)[0] == 0


@pytest.mark.slow
def test_a_stopped_waiter_at_the_head_does_not_hold_the_line(cli: Cli) -> None:
    inventory = cli.inventory(1)
    info_path = cli.root / "info.json"
    holder = cli.start("holder", inventory, "--gpus", "1", "--", JOB, "hold", info_path)
    _info(info_path)
    audit = cli.root / "audit.jsonl"
    wait = ["--gpus", "1", "--wait", "--wait-timeout", "60"]
    first = cli.start("first", inventory, *wait, *_audit_job(audit, "first"))
    wait_for(lambda: any(w["waiting_for"] for w in cli.status()["waiting"]), "the first waiter")
    second = cli.start("second", inventory, *wait, *_audit_job(audit, "second"))
    wait_for(lambda: len(cli.status()["waiting"]) == 2, "the second waiter")
    first.proc.send_signal(signal.SIGSTOP)  # Ctrl-Z at the head of the queue
    try:
        head = wait_for(lambda: [w for w in cli.status()["waiting"] if w["stopped"]], "stopped")
        assert head[0]["pid"] == first.pid and "stopped" in head[0]["waiting_for"]
        Path(f"{info_path}.release").touch()
        assert holder.finish(timeout_s=20)[0] == 0
        code, _out, err = second.finish(timeout_s=30)  # it used to wait behind the stopped one
        assert code == 0, err
    finally:
        first.proc.send_signal(signal.SIGCONT)
    code, _out, err = first.finish(timeout_s=30)  # continued: it takes its turn after all
    assert code == 0, err
    assert [r["tag"] for r in _audit(audit)] == ["second", "first"]
