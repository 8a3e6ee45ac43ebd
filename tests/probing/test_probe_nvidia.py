"""NVIDIA: NVML first, nvidia-smi fallback, procfs identity, sysfs last (sections 4.3-4.5)."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest
from probe_fakes import (
    H200,
    NVIDIA_SMI,
    SLEEPER,
    FakeMachine,
    FakeNvml,
    b580_uhd_host,
    calls,
    h200_host,
    messages,
    nvidia_smi_gpu,
    nvml_h200,
    probe_fake,
    write_tool,
)

from xpulaunch.probing.host import probe_host

MIB = 1024 * 1024
NVML_MISSING = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


@pytest.fixture
def h200(tmp_path: Path) -> FakeMachine:
    m = FakeMachine(tmp_path)
    h200_host(m)
    return m


def test_nvml_used_memory_excludes_the_driver_reserve(h200: FakeMachine, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=[nvidia_smi_gpu(g) for g in H200])
    nvml = FakeNvml(nvml_h200())
    inv = probe_fake(h200, bin_dir, nvml_module=nvml)
    assert [(d.index, d.pci_bus_id, d.uuid) for d in inv.devices] == [
        (g["index"], g["bdf"], g["uuid"]) for g in H200
    ]
    gpu0 = inv.devices[0]
    assert gpu0.memory_total_bytes == 150754820096
    assert gpu0.memory_used_bytes == 0  # v2 used; v1 would say 644939776 (the reserve)
    assert gpu0.utilization_percent == 0.0
    assert gpu0.name == "NVIDIA H200"
    assert gpu0.extra["driver_version"] == "580.159.04"
    assert gpu0.extra["pci_device_id"] == "0x2335"
    assert gpu0.extra["sources"] == ["sysfs", "nvml"]
    assert inv.problems == ()
    # NVML is initialised once per process and left initialised (NvmlState says why).
    assert nvml.calls.count("nvmlInit") == 1 and "nvmlShutdown" not in nvml.calls
    assert calls(bin_dir) == []  # NVML worked: nvidia-smi never ran


def test_a_second_probe_in_the_same_process_does_not_init_nvml_again(
    h200: FakeMachine, tmp_path: Path
) -> None:
    nvml = FakeNvml(nvml_h200())
    first = probe_fake(h200, tmp_path / "bin", nvml_module=nvml)
    second = probe_fake(h200, tmp_path / "bin", nvml_module=nvml)
    assert first == second and len(second.devices) == 2
    assert nvml.calls.count("nvmlInit") == 1


def test_every_new_nvml_module_is_initialised_even_at_a_freed_ones_address(
    h200: FakeMachine,
) -> None:
    """The probe remembers initialised modules by reference. Remembered by ``id()``, a fresh
    stand-in that CPython allocated where a freed one had lived was taken as initialised: in
    this loop that happened within the first few rounds."""
    for _ in range(20):
        nvml = FakeNvml(nvml_h200())
        probe_fake(h200, nvml_module=nvml)
        assert nvml.calls.count("nvmlInit") == 1
        del nvml  # free it, so that the next one may take its address


def test_resetting_the_nvml_state_shuts_down_what_the_probe_initialised(
    h200: FakeMachine,
) -> None:
    from xpulaunch.probing.nvidia import NVML_STATE

    nvml = FakeNvml(nvml_h200())
    probe_fake(h200, nvml_module=nvml)
    NVML_STATE.shutdown()
    assert nvml.calls.count("nvmlShutdown") == 1 and nvml.initialised == 0
    probe_fake(h200, nvml_module=nvml)  # a fresh start: NVML is initialised again
    assert nvml.calls.count("nvmlInit") == 2


def test_nvml_without_v2_falls_back_to_v1_and_says_so(h200: FakeMachine) -> None:
    inv = probe_fake(h200, nvml_module=FakeNvml(nvml_h200(), v2=False))
    assert inv.devices[0].memory_used_bytes == 644939776
    assert "includes the driver reserve" in messages(inv)


def test_nvml_mig_instances(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    m.pci("0000:07:00.0", vendor=0x10DE, device=0x20B0, cls=0x030200, driver="nvidia")
    migs = [
        {"uuid": "MIG-7f6a1b2c-1111-5e6f-8a9b-0c1d2e3f4a5b", "total": 20 * 1024**3, "used": 0},
        {"uuid": "MIG-8a7b2c3d-2222-6f70-9bac-1d2e3f4a5b6c", "total": 20 * 1024**3, "used": 7},
    ]
    gpu = {"uuid": "GPU-0c1f3e2d-aaaa-bbbb-cccc-000000000000", "bus": "00000000:07:00.0",
           "name": "NVIDIA A100-SXM4-40GB", "total": 40 * 1024**3, "used_v1": 1, "used_v2": 0,
           "mig": migs, "util_error": pynvml.NVML_ERROR_NOT_SUPPORTED}  # fmt: skip
    inv = probe_fake(m, nvml_module=FakeNvml([gpu]))
    (a100,) = inv.devices
    assert [(x.uuid, x.memory_total_bytes, x.memory_used_bytes) for x in a100.mig_devices] == [
        (m_["uuid"], m_["total"], m_["used"]) for m_ in migs
    ]
    assert a100.utilization_percent is None  # NVML: Not Supported in MIG mode -> unknown
    assert inv.problems == ()


def test_utilisation_error_other_than_not_supported_is_recorded(h200: FakeMachine) -> None:
    nvml = FakeNvml(nvml_h200(util_error=pynvml.NVML_ERROR_GPU_IS_LOST))
    inv = probe_fake(h200, nvml_module=nvml)
    assert inv.devices[0].utilization_percent is None
    assert "utilisation unavailable" in messages(inv)


def test_nvml_missing_falls_back_to_nvidia_smi(h200: FakeMachine, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=[nvidia_smi_gpu(g) for g in H200])
    inv = probe_fake(h200, bin_dir, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert [(d.index, d.pci_bus_id, d.uuid) for d in inv.devices] == [
        (g["index"], g["bdf"], g["uuid"]) for g in H200
    ]  # nvidia-smi ignores CUDA_VISIBLE_DEVICES: physical indices
    assert inv.devices[1].memory_total_bytes == 143771 * MIB
    assert inv.devices[1].memory_used_bytes == 0
    assert inv.devices[1].extra["sources"] == ["sysfs", "nvidia-smi"]
    assert [p.source for p in inv.problems] == ["nvml"]  # why the fallback was needed
    call, topo = calls(bin_dir, "nvidia-smi")  # the query, then the links of the 2 GPUs
    assert call["argv"][-1] == "--format=csv,noheader,nounits"
    assert topo["argv"] == ["topo", "-m"]
    assert inv.devices[0].extra["pcie"] == {H200[1]["bdf"]: "PHB"}


def test_nvidia_smi_na_cells_are_unknown(h200: FakeMachine, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    rows = [nvidia_smi_gpu(g, **{"memory.used": "[N/A]", "utilization.gpu": "[Not Supported]"})
            for g in H200]  # fmt: skip
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=rows)
    inv = probe_fake(h200, bin_dir)
    assert [(d.memory_total_bytes, d.memory_used_bytes, d.utilization_percent)
            for d in inv.devices] == [(143771 * MIB, None, None)] * 2  # fmt: skip


def test_nvidia_smi_exit_6_no_devices(h200: FakeMachine, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=[])
    inv = probe_fake(h200, bin_dir)
    text = messages(inv)
    assert "No devices were found (exit 6)" in text
    assert "nvml" in text
    # sysfs still knows the two boards: identity only, memory unknown - never 0
    assert [(d.pci_bus_id, d.memory_total_bytes) for d in inv.devices] == [
        ("0000:00:06.0", None), ("0000:00:07.0", None),
    ]  # fmt: skip


def test_procfs_identity_when_no_tool_works(h200: FakeMachine) -> None:
    for gpu in H200:
        info = Path(__file__).parents[1] / "fixtures/probe/nvidia/proc-information-h100.txt"
        text = info.read_text().replace("0000:00:06.0", gpu["bdf"])
        h200.nvidia_proc(gpu["bdf"], text.replace("GPU-9755e7df-acbd-f438-f3da-904cad73240b",
                                                  gpu["uuid"]))  # fmt: skip
    inv = probe_fake(h200)
    assert [(d.index, d.uuid, d.name) for d in inv.devices] == [
        (g["index"], g["uuid"], "NVIDIA H100 80GB HBM3") for g in H200
    ]
    assert "nvidia-smi: not installed" in messages(inv)


def test_nvidia_smi_timeout_is_a_problem_and_leaves_nothing_running(
    h200: FakeMachine, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    write_tool(bin_dir, "nvidia-smi", SLEEPER)
    inv = probe_fake(h200, bin_dir, timeout_s=0.5)
    assert "nvidia-smi: timed out after 0.5 s and was killed" in messages(inv)
    (call,) = calls(bin_dir)
    with pytest.raises(ProcessLookupError):
        os.kill(call["pid"], 0)


def test_gpu_only_sysfs_sees_is_a_problem_not_a_device(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    h200_host(m)
    m.pci("0000:65:00.0", vendor=0x10DE, device=0x2330, cls=0x030200, driver="vfio-pci")
    inv = probe_fake(m, nvml_module=FakeNvml(nvml_h200()))
    assert len(inv.devices) == 2
    assert "0000:65:00.0" in messages(inv) and "vfio-pci" in messages(inv)


def test_host_without_nvidia_has_no_nvml_noise(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    quiet = probe_fake(m, nvml_module=FakeNvml([], init_error=NVML_MISSING))
    assert not any(p.source == "nvml" for p in quiet.problems)
    debug = probe_fake(m, nvml_module=FakeNvml([], init_error=NVML_MISSING), report_missing=True)
    assert any(p.source == "nvml" and "Library Not Found" in p.message for p in debug.problems)


def test_without_the_library_or_pynvml_the_note_names_pynvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without libnvidia-ml the probe does not import pynvml (a host without the driver does
    not pay for it); its note is still the one an import failure gave when pynvml is not
    installed either."""
    import importlib.util

    from xpulaunch.probing import nvidia

    # As on a host without the driver, also where this test runs on one.
    monkeypatch.setattr(nvidia, "_library_loads", lambda: False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "pynvml" else real_find_spec(name, *args),
    )
    m = FakeMachine(tmp_path)
    inv = probe_host(sys_root=m.sys, proc_root=m.proc, env={"PATH": "/nonexistent"},
                     use_pyzes=False, report_missing=True)  # fmt: skip
    assert [str(p) for p in inv.problems] == ["nvml: pynvml (nvidia-ml-py) is not importable"]


