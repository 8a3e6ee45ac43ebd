"""nvml_start: NVML's start (nvmlInit, each GPU's handle) in a thread ahead of the probe, for
``xpulaunch devices`` and the forked probe child; quiet where NVML is absent."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from probe_fakes import FakeMachine, b580_uhd_host

from xpulaunch.probing import nvml_start
from xpulaunch.probing.host import PROCFS_ROOT_ENV, SYSFS_ROOT_ENV, probe_from_env


def fake_intel_host(tmp_path: Path) -> dict[str, str]:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    return {SYSFS_ROOT_ENV: str(m.sys), PROCFS_ROOT_ENV: str(m.proc), "PATH": str(tmp_path)}


class FakeNvmlLibrary:
    """NVML's C calls as ctypes makes them: results by pointer (``byref``), status 0 for
    success; ``failing`` names calls that answer an error status."""

    def __init__(self, gpus: int, failing: tuple[str, ...] = ()) -> None:
        self.gpus = gpus
        self.failing = failing
        self.calls: list[str] = []

    def _status(self, name: str) -> int:
        self.calls.append(name)
        return 999 if name in self.failing else 0

    def nvmlInit_v2(self) -> int:
        return self._status("init")

    def nvmlDeviceGetCount_v2(self, count: object) -> int:
        count._obj.value = self.gpus  # type: ignore[attr-defined]  # ctypes.byref's target
        return self._status("count")

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, handle: object) -> int:
        return self._status(f"handle {index}")


def test_attach_gpus_starts_nvml_and_takes_each_gpus_handle() -> None:
    library = FakeNvmlLibrary(gpus=3, failing=("handle 1",))
    assert nvml_start.attach_gpus(library) == 2
    assert library.calls == ["init", "count", "handle 0", "handle 1", "handle 2"]


@pytest.mark.parametrize("failing", ["init", "count"])
def test_attach_gpus_stops_where_nvml_does_not_start(failing: str) -> None:
    library = FakeNvmlLibrary(gpus=2, failing=(failing,))
    assert nvml_start.attach_gpus(library) == 0
    assert "handle 0" not in library.calls


@pytest.mark.parametrize("library", ["libnot-there.so.7", "libc.so.6"])
def test_start_nvml_ends_quietly_without_nvml(
    library: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # No library, and a library without NVML's calls (libc): the thread ends, says nothing,
    # and the probe reports NVML's absence as before.
    monkeypatch.setattr(nvml_start, "NVML_LIBRARY", library)
    before = set(threading.enumerate())
    nvml_start.start_nvml({})
    for thread in set(threading.enumerate()) - before:
        thread.join(10)
        assert thread.name == "xpulaunch-nvml-start"
    assert capfd.readouterr().err == ""


def test_start_nvml_leaves_a_fake_machine_alone(tmp_path: Path) -> None:
    before = threading.active_count()
    nvml_start.start_nvml(fake_intel_host(tmp_path))
    assert threading.active_count() == before


def test_devices_json_is_the_same_with_nvml_started_first(tmp_path: Path) -> None:
    # `xpulaunch devices --json` starts NVML in a thread before it probes: on this host (no
    # NVIDIA GPU here; NVML's problem, if any, is in the document) the document equals the
    # in-process probe's.
    code = (
        "import json, os, sys\n"
        "from xpulaunch.cli.main import main\n"
        "try:\n    main(['devices', '--json'])\nexcept SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
    )
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop(SYSFS_ROOT_ENV, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    from xpulaunch.core.inventory import loads

    probed = loads(done.stdout, source="devices --json")
    here = probe_from_env(env)
    assert [d.key for d in probed.devices] == [d.key for d in here.devices]
    assert [str(p) for p in probed.problems] == [str(p) for p in here.problems]
