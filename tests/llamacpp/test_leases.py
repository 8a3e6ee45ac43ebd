"""``xpulaunch llama`` leases its GPUs: real launcher processes, real servers, real signals.

This machine can only run a CPU build of llama-server, which plans no device and so leases
none. Every launch here therefore runs ``fake_cuda_server.py`` (through a two-line wrapper,
as ``--binary``): a stand-in for a CUDA build that lists the GPUs of the ``2x-h200.json``
inventory under the ``CUDA_VISIBLE_DEVICES`` it is given, serves ``/health`` over real HTTP
and records what it saw (its mask, the lease descriptors it inherited, which processes of an
older job were still alive when it started).

Each launch gets a folder of its own under ``tmp_path`` (stdout/stderr, ``XDG_RUNTIME_DIR``
for its guardian's job record, the fake's records), named on the command line or in the
environment of every process it starts: that is how a test tells that a launch left nothing
running, and how teardown finds what a failed test left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from fake_cuda_server import start_ticks

from helpers import (
    ERROR,
    inventory_path,
    kill_all,
    lock_is_free,
    one_line_error,
    process_gone,
    processes_marked,
    wait_for,
)
from xpulaunch.leases.lock_files import lock_file_name
from xpulaunch.llamacpp.health import health_status

XPULAUNCH = Path(sys.executable).parent / "xpulaunch"
FAKE = Path(__file__).with_name("fake_cuda_server.py")
INVENTORY = inventory_path("2x-h200.json")
UUID_OF = {d["pci_bus_id"]: d["uuid"] for d in json.loads(INVENTORY.read_text())["devices"]}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@dataclass
class Launch:
    """One ``xpulaunch llama`` process and its folder."""

    proc: subprocess.Popen[bytes]
    home: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self, stream: str) -> str:
        return (self.home / f"xpulaunch.{stream}").read_text()

    def records(self) -> list[dict[str, Any]]:
        """What each fake server this launch started wrote at its start, oldest first."""
        found = [json.loads(p.read_text()) for p in (self.home / "records").glob("*.json")]
        return sorted(found, key=lambda record: record["start_s"])


class Rig:
    """Starts real ``xpulaunch llama`` commands; at teardown nothing they started is left."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock_dir = root / "locks"
        self.model = root / "lease-test-model.gguf"
        self.model.write_bytes(b"GGUF")  # plan_llama only checks that the file is readable
        self.binary = root / "llama-server"
        self.binary.write_text(
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} "$@"\n'
        )
        self.binary.chmod(0o755)
        self.launches: list[Launch] = []

    def start(self, name: str, *args: str, watch: tuple[str, ...] = ()) -> Launch:
        """``xpulaunch llama -m M --inventory INV --lock-dir D --binary FAKE ARGS`` in the
        background; ``watch``: ``PID:TICKS`` of processes the fake reports alive or not."""
        home = self.root / name
        (home / "run").mkdir(parents=True, mode=0o700)
        (home / "records").mkdir()
        argv = [str(XPULAUNCH), "llama", "-m", str(self.model), "--inventory", str(INVENTORY),
                "--lock-dir", str(self.lock_dir), "--binary", str(self.binary), *args]  # fmt: skip
        env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(home / "run"),
            "FAKE_LLAMA_RECORD_DIR": str(home / "records"),
            "FAKE_LLAMA_INVENTORY": str(INVENTORY),
            "FAKE_LLAMA_WATCH": ",".join(watch),
        }
        with (home / "xpulaunch.out").open("wb") as out, (home / "xpulaunch.err").open("wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        launch = Launch(proc, home)
        self.launches.append(launch)
        return launch

    def run(self, name: str, *args: str) -> tuple[int, str, float]:
        """Run to the end: exit status, stderr, seconds it took."""
        start_s = time.monotonic()
        launch = self.start(name, *args)
        code = launch.proc.wait(timeout=30)
        return code, launch.read("err"), time.monotonic() - start_s

    def wait_ready(self, launch: Launch, count: int = 1, timeout_s: float = 20) -> list[str]:
        """The URLs of its ``ready at`` lines, once ``count`` replicas are ready."""

        def urls() -> list[str]:
            done, _, _partial = launch.read("out").rpartition("\n")  # whole lines only
            marked = [line for line in done.splitlines() if " ready at " in line]
            found = [line.split(" ready at ")[1].split()[0] for line in marked]
            if len(found) < count and launch.proc.poll() is not None:
                pytest.fail(f"xpulaunch exited with {launch.proc.returncode}: {launch.read('err')}")
            return found if len(found) >= count else []

        found: list[str] = wait_for(urls, f"{count} replica(s) of {launch.home.name}", timeout_s)
        return found

    def status(self) -> dict[str, Any]:
        """``xpulaunch status --json`` (the real command)."""
        done = subprocess.run(
            [str(XPULAUNCH), "status", "--json", "--lock-dir", str(self.lock_dir)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        document: dict[str, Any] = json.loads(done.stdout)
        return document

    def leases(self) -> dict[str, int]:
        """Leased device -> pid of its holder."""
        return {entry["device"]: entry["pid"] for entry in self.status()["leases"]}

    def running(self, *names: str) -> list[psutil.Process]:
        """Live processes of the launches ``names``: those naming a launch folder on their
        command line (the guardian: its job record) or in their environment (xpulaunch and
        the servers it starts inherit ``XDG_RUNTIME_DIR`` and ``FAKE_LLAMA_RECORD_DIR``)."""
        found: list[psutil.Process] = processes_marked(
            tuple(f"{self.root / name}/" for name in names)
        )
        return found

    def cleanup(self) -> None:
        for launch in self.launches:
            if launch.proc.poll() is None:
                launch.proc.kill()  # its guardian then kills its servers
            launch.proc.wait(timeout=10)
        names = [launch.home.name for launch in self.launches]
        leftovers = self.running(*names) if names else []
        kill_all(leftovers)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    tool = Rig(tmp_path)
    try:
        yield tool
    finally:
        tool.cleanup()


def lock_path(rig: Rig, key: str) -> str:
    return os.path.realpath(rig.lock_dir / lock_file_name(key))


def healthy(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return health_status(host, int(port), 2.0) == 200


def serve_one_gpu_each(rig: Rig) -> tuple[Launch, Launch, str, str]:
    """Two ``--gpus 1`` launches, both serving; their leased devices, checked on the way."""
    first = rig.start("first", "--gpus", "1")
    (url,) = rig.wait_ready(first)
    assert healthy(url)
    [lease] = rig.status()["leases"]
    assert lease["pid"] == first.pid and lease["holder_alive"] is True
    assert lease["command"][:3] == ["xpulaunch", "llama", "-m"]  # which model: tells jobs apart
    first_key = lease["device"]
    assert first_key in UUID_OF
    # The ready line names the physical GPU, not only llama.cpp's renumbered CUDA0.
    ready = [line for line in first.read("out").splitlines() if " ready at " in line]
    assert "(CUDA0 = nvidia " in ready[0] and f"({first_key}))" in ready[0], ready
    check_server(rig, first, first_key)

    second = rig.start("second", "--gpus", "1")
    (url,) = rig.wait_ready(second)
    assert healthy(url)
    (second_key,) = set(UUID_OF) - {first_key}
    assert rig.leases() == {first_key: first.pid, second_key: second.pid}
    check_server(rig, second, second_key)
    return first, second, first_key, second_key


def check_server(rig: Rig, launch: Launch, key: str) -> dict[str, Any]:
    """Its one server sees exactly the leased GPU, as CUDA0, and holds that GPU's lease."""
    [record] = launch.records()
    assert record["env"]["CUDA_VISIBLE_DEVICES"] == UUID_OF[key]
    assert record["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert record["visible_uuids"] == [UUID_OF[key]] and record["devices"] == ["CUDA0"]
    assert record["lock_files"] == [lock_path(rig, key)]
    return record


def test_each_llama_leases_its_own_gpu_and_a_third_is_refused(rig: Rig) -> None:
    first, second, first_key, second_key = serve_one_gpu_each(rig)

    # Without --wait: one line at once, naming both holders; nothing was started.
    code, err, took_s = rig.run("third", "--gpus", "1")
    assert code == 1 and took_s < 10
    line = one_line_error(err)
    assert line.startswith(f"{ERROR}--gpus 1: only 0 free device(s) of 2"), line
    for key, holder in ((first_key, first), (second_key, second)):
        assert f"{key}): skipped, leased by pid {holder.pid} (xpulaunch llama -m " in line, line

    # With --wait-timeout: it waits in line, then gives up with one line.
    code, err, took_s = rig.run("patient", "--gpus", "1", "--wait", "--wait-timeout", "1")
    assert code == 1 and 1 <= took_s < 10
    *waiting, last = err.splitlines()
    assert "gave up after waiting" in one_line_error(last + "\n"), err
    assert all(line.startswith("xpulaunch: waiting ") for line in waiting), err

    for name in ("third", "patient"):  # no server ever ran for them, and nothing is left
        assert not list((rig.root / name / "records").iterdir())
        assert rig.running(name) == []
    document = rig.status()
    assert document["waiting"] == []  # the timed-out launch left the queue
    assert rig.leases() == {first_key: first.pid, second_key: second.pid}
    assert first.proc.poll() is None and second.proc.poll() is None  # never disturbed


def test_ctrl_c_ends_the_lease_at_once_and_leaves_no_server(rig: Rig) -> None:
    first, second, first_key, second_key = serve_one_gpu_each(rig)
    [record] = first.records()
    members = rig.running("first")  # xpulaunch, its guardian, its server
    assert record["pid"] in {p.pid for p in members} and len(members) == 3, members

    first.proc.send_signal(signal.SIGINT)
    assert first.proc.wait(timeout=20) == 128 + signal.SIGINT
    assert rig.leases() == {second_key: second.pid}  # right after exit, no polling
    assert all(process_gone(p) for p in members) and rig.running("first") == []
    output = first.read("out") + first.read("err")
    assert "Traceback" not in output
    assert "cleaning up before exit" in output  # the server was stopped, not killed

    # The freed GPU is free for real: a launch without --wait gets it now.
    third = rig.start("third", "--gpus", "1")
    rig.wait_ready(third)
    check_server(rig, third, first_key)
    assert rig.leases() == {first_key: third.pid, second_key: second.pid}


def test_sigkilled_llama_keeps_its_gpus_until_its_servers_are_gone(rig: Rig) -> None:
    old = rig.start("old", "--gpus", "2", "--replicas", "2")
    rig.wait_ready(old, count=2)
    records = old.records()
    every_lock = sorted(lock_path(rig, key) for key in UUID_OF)
    assert len(records) == 2
    # Each server holds the leases of the whole job: they outlive a dead xpulaunch.
    assert all(record["lock_files"] == every_lock for record in records)
    assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in records) == sorted(UUID_OF.values())
    members = rig.running("old")
    guardians = [p for p in members if any("guardian.py" in a for a in p.cmdline())]
    assert len(guardians) == 1 and len(members) == 4, members  # + xpulaunch, 2 servers
    servers = [p for p in members if p.pid in {r["pid"] for r in records}]
    assert len(servers) == 2
    watch = tuple(f"{p.pid}:{start_ticks(p.pid)}" for p in members)

    waiter = rig.start("waiter", "--gpus", "1", "--wait", "--wait-timeout", "30", watch=watch)
    wait_for(
        lambda: any(w["pid"] == waiter.pid and w["waiting_for"] for w in rig.status()["waiting"]),
        "the second launch to wait in line",
    )
    assert waiter.records() == []  # it waits: its server has not started

    killed_s = time.monotonic()
    os.kill(old.pid, signal.SIGKILL)
    # last_alive_s is taken *before* a look that still saw one of the old job's processes,
    # so at that time the old job certainly still ran.
    last_alive_s, gone_s = killed_s, None
    while gone_s is None:
        looked_s = time.monotonic()
        if all(process_gone(p) for p in members):
            gone_s = time.monotonic()
        else:
            last_alive_s = looked_s
            assert looked_s < killed_s + 20, [p for p in members if not process_gone(p)]
            time.sleep(0.005)
    assert old.proc.wait(timeout=10) == -signal.SIGKILL

    rig.wait_ready(waiter, timeout_s=30)
    [record] = waiter.records()
    assert record["watched_alive"] == []  # at its start no process of the old job was alive
    assert record["start_s"] > last_alive_s
    key = record["env"]["XPULAUNCH_DEVICES"]
    check_server(rig, waiter, key)
    assert rig.leases() == {key: waiter.pid}
    waiter.proc.send_signal(signal.SIGINT)
    assert waiter.proc.wait(timeout=20) == 128 + signal.SIGINT
    assert rig.leases() == {} and rig.running("old", "waiter") == []
    print(
        f"old job gone {gone_s - killed_s:.3f} s after SIGKILL; the waiting server started "
        f"at +{record['start_s'] - killed_s:.3f} s"
    )


def test_serve_llama_leases_its_gpu_past_a_running_job_and_stop_frees_it(rig: Rig) -> None:
    """The Python API leases as the command does: it used to plan without the leases, so it
    took a GPU a running job held and left its own GPUs free for the next job."""
    from xpulaunch import serve_llama
    from xpulaunch.api import load_inventory
    from xpulaunch.core.plan import LaunchRequest, make_plan
    from xpulaunch.joblog.logs import LogConfig
    from xpulaunch.leases import LeaseManager

    inventory = load_inventory(str(INVENTORY))
    first, second = (d.pci_bus_id or "" for d in inventory.devices)
    home = rig.root / "api"
    (home / "run").mkdir(parents=True, mode=0o700)
    (home / "records").mkdir()
    env = {**os.environ, "XPULAUNCH_LOCK_DIR": str(rig.lock_dir),
           "XDG_RUNTIME_DIR": str(home / "run"), "FAKE_LLAMA_RECORD_DIR": str(home / "records"),
           "FAKE_LLAMA_INVENTORY": str(INVENTORY)}  # fmt: skip
    request = LaunchRequest(argv=("train.py",), gpus=f"device={first}")
    _, held = LeaseManager(rig.lock_dir).allocate(
        lambda unavailable: make_plan(request, inventory, {}, unavailable=unavailable)
    )
    with held:  # a running job holds the first GPU
        server = serve_llama(
            str(rig.model), gpus="1", binary=str(rig.binary), inventory=inventory,
            parent_env=env, logs=LogConfig(console=False),
        )  # fmt: skip
        try:
            assert [u.device.pci_bus_id for u in server.plan.plan.devices] == [second]
            assert not lock_is_free(rig.lock_dir / lock_file_name(second))
        finally:
            server.stop()
    assert lock_is_free(rig.lock_dir / lock_file_name(second))  # stop() released the lease
