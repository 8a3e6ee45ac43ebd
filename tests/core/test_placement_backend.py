"""Worker placement, device maps and backend choice."""

from __future__ import annotations

import json

import pytest

from helpers import load_inventory
from xpulaunch.core import devicemap
from xpulaunch.core.backend import choose_backend, parse_backend
from xpulaunch.core.devicemap import place, split_evenly, worker_count
from xpulaunch.core.selection import GpuMode, GpuRequest
from xpulaunch.errors import SelectionError, UsageError
from xpulaunch.model import Backend, Device, DeviceMap, Unit, Vendor

GiB = 1 << 30


@pytest.mark.parametrize(
    ("units", "workers", "isolate", "expected"),
    [
        (2, 2, False, ((0, 1), (0, 1))),
        (2, 2, True, ((0,), (1,))),
        (4, 2, True, ((0, 1), (2, 3))),
        (3, 2, True, ((0, 1), (2,))),
        (0, 2, True, ((), ())),
        (0, 1, False, ((),)),
        (2, 4, False, ((0, 1),) * 4),
    ],
)
def test_place(
    units: int, workers: int, isolate: bool, expected: tuple[tuple[int, ...], ...]
) -> None:
    assert place(units, workers, isolate=isolate) == expected


def test_isolate_needs_a_device_per_worker() -> None:
    with pytest.raises(SelectionError) as raised:
        place(2, 3, isolate=True)
    assert raised.value.message.startswith("isolate=True: 3 isolated workers need at least 3 ")
    assert raised.value.cli_message().startswith("--isolate: 3 isolated workers need at least 3 ")


def test_worker_count() -> None:
    assert worker_count(None, 4) == 4
    assert worker_count(None, 0) == 1
    assert worker_count(3, 1) == 3
    with pytest.raises(UsageError):
        worker_count(0, 1)


def test_split_evenly_covers_everything_once() -> None:
    for n in range(1, 9):
        for parts in range(1, n + 1):
            shares = split_evenly(range(n), parts)
            assert [i for s in shares for i in s] == list(range(n))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_device_map_choice() -> None:
    assert devicemap.choose_device_map(0, None) is None
    assert devicemap.choose_device_map(1, None) is DeviceMap.SEQUENTIAL
    assert devicemap.choose_device_map(3, None) is DeviceMap.BALANCED
    assert devicemap.choose_device_map(3, DeviceMap.BALANCED_LOW_0) is DeviceMap.BALANCED_LOW_0


def test_max_memory_uses_free_memory_with_headroom_and_skips_unknown() -> None:
    a = Device(Vendor.NVIDIA, 0, memory_total_bytes=80 * GiB, memory_used_bytes=20 * GiB)
    b = Device(Vendor.INTEL, 0, memory_total_bytes=16 * GiB)  # used unknown: the total
    c = Device(Vendor.INTEL, 1)
    budget = devicemap.max_memory([Unit(a), Unit(b), Unit(c)])
    assert budget == {"0": int(60 * GiB * 0.9), "1": int(16 * GiB * 0.9)}
    assert json.loads(devicemap.max_memory_json([Unit(a)])) == {"0": int(60 * GiB * 0.9)}


def test_tile_memory_is_a_share_of_the_card() -> None:
    card = load_inventory("2x-max1550.json").devices[0]
    assert Unit(card, 1).memory_total_bytes == card.memory_total_bytes // 2  # type: ignore[operator]


@pytest.mark.parametrize("text", ["auto", None, " AUTO "])
def test_parse_backend_auto(text: str | None) -> None:
    assert parse_backend(text) is None


def test_parse_backend_rejects_unknown() -> None:
    with pytest.raises(UsageError, match="expected auto, cuda, xpu, rocm or cpu"):
        parse_backend("metal")


AUTO = GpuRequest(GpuMode.AUTO)


def _visible(name: str) -> tuple[tuple[Device, ...], dict[Vendor, tuple[Unit, ...]]]:
    devices = load_inventory(name).devices
    visible: dict[Vendor, tuple[Unit, ...]] = {}
    for d in devices:
        visible[d.vendor] = (*visible.get(d.vendor, ()), Unit(d))
    return devices, visible


def test_hybrid_prefers_nvidia_and_says_why() -> None:
    devices, visible = _visible("hybrid-4090-arc.json")
    backend, notes = choose_backend(None, AUTO, devices, visible)
    assert backend is Backend.CUDA
    assert "NVIDIA and Intel GPUs are visible" in notes[-1] and "--backend xpu" in notes[-1]


def test_hybrid_with_nvidia_hidden_picks_intel() -> None:
    devices, visible = _visible("hybrid-4090-arc.json")
    visible[Vendor.NVIDIA] = ()
    backend, notes = choose_backend(None, AUTO, devices, visible)
    assert backend is Backend.XPU
    assert any("NVIDIA GPUs are hidden" in n for n in notes)


def test_explicit_backend_wins_and_must_exist() -> None:
    devices, visible = _visible("hybrid-4090-arc.json")
    assert choose_backend(Backend.XPU, AUTO, devices, visible)[0] is Backend.XPU
    with pytest.raises(SelectionError, match="no AMD GPU on this host"):
        choose_backend(Backend.ROCM, AUTO, devices, visible)
    visible[Vendor.INTEL] = ()
    with pytest.raises(SelectionError, match="every Intel GPU is hidden"):
        choose_backend(Backend.XPU, AUTO, devices, visible)


def test_uuid_or_bus_in_gpus_picks_the_vendor() -> None:
    devices, visible = _visible("hybrid-4090-arc.json")
    request = GpuRequest(GpuMode.EXPLICIT, ids=("0000:04:00.0",))
    assert choose_backend(None, request, devices, visible)[0] is Backend.XPU


def test_cpu_only_host() -> None:
    backend, notes = choose_backend(None, AUTO, (), {})
    assert backend is Backend.CPU and "running on the CPU" in notes[-1]
    with pytest.raises(SelectionError) as raised:
        choose_backend(None, GpuRequest(GpuMode.COUNT, count=2), (), {})
    assert raised.value.message.startswith("gpus='2': no usable accelerator")
    assert raised.value.cli_message().startswith("--gpus 2: no usable accelerator")


def test_only_an_igpu_means_cpu_for_auto() -> None:
    devices = load_inventory("arc-b580-igpu.json").devices[1:]
    backend, notes = choose_backend(None, AUTO, devices, {Vendor.INTEL: (Unit(devices[0]),)})
    assert backend is Backend.CPU
    assert any("only integrated GPUs" in n for n in notes)
