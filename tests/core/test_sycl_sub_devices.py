"""A parent's ONEAPI_DEVICE_SELECTOR with sub-device terms (``N.M``, ``N.*``, ``*.*``), read as
DPC++ reads it (intel/llvm platform_impl.cpp: the root devices are filtered first, then a root
named by a sub-device term is replaced by its sub-devices, or dropped when it has fewer than
two; unified-runtime's Level Zero adapter takes a root's sub-devices from
zeDeviceGetSubDevices, which compute-runtime answers with 0 under FLAT).

The expected sets below are written by hand from those rules for 2x Max 1550 (two tiles a
card); each plan's children are re-derived from their environments and checked against them.
"""

from __future__ import annotations

import pytest

from helpers import load_inventory
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import MaskError
from xpulaunch.model import Inventory, Plan, Unit, Vendor

MAX = load_inventory("2x-max1550.json")
CARD0, CARD1 = MAX.of(Vendor.INTEL)
ARC = load_inventory("arc-b580-igpu.json")
FLAT = {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
COMPOSITE = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}
COMBINED = {"ZE_FLAT_DEVICE_HIERARCHY": "COMBINED"}


def tiles(*pairs: tuple[int, int]) -> set[tuple[int, int]]:
    return set(pairs)


def seen(inventory: Inventory, env: dict[str, str]) -> set[tuple[int, int]]:
    """(card, tile) pairs behind the Intel units ``env`` leaves visible."""
    units = parent_visible(inventory, Vendor.INTEL, env, hierarchy=None).units
    return {(u.device.index, t) for u in units for t in _tiles_of(u)}


def _tiles_of(unit: Unit) -> range:
    return range(unit.device.tiles) if unit.tile is None else range(unit.tile, unit.tile + 1)


# What SYCL enumerates in the parent, as (card, tile) pairs, by DPC++'s rules.
SEEN_BY_DPCPP = [
    (FLAT, "level_zero:*,*.*", tiles((0, 0), (0, 1), (1, 0), (1, 1))),  # roots; *.* adds none
    (FLAT, "level_zero:0,1.*", tiles((0, 0))),  # root 1 has no sub-devices: dropped
    (FLAT, "level_zero:2;level_zero:3.0", tiles((1, 0))),
    (COMBINED, "level_zero:gpu,0.*", tiles((0, 0), (0, 1), (1, 0), (1, 1))),
    (COMPOSITE, "level_zero:*.*", tiles((0, 0), (0, 1), (1, 0), (1, 1))),  # every tile
    (COMPOSITE, "level_zero:1.*", tiles((1, 0), (1, 1))),
    (COMPOSITE, "level_zero:0.1", tiles((0, 1))),
    (COMPOSITE, "level_zero:0.1,1", tiles((0, 1), (1, 0), (1, 1))),
    (COMPOSITE, "level_zero:0.7,1", tiles((1, 0), (1, 1))),  # sub-device out of range
]


@pytest.mark.parametrize(("hierarchy", "selector", "expected"), SEEN_BY_DPCPP)
def test_the_parent_sees_what_dpcpp_enumerates(
    hierarchy: dict[str, str], selector: str, expected: set[tuple[int, int]]
) -> None:
    assert seen(MAX, {**hierarchy, "ONEAPI_DEVICE_SELECTOR": selector}) == expected


@pytest.mark.parametrize(("hierarchy", "selector", "expected"), SEEN_BY_DPCPP)
@pytest.mark.parametrize("isolate", [False, True])
def test_every_child_gets_only_tiles_the_parent_sees(
    hierarchy: dict[str, str], selector: str, expected: set[tuple[int, int]], isolate: bool
) -> None:
    parent = {**hierarchy, "ONEAPI_DEVICE_SELECTOR": selector}
    plan = make_plan(
        LaunchRequest(argv=("x",), gpus="all", nproc_per_node=None, isolate=isolate),
        MAX,
        parent,
    )
    handed_out: set[tuple[int, int]] = set()
    for worker in plan.workers:
        child = seen(MAX, worker.child_env(parent))
        assert child <= expected, (worker.env, child)
        handed_out |= child
    assert handed_out == expected


NOTHING = [
    (FLAT, "level_zero:*.*", "tile with no sub-devices"),
    ({}, "level_zero:*.*", "ZE_FLAT_DEVICE_HIERARCHY=FLAT"),  # the Max default
    (FLAT, "level_zero:0.*", "use 'level_zero:\\*'"),
    (FLAT, "level_zero:1.0", "ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE"),
    (COMBINED, "level_zero:*.*", "ZE_FLAT_DEVICE_HIERARCHY=COMBINED"),
    ({**COMPOSITE, "ZE_AFFINITY_MASK": "0.1"}, "level_zero:0.*", "two or more visible tiles"),
]


@pytest.mark.parametrize(("env", "selector", "why"), NOTHING)
def test_a_selector_that_keeps_no_gpu_is_refused_in_one_line(
    env: dict[str, str], selector: str, why: str
) -> None:
    parent = {**env, "ONEAPI_DEVICE_SELECTOR": selector}
    with pytest.raises(MaskError, match=why) as info:
        make_plan(LaunchRequest(argv=("x",), gpus="auto"), MAX, parent)
    assert "\n" not in info.value.message
    assert info.value.message.startswith(f"ONEAPI_DEVICE_SELECTOR={selector!r} selects no")


def test_single_tile_cards_have_no_sub_devices_under_composite() -> None:
    with pytest.raises(MaskError, match="two or more visible tiles"):
        seen(ARC, {"ONEAPI_DEVICE_SELECTOR": "level_zero:*.*"})


@pytest.mark.parametrize("selector", ["level_zero:*.1", "level_zero:gpu.*", "level_zero:0.*.*"])
def test_sub_device_terms_dpcpp_refuses_are_refused(selector: str) -> None:
    with pytest.raises(MaskError, match="ONEAPI_DEVICE_SELECTOR"):
        seen(MAX, {**COMPOSITE, "ONEAPI_DEVICE_SELECTOR": selector})


def test_a_plan_under_a_flat_star_dot_star_parent_is_refused_not_handed_a_tile() -> None:
    parent = {"ONEAPI_DEVICE_SELECTOR": "level_zero:*.*"}
    with pytest.raises(MaskError, match="selects no Intel GPU"):
        make_plan(LaunchRequest(argv=("x",), gpus="1"), MAX, parent)


def plan_of(parent: dict[str, str], gpus: str) -> Plan:
    return make_plan(LaunchRequest(argv=("x",), gpus=gpus), MAX, parent)


def test_composite_sub_device_selector_hands_out_the_named_tile_only() -> None:
    parent = {**COMPOSITE, "ONEAPI_DEVICE_SELECTOR": "level_zero:1.0"}
    plan = plan_of(parent, "auto")
    assert plan.devices == (Unit(CARD1, 0),)
    assert seen(MAX, plan.workers[0].child_env(parent)) == {(1, 0)}
