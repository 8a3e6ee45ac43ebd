"""top's sampler child: it streams samples of a fake host (re-read each time), and it leaves
when the view closes its stdin, or dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from probe_fakes import FakeMachine, mi300x_host
from test_gpu_processes import AMDGPU_OLD, _process

from helpers import process_gone, wait_for
from xpulaunch.probing.sampler import Sampler


def _host(tmp_path: Path) -> tuple[FakeMachine, dict[str, str]]:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    env = {**os.environ, "XPULAUNCH_SYSFS_ROOT": str(m.sys), "XPULAUNCH_PROCFS_ROOT": str(m.proc)}
    return m, env


def test_samples_follow_the_host_and_close_ends_the_child(tmp_path: Path) -> None:
    m, env = _host(tmp_path)
    with Sampler(env, 0.1) as sampler:
        first = sampler.latest(wait_s=30)
        assert first is not None and len(first.inventory.devices) == 2
        assert first.processes == ()
        _process(m, 4343, {3: AMDGPU_OLD}, {})  # a process starts on amd 0
        seen = wait_for(lambda: (s := sampler.latest()) and s.processes, "the new process")
        assert [p.pid for p in seen] == [4343]
        child = psutil.Process(sampler.pid)
    assert process_gone(child)  # close() waited for it


def test_the_child_leaves_when_the_view_is_killed(tmp_path: Path) -> None:
    _, env = _host(tmp_path)
    code = (
        "import os, sys, time\n"
        "from xpulaunch.probing.sampler import Sampler\n"
        "s = Sampler(os.environ, 0.1)\n"
        "s.latest(wait_s=30)\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    view = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert view.stdout is not None
        child = psutil.Process(int(view.stdout.readline()))
        view.send_signal(signal.SIGKILL)
        view.wait(timeout=30)
        wait_for(lambda: process_gone(child), "the sampler to leave after its view's SIGKILL")
    finally:
        if view.poll() is None:
            view.kill()
        view.communicate(timeout=30)


def test_a_view_whose_sampler_died_says_so(tmp_path: Path) -> None:
    from xpulaunch.cli.top import LiveView
    from xpulaunch.leases.lock_directory import LockDirectory

    _, env = _host(tmp_path)
    with Sampler(env, 0.1) as sampler:
        live = LiveView(
            LockDirectory(str(tmp_path / "locks"), shared=False), env, None, sampler, ()
        )
        assert [d.label for d in live.frame().devices] == ["amd 0", "amd 1"]
        os.kill(sampler.pid, signal.SIGKILL)
        wait_for(lambda: sampler.ended() is not None, "the sampler's end")
        notes = live.frame().notes
        assert "devices: the sampler ended (exit status -9); restart top" in notes
