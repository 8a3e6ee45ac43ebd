"""Temperature and power, where the vendor reports them: NVML's, and hwmon's for amdgpu and
i915/xe (re-read at each probe), recorded as optional readings of the inventory document."""

from __future__ import annotations

from pathlib import Path

import pynvml
from probe_fakes import (
    H200,
    NVIDIA_SMI,
    FakeMachine,
    FakeNvml,
    b580_uhd_host,
    h200_host,
    mi300x_host,
    nvidia_smi_gpu,
    nvml_h200,
    probe_fake,
    write_tool,
)

from xpulaunch.core.inventory import dumps, loads
from xpulaunch.probing.nvidia import nvml_sensors
from xpulaunch.probing.sysfs import hwmon_readings


def _hwmon(m: FakeMachine, bdf: str, **files: str) -> Path:
    folder = m.sys / "bus" / "pci" / "devices" / bdf / "hwmon" / "hwmon3"
    folder.mkdir(parents=True)
    for name, value in files.items():
        (folder / name).write_text(value + "\n")
    return folder


def test_amdgpu_and_xe_hwmon(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    b580_uhd_host(m)
    _hwmon(m, "0000:0c:00.0", temp1_input="41000", power1_average="153000000")
    _hwmon(m, "0000:22:00.0", temp1_input="-ENODATA", power1_input="87500000")
    inventory = probe_fake(m)
    amd = [d for d in inventory.devices if d.vendor.value == "amd"]
    assert amd[0].extra["temperature_celsius"] == 41.0 and amd[0].extra["power_watts"] == 153.0
    assert "temperature_celsius" not in amd[1].extra  # a reading it could not give: unknown
    assert amd[1].extra["power_watts"] == 87.5
    intel = [d for d in inventory.devices if d.vendor.value == "intel"]
    assert all("power_watts" not in d.extra for d in intel)  # no hwmon there: left out
    again = loads(dumps(inventory))  # in the document, as the other readings are
    by_bus = {d.pci_bus_id: d for d in again.devices}
    assert by_bus["0000:0c:00.0"].extra["temperature_celsius"] == 41.0


def test_hwmon_files_are_read_again_each_time(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    folder = _hwmon(m, "0000:0c:00.0", temp1_input="41000")
    device = str(m.sys / "bus" / "pci" / "devices" / "0000:0c:00.0")
    assert hwmon_readings(device) == {"temperature_celsius": 41.0}
    (folder / "temp1_input").write_text("67500\n")
    assert hwmon_readings(device) == {"temperature_celsius": 67.5}
    assert hwmon_readings(str(tmp_path)) == {}


def test_nvml_temperature_and_power(tmp_path: Path) -> None:
    """Asked by top's sampler with NVML open (a launch's probe does not pay for them)."""
    m = FakeMachine(tmp_path)
    h200_host(m)
    write_tool(tmp_path / "bin", "nvidia-smi", NVIDIA_SMI, gpus=[nvidia_smi_gpu(g) for g in H200])
    gpus = nvml_h200()
    gpus[0].update(temp=38, power_mw=121456)
    nvml = FakeNvml(gpus)
    inventory = probe_fake(m, tmp_path / "bin", nvml_module=nvml)
    assert all("power_watts" not in d.extra for d in inventory.devices)  # not in the probe
    readings, problems = nvml_sensors(nvml, inventory.devices)
    first, second = inventory.devices
    assert readings == {
        first.key: {"temperature_celsius": 38.0, "power_watts": 121.5},
        second.key: {},
    }
    assert problems == []  # "Not Supported" is no problem
    assert pynvml.NVML_TEMPERATURE_GPU == FakeNvml.NVML_TEMPERATURE_GPU