def test_real_pynvml_on_this_host(tmp_path: Path) -> None:
    """The installed nvidia-ml-py, for real: no library here means a quiet, empty answer."""
    m = FakeMachine(tmp_path)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        inv = probe_host(sys_root=m.sys, proc_root=m.proc, env={"PATH": "/nonexistent"},
                         use_pyzes=False, report_missing=True)  # fmt: skip
        assert inv.devices == ()
        assert [str(p) for p in inv.problems] == [f"nvml: nvmlInit failed: {exc}"]
    else:  # a host with NVIDIA GPUs: NVML lists them even with an empty fake sysfs
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        inv = probe_host(sys_root=m.sys, proc_root=m.proc, use_pyzes=False)
        assert len(inv.devices) == count
        assert all(d.memory_used_bytes is not None for d in inv.devices)


@pytest.mark.parametrize("library", ["libnvidia-ml.so.1", "libc.so.6", "libnot-there.so.7"])
def test_library_loads_answers_as_ctypes_cdll_does(
    library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctypes

    from xpulaunch.probing import nvidia

    monkeypatch.setattr(nvidia, "NVML_LIBRARY", library)
    try:
        ctypes.CDLL(library)
    except OSError:
        loads = False
    else:
        loads = True
    assert nvidia._library_loads() is loads
    if library == "libc.so.6":
        assert loads  # a real comparison: one library that does load
