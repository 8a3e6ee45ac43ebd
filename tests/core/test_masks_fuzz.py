"""Hypothesis: every mask parser survives arbitrary text (only XpulaunchError may escape),
and what the formatters write parses back to the same devices."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, strategies as st

from xpulaunch.core.masks.cuda import (
    CudaEntry,
    format_cuda_visible_devices,
    parse_cuda_visible_devices,
)
from xpulaunch.core.masks.level_zero import (
    format_ze_affinity_mask,
    parse_ze_affinity_mask,
    regroup_units,
    resolve_hierarchy,
)
from xpulaunch.core.masks.oneapi import parse_oneapi_device_selector
from xpulaunch.core.masks.rocm import (
    amd_visible,
    format_rocr_visible_devices,
    parse_hip_visible_devices,
    parse_rocr_visible_devices,
)
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import XpulaunchError
from xpulaunch.model import Device, Hierarchy, Inventory, MigDevice, Unit, Vendor

NVIDIA = (
    Device(Vendor.NVIDIA, 0, uuid="GPU-a6026e70-2f8a", mig_devices=(MigDevice("MIG-0a1b"),)),
    Device(Vendor.NVIDIA, 1, uuid="GPU-e436550d-4102"),
)
INTEL = (
    Device(Vendor.INTEL, 0, pci_bus_id="0000:3a:00.0", tiles=4),
    Device(Vendor.INTEL, 1, pci_bus_id="0000:00:02.0", integrated=True),
)
AMD = tuple(Device(Vendor.AMD, i, uuid=f"GPU-{i:016x}") for i in range(3))

# Text made of the characters masks are made of, so that deep paths get reached, plus any text.
MASK_TEXT = st.one_of(
    st.text(alphabet="0123456789,.;:!*-+xXGPUMIabcdef _gpulevlzroncd", max_size=30),
    st.text(max_size=30),
)
OPTIONAL_TEXT = st.none() | MASK_TEXT


def survives(parse: Callable[[], object]) -> None:
    try:
        parse()
    except XpulaunchError as error:
        assert error.message and "\n" not in error.message


@given(OPTIONAL_TEXT)
def test_cuda_parser_only_raises_xpulaunch_errors(value: str | None) -> None:
    survives(lambda: parse_cuda_visible_devices(value, NVIDIA))


@given(OPTIONAL_TEXT, st.sampled_from(list(Hierarchy)), st.booleans())
def test_ze_parser_only_raises_xpulaunch_errors(
    value: str | None, hierarchy: Hierarchy, pci_order: bool
) -> None:
    survives(lambda: parse_ze_affinity_mask(value, INTEL, hierarchy, pci_order=pci_order))


@given(OPTIONAL_TEXT)
def test_hierarchy_resolution_never_raises(value: str | None) -> None:
    hierarchy, note = resolve_hierarchy(value, INTEL)
    assert isinstance(hierarchy, Hierarchy) and note


@given(OPTIONAL_TEXT, st.integers(0, 5))
def test_oneapi_parser_only_raises_xpulaunch_errors(value: str | None, count: int) -> None:
    def parse() -> None:
        positions = parse_oneapi_device_selector(value, count).positions
        assert all(0 <= p < count for p in positions) and list(positions) == sorted(set(positions))

    survives(parse)


@given(
    OPTIONAL_TEXT, OPTIONAL_TEXT, st.sampled_from(["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"])
)
def test_amd_parsers_only_raise_xpulaunch_errors(
    rocr: str | None, hip: str | None, name: str
) -> None:
    survives(lambda: parse_rocr_visible_devices(rocr, AMD))
    survives(lambda: parse_hip_visible_devices(hip, AMD[1:], rocr_value=rocr, name=name))
    survives(lambda: amd_visible(rocr, hip, AMD, hip_name=name))


VARIABLES = [
    "CUDA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ONEAPI_DEVICE_SELECTOR",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
]


@given(st.dictionaries(st.sampled_from(VARIABLES), MASK_TEXT, max_size=4))
def test_parent_visible_only_raises_xpulaunch_errors(env: dict[str, str]) -> None:
    host = Inventory(devices=(*NVIDIA, *INTEL, *AMD))
    for vendor in Vendor:
        survives(lambda vendor=vendor: parent_visible(host, vendor, env, hierarchy=None))


# --- round trips ----------------------------------------------------------------------------


@st.composite
def cuda_entries(draw: st.DrawFn) -> tuple[tuple[Device, ...], list[CudaEntry]]:
    count = draw(st.integers(1, 6))
    with_uuid = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    indices = draw(st.lists(st.integers(0, 30), min_size=count, max_size=count, unique=True))
    devices = tuple(
        Device(
            Vendor.NVIDIA,
            index,
            uuid=f"GPU-{index:08x}-77" if has else None,
            mig_devices=(MigDevice(f"MIG-{index:08x}-1"), MigDevice(f"MIG-{index:08x}-2")),
        )
        for index, has in zip(indices, with_uuid, strict=True)
    )
    chosen = draw(st.permutations(devices).map(lambda p: p[: draw(st.integers(0, len(p)))]))
    entries = [CudaEntry(d) for d in chosen]
    if entries and draw(st.booleans()):  # one MIG instance per process, and nothing else
        device = draw(st.sampled_from(entries)).device
        entries = [CudaEntry(device, draw(st.sampled_from(device.mig_devices)))]
    return devices, entries


@given(cuda_entries())
def test_cuda_format_parse_round_trip(case: tuple[tuple[Device, ...], list[CudaEntry]]) -> None:
    devices, entries = case
    text = format_cuda_visible_devices(entries)
    assert list(parse_cuda_visible_devices(text, devices).entries) == entries


@st.composite
def intel_units(draw: st.DrawFn) -> tuple[tuple[Device, ...], list[Unit]]:
    count = draw(st.integers(1, 5))
    buses = draw(st.lists(st.integers(0, 255), min_size=count, max_size=count, unique=True))
    cards = tuple(
        Device(
            Vendor.INTEL,
            i,
            pci_bus_id=f"0000:{bus:02x}:00.0",
            tiles=draw(st.sampled_from([1, 2, 4])),
            integrated=draw(st.booleans()),
        )
        for i, bus in enumerate(buses)
    )
    every = [Unit(c, t) for c in cards for t in range(c.tiles)] + [Unit(c) for c in cards]
    return cards, draw(st.lists(st.sampled_from(every), max_size=8))


@given(intel_units(), st.sampled_from(list(Hierarchy)), st.booleans())
def test_ze_format_parse_round_trip(
    case: tuple[tuple[Device, ...], list[Unit]], hierarchy: Hierarchy, pci_order: bool
) -> None:
    cards, units = case
    text = format_ze_affinity_mask(units, cards, hierarchy, pci_order=pci_order)
    parsed = parse_ze_affinity_mask(text, cards, hierarchy, pci_order=pci_order)
    assert parsed.units == regroup_units(units, cards, hierarchy, pci_order=pci_order)
    # A mask we write is plain: nothing skipped, reordered or repeated (the hide-all mask is
    # skipped on purpose).
    assert not parsed.notes if units else len(parsed.notes) == 1


@given(st.lists(st.booleans(), min_size=1, max_size=6), st.data())
def test_rocr_format_parse_round_trip(with_uuid: list[bool], data: st.DataObject) -> None:
    devices = tuple(
        Device(Vendor.AMD, i, uuid=f"GPU-{i + 0xA0:016x}" if has else None)
        for i, has in enumerate(with_uuid)
    )
    chosen = data.draw(st.permutations(devices))[: data.draw(st.integers(1, len(devices)))]
    text = format_rocr_visible_devices(chosen)
    assert parse_rocr_visible_devices(text, devices) == tuple(chosen)
