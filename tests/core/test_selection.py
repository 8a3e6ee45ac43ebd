"""--gpus parsing and device selection (contract section 1, issue 2 item 5)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from helpers import load_inventory
from xpulaunch.core.selection import (
    Filters,
    GpuMode,
    GpuRequest,
    holder_of,
    parse_gpus,
    select,
)
from xpulaunch.errors import DeviceBusyError, SelectionError, UsageError, XpulaunchError
from xpulaunch.model import Device, Unit, Vendor

GiB = 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", GpuRequest(GpuMode.AUTO)),
        (" ALL ", GpuRequest(GpuMode.ALL)),
        ("none", GpuRequest(GpuMode.NONE)),
        ("2", GpuRequest(GpuMode.COUNT, count=2)),
        ("0,2", GpuRequest(GpuMode.EXPLICIT, ids=("0", "2"))),
        ("device=1", GpuRequest(GpuMode.EXPLICIT, ids=("1",))),
        ("device=0, 3", GpuRequest(GpuMode.EXPLICIT, ids=("0", "3"))),
        ("GPU-e436550d", GpuRequest(GpuMode.EXPLICIT, ids=("GPU-e436550d",))),
        ("0000:29:00.0", GpuRequest(GpuMode.EXPLICIT, ids=("0000:29:00.0",))),
        ("29:00.0", GpuRequest(GpuMode.EXPLICIT, ids=("29:00.0",))),
        ("1.0,1.1", GpuRequest(GpuMode.EXPLICIT, ids=("1.0", "1.1"))),
        ("1.1", GpuRequest(GpuMode.EXPLICIT, ids=("1.1",))),
    ],
)
def test_parse_gpus(text: str, expected: GpuRequest) -> None:
    assert parse_gpus(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", r"a count \(as in docker run --gpus\) must be at least 1; .*write device=0"),
        ("two", "expected auto, all, none"),
        ("", "expected auto, all, none"),
        ("0,,1", "empty device id"),
        ("device=", "empty device id"),
        ("0,0", "listed twice"),
        ("-1", "expected auto"),
    ],
)
def test_parse_gpus_rejects(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_gpus(text)


@given(st.text(max_size=30))
def test_parse_gpus_fuzz_only_our_errors(text: str) -> None:
    try:
        request = parse_gpus(text)
    except XpulaunchError:
        return
    assert parse_gpus(request.text) == request


def _units(name: str, vendor: Vendor = Vendor.NVIDIA) -> tuple[list[Unit], tuple[Device, ...]]:
    devices = load_inventory(name).of(vendor)
    return [Unit(d) for d in devices], devices


def test_count_picks_most_free_and_skips_busy() -> None:
    units, devices = _units("8x-h100.json")
    chosen = select(GpuRequest(GpuMode.COUNT, count=7), units, devices)
    assert [u.device.index for u in chosen.units] == [0, 1, 2, 4, 5, 6, 7]
    assert any("nvidia 3" in n and "busy" in n for n in chosen.notes)
    with pytest.raises(SelectionError, match="only 7 free device"):
        select(GpuRequest(GpuMode.COUNT, count=8), units, devices)


def test_auto_takes_every_free_device() -> None:
    units, devices = _units("8x-h100.json")
    chosen = select(GpuRequest(GpuMode.AUTO), units, devices)
    assert len(chosen.units) == 7


def test_leased_devices_are_skipped_by_auto_and_refused_explicitly() -> None:
    units, devices = _units("2x-h200.json")
    held = {"0000:00:06.0": "pid 42 (python train.py, user bob)"}
    chosen = select(GpuRequest(GpuMode.COUNT, count=1), units, devices, unavailable=held)
    assert [u.device.index for u in chosen.units] == [1]
    assert any("leased by pid 42" in n for n in chosen.notes)
    with pytest.raises(DeviceBusyError, match="pid 42"):
        select(GpuRequest(GpuMode.EXPLICIT, ids=("0",)), units, devices, unavailable=held)


def test_a_leased_tile_blocks_its_card_and_a_leased_card_blocks_its_tiles() -> None:
    device = load_inventory("2x-max1550.json").devices[0]
    assert holder_of(Unit(device), {f"{device.key}/tile1": "job"}) == "job"
    assert holder_of(Unit(device, 0), {device.key: "job"}) == "job"
    assert holder_of(Unit(device, 0), {f"{device.key}/tile1": "job"}) is None


def test_unknown_memory_ranks_after_known_free_and_says_so() -> None:
    known = Device(
        Vendor.INTEL,
        0,
        pci_bus_id="0000:03:00.0",
        memory_total_bytes=8 * GiB,
        memory_used_bytes=GiB // 2,
    )
    unknown = Device(Vendor.INTEL, 1, pci_bus_id="0000:04:00.0", memory_total_bytes=16 * GiB)
    chosen = select(GpuRequest(GpuMode.AUTO), [Unit(unknown), Unit(known)], [known, unknown])
    assert [u.device.index for u in chosen.units] == [0, 1]
    assert any("free memory unknown" in n for n in chosen.notes)


def test_min_free_memory_rejects_small_and_reads_unknown_as_auto_does() -> None:
    small = Device(Vendor.AMD, 0, memory_total_bytes=8 * GiB, memory_used_bytes=4 * GiB)
    big = Device(Vendor.AMD, 1, memory_total_bytes=64 * GiB, memory_used_bytes=0)
    unknown = Device(Vendor.AMD, 2, memory_total_bytes=64 * GiB)
    tiny_unknown = Device(Vendor.AMD, 3, memory_total_bytes=4 * GiB)
    units = [Unit(small), Unit(big), Unit(unknown), Unit(tiny_unknown)]
    devices = [small, big, unknown, tiny_unknown]
    filters = Filters(min_free_memory_bytes=8 * GiB)
    chosen = select(GpuRequest(GpuMode.AUTO), units, devices, filters=filters)
    assert [u.device.index for u in chosen.units] == [1, 2]  # unknown after known-free
    notes = " ".join(chosen.notes)
    assert "4.0 GiB free < the 8.0 GiB minimum asked for" in notes
    assert "only 4.0 GiB in all < the 8.0 GiB minimum" in notes
    assert "policy: a device whose free memory is unknown" in notes
    plain = select(GpuRequest(GpuMode.AUTO), units, devices)
    assert Unit(unknown) in plain.units  # auto reads unknown the same way


def test_max_utilization_filter() -> None:
    units, devices = _units("hybrid-4090-arc.json")
    chosen = select(
        GpuRequest(GpuMode.AUTO), units, devices, filters=Filters(max_utilization_percent=1)
    )
    assert chosen.units == ()
    assert "2% busy > the 1% utilisation limit" in chosen.notes[0]


def test_integrated_gpu_only_when_named() -> None:
    units, devices = _units("arc-b580-igpu.json", Vendor.INTEL)
    auto = select(GpuRequest(GpuMode.AUTO), units, devices)
    assert [u.device.name for u in auto.units] == ["Intel(R) Arc(TM) B580 Graphics"]
    assert any("integrated GPUs are only used when named" in n for n in auto.notes)
    every = select(GpuRequest(GpuMode.ALL), units, devices)
    assert [u.device.index for u in every.units] == [0]
    named = select(GpuRequest(GpuMode.EXPLICIT, ids=("1",)), units, devices)
    assert named.units[0].device.integrated


def test_explicit_ids_by_index_uuid_prefix_free_bus_and_order_kept() -> None:
    units, devices = _units("2x-h200.json")
    for ident in (
        "1",
        "GPU-e436550d-4102-c58c-de2e-988dc6aaa541",
        "GPU-e436550d",  # a unique prefix, as CUDA_VISIBLE_DEVICES accepts
        "gpu-E436",
        "0000:00:07.0",
        "00:07.0",
    ):
        chosen = select(GpuRequest(GpuMode.EXPLICIT, ids=(ident,)), units, devices)
        assert [u.device.index for u in chosen.units] == [1], ident
    both = select(GpuRequest(GpuMode.EXPLICIT, ids=("1", "0")), units, devices)
    assert [u.device.index for u in both.units] == [1, 0]


def test_explicit_errors() -> None:
    units, devices = _units("2x-h200.json")
    with pytest.raises(SelectionError) as raised:
        select(GpuRequest(GpuMode.EXPLICIT, ids=("5",)), units, devices)
    # "--gpus 5" would be a count: the id is named as --gpus takes it alone (it said --gpus 5)
    assert raised.value.message.startswith("gpus='device=5': no such device; devices here: 0 ")
    assert raised.value.cli_message().startswith("--gpus device=5: no such device; devices here:")
    with pytest.raises(SelectionError, match=r"UUID prefix fits 2 devices .*; give more of it"):
        select(GpuRequest(GpuMode.EXPLICIT, ids=("GPU-",)), units, devices)
    with pytest.raises(SelectionError, match="hidden by the parent's visibility"):
        select(GpuRequest(GpuMode.EXPLICIT, ids=("1",)), units[:1], devices)
    with pytest.raises(SelectionError, match="named twice"):
        select(GpuRequest(GpuMode.EXPLICIT, ids=("1", "0000:00:07.0")), units, devices)


def test_intel_card_id_hands_out_all_its_tiles_and_card_dot_tile_one() -> None:
    devices = load_inventory("2x-max1550.json").devices
    tiles = [Unit(d, t) for d in devices for t in range(d.tiles)]
    card = select(GpuRequest(GpuMode.EXPLICIT, ids=("1",)), tiles, devices)
    assert [(u.device.index, u.tile) for u in card.units] == [(1, 0), (1, 1)]
    one = select(GpuRequest(GpuMode.EXPLICIT, ids=("1.1",)), tiles, devices)
    assert [(u.device.index, u.tile) for u in one.units] == [(1, 1)]
    with pytest.raises(SelectionError, match=r"valid tiles are 0\.\.1"):
        select(GpuRequest(GpuMode.EXPLICIT, ids=("1.2",)), tiles, devices)
    cards = [Unit(d) for d in devices]
    with pytest.raises(SelectionError, match="COMPOSITE"):
        select(GpuRequest(GpuMode.EXPLICIT, ids=("1.1",)), cards, devices)


@pytest.mark.parametrize("whole", [False, True])  # FLAT tiles, or COMPOSITE with a partial mask
def test_a_tile_the_parent_hides_is_named_hidden_not_blamed_on_the_hierarchy(whole: bool) -> None:
    # The parent's ZE_AFFINITY_MASK shows tile 0 of card 1 and card 0 (whole under COMPOSITE).
    devices = load_inventory("2x-max1550.json").devices
    card0 = [Unit(devices[0])] if whole else [Unit(devices[0], 0), Unit(devices[0], 1)]
    units = [*card0, Unit(devices[1], 0)]
    with pytest.raises(SelectionError) as raised:
        select(GpuRequest(GpuMode.EXPLICIT, ids=("1.1",)), units, devices)
    message = raised.value.cli_message()
    assert message.startswith(f"--gpus 1.1: {devices[1].label()} tile 1 is hidden by the parent")
    assert "COMPOSITE" not in message
    assert message.endswith(f"visible: {', '.join(u.label() for u in units)}")


@pytest.mark.parametrize(
    ("name", "vendor"), [("2x-h200.json", Vendor.NVIDIA), ("4x-mi300x.json", Vendor.AMD)]
)
def test_card_dot_tile_on_a_gpu_without_tiles_says_so_without_intel_advice(
    name: str, vendor: Vendor
) -> None:
    # "1.0" on an NVIDIA or AMD host names no tile; the Level Zero hierarchy cannot change that.
    units, devices = _units(name, vendor)
    with pytest.raises(SelectionError) as raised:
        select(GpuRequest(GpuMode.EXPLICIT, ids=("1.0",)), units, devices)
    message = raised.value.cli_message()
    assert "ZE_FLAT_DEVICE_HIERARCHY" not in message and "COMPOSITE" not in message
    assert message.startswith(f"--gpus 1.0: {devices[1].label()} has no tiles")
    assert "device=1" in message


def test_mig_uuid_names_that_instance_of_its_gpu() -> None:
    devices = load_inventory("a100-mig.json").of(Vendor.NVIDIA)
    units = [Unit(devices[0], mig=m) for m in devices[0].mig_devices] + [Unit(devices[1])]
    mig = devices[0].mig_devices[1]
    chosen = select(GpuRequest(GpuMode.EXPLICIT, ids=(mig.uuid,)), units, devices)
    assert chosen.units == (Unit(devices[0], mig=mig),)


def test_none_selects_nothing() -> None:
    units, devices = _units("2x-h200.json")
    assert select(GpuRequest(GpuMode.NONE), units, devices).units == ()
