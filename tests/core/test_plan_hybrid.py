"""Hosts with NVIDIA and Intel GPUs: ids name one vendor or are refused, and each child's
runtimes (CUDA and Level Zero, re-derived from the child's environment) see only its devices."""

from __future__ import annotations

import pytest

from helpers import load_inventory
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.selection import parse_gpus
from xpulaunch.core.visibility import parent_visible
from xpulaunch.errors import SelectionError
from xpulaunch.model import Backend, Plan, Unit, Vendor

ARGV = ("/usr/bin/python3", "train.py")
HOST = load_inventory("hybrid-4090-arc.json")
(RTX,) = HOST.of(Vendor.NVIDIA)
(ARC,) = HOST.of(Vendor.INTEL)


def plan(gpus: str, parent: dict[str, str] | None = None, **request: object) -> Plan:
    req = LaunchRequest(argv=ARGV, gpus=gpus, **request)  # type: ignore[arg-type]
    return make_plan(req, HOST, parent or {})


def child_sees(result: Plan, parent: dict[str, str]) -> dict[Vendor, tuple[Unit, ...]]:
    child = result.workers[0].child_env(parent)
    return {v: parent_visible(HOST, v, child, hierarchy=None).units for v in Vendor}


def test_a_bare_index_both_vendors_have_is_refused_with_the_candidates() -> None:
    with pytest.raises(SelectionError, match=r"ambiguous.*nvidia:0 \(NVIDIA.*intel:0 \(Intel"):
        plan("device=0")


@pytest.mark.parametrize(
    ("gpus", "vendor", "device"),
    [("intel:0", Vendor.INTEL, ARC), ("nvidia:0", Vendor.NVIDIA, RTX),
     ("device=INTEL:0", Vendor.INTEL, ARC), (ARC.pci_bus_id or "", Vendor.INTEL, ARC)],
)  # fmt: skip
def test_a_qualified_id_picks_its_vendor_and_the_child_sees_only_it(
    gpus: str, vendor: Vendor, device: object
) -> None:
    result = plan(gpus)
    assert [u.device for u in result.devices] == [device]
    seen = child_sees(result, {})
    assert seen == {v: (result.devices if v is vendor else ()) for v in Vendor}


def test_the_parent_hiding_one_vendor_makes_a_bare_index_unambiguous() -> None:
    parent = {"CUDA_VISIBLE_DEVICES": ""}
    result = plan("device=0", parent)
    assert result.backend is Backend.XPU and result.devices == (Unit(ARC),)
    assert child_sees(result, parent)[Vendor.INTEL] == (Unit(ARC),)


def test_backend_flag_settles_a_bare_index() -> None:
    assert plan("device=0", backend="xpu").devices == (Unit(ARC),)


def test_ids_of_two_vendors_or_a_prefix_against_the_backend_are_refused() -> None:
    with pytest.raises(SelectionError, match="one vendor's GPUs"):
        plan("intel:0,nvidia:0")
    with pytest.raises(SelectionError, match="one vendor's GPUs"):
        plan("intel:0", backend="cuda")
    with pytest.raises(SelectionError, match="AMD GPUs are not on this host"):
        plan("amd:0")


def test_a_count_too_large_names_the_other_vendors_gpus() -> None:
    with pytest.raises(SelectionError) as raised:
        plan("2")
    text = str(raised.value)
    assert "only 1 free device(s) of 1 visible" in text
    assert "no accelerator is visible" not in text
    assert "1 Intel unit(s) are visible too (--backend xpu)" in text


def test_an_address_of_the_other_vendors_gpu_names_it() -> None:
    # the Arc's PCI address with --backend cuda: it used to say only "no such device"
    with pytest.raises(SelectionError) as raised:
        plan(ARC.pci_bus_id or "", backend="cuda")
    assert str(raised.value) == (
        f"gpus='{ARC.pci_bus_id}': no such device; devices here: 0 ({RTX.pci_bus_id}); "
        "1 Intel unit(s) are visible too (--backend xpu), but one job runs on one vendor's GPUs"
    )


def test_every_hiding_variable_the_plan_writes_is_explained() -> None:
    nvidia = plan("nvidia:0")
    assert nvidia.workers[0].env["ZE_AFFINITY_MASK"] == "999"
    assert any(n.startswith("ZE_AFFINITY_MASK=999 hides every Intel GPU") for n in nvidia.notes)
    intel = plan("intel:0")
    assert intel.workers[0].env["CUDA_VISIBLE_DEVICES"] == ""
    assert any(n.startswith('CUDA_VISIBLE_DEVICES="" hides') for n in intel.notes)
    cpu = plan("none")
    assert sum("hides every" in n for n in cpu.notes) == 2


@pytest.mark.parametrize(
    "text", ["nvidia:0", "intel:0.1", "amd:GPU-0123456789abcdef", "nvidia:MIG-aaaaaaaa"]
)
def test_qualified_ids_parse_as_explicit_ids(text: str) -> None:
    assert parse_gpus(text).ids == (text,)
