"""Choosing devices by how they are linked (core.topology, --topology): per fixture, per level."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

import xpulaunch
from helpers import inventory_path, load_inventory
from xpulaunch.core import inventory as inventory_doc
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.core.topology import Fabric, matrix, matrix_dict, pcie_cell
from xpulaunch.errors import SelectionError, UsageError
from xpulaunch.model import Plan

ARGV = ("python", "train.py")


def plan_for(name: str, unavailable: Mapping[str, str] | None = None, **request: object) -> Plan:
    req = LaunchRequest(argv=ARGV, master_port=29555, **request)  # type: ignore[arg-type]
    return make_plan(req, load_inventory(name), {}, unavailable=unavailable)


def chosen(plan: Plan) -> list[int]:
    return [u.device.index for u in plan.devices]


def topology_notes(plan: Plan) -> list[str]:
    return [n for n in plan.notes if n.startswith("topology:")]


def leased(name: str, *indices: int) -> dict[str, str]:
    devices = load_inventory(name).devices
    return {devices[i].key: f"pid {100 + i} (python other.py)" for i in indices}


# --- the NVSwitch box: every set shares the NVLink fabric, so nothing changes ---------------


def test_nvswitch_box_plans_as_before_and_says_the_set_shares_nvlink() -> None:
    plan = plan_for("8x-h100.json", gpus="4")  # nvidia 3 is busy
    assert chosen(plan) == [0, 1, 2, 4]  # the most free memory, as without topology
    assert topology_notes(plan) == ["topology: the 4 chosen devices share one NVLink group (NV18)"]


def test_nvswitch_matrix_is_nv18_everywhere() -> None:
    rows = matrix(load_inventory("8x-h100.json").devices)
    assert rows[0][:3] == ["", "GPU0", "GPU1"]
    assert rows[1][1:9] == ["X", *["NV18"] * 7]
    assert rows[1][9:] == ["0-55,112-167", "0"]
    assert rows[8][1:9] == [*["NV18"] * 7, "X"]


# --- a PCIe box with NVLink bridges in pairs on two sockets ----------------------------------

PAIRS = "8x-a6000-nvlink-pairs.json"


def test_pairs_box_two_gpus_are_a_bridged_pair() -> None:
    plan = plan_for(PAIRS, gpus="2")
    assert chosen(plan) == [0, 1]
    assert topology_notes(plan) == ["topology: the 2 chosen devices share one NVLink group (NV4)"]


def test_pairs_box_passes_over_a_gpu_whose_bridge_partner_is_taken() -> None:
    plan = plan_for(PAIRS, gpus="2", unavailable=leased(PAIRS, 1))
    assert chosen(plan) == [2, 3]
    notes = topology_notes(plan)
    assert notes[0] == "topology: the 2 chosen devices share one NVLink group (NV4)"
    assert notes[1].startswith("topology: passed over nvidia 0 (0000:18:00.0), ranked first")
    assert notes[1].endswith("the first 2 share NUMA node 0")


def test_pairs_box_four_gpus_stay_on_one_socket() -> None:
    assert chosen(plan_for(PAIRS, gpus="4")) == [0, 1, 2, 3]
    plan = plan_for(PAIRS, gpus="4", unavailable=leased(PAIRS, 1))
    assert chosen(plan) == [4, 5, 6, 7]
    assert "topology: the 4 chosen devices share NUMA node 1" in plan.notes


def test_pairs_box_ignore_takes_the_most_free_memory() -> None:
    plan = plan_for(PAIRS, gpus="2", unavailable=leased(PAIRS, 1), topology="ignore")
    assert chosen(plan) == [0, 2]
    assert topology_notes(plan) == []


def test_pairs_box_require_refuses_a_pair_without_a_bridge() -> None:
    held = leased(PAIRS, 1, 2, 4, 6)  # every pair broken: 0, 3, 5, 7 free
    assert chosen(plan_for(PAIRS, gpus="2", unavailable=held)) == [0, 3]  # prefer: NUMA node 0
    with pytest.raises(SelectionError) as caught:
        plan_for(PAIRS, gpus="2", unavailable=held, topology="require")
    message = str(caught.value)
    assert "\n" not in message
    assert "--topology require: no 2 free devices share one link group" in message


def test_pairs_box_nproc_auto_workers_get_a_pair() -> None:
    plan = plan_for(PAIRS, nproc_per_node=2, unavailable=leased(PAIRS, 0))
    assert chosen(plan) == [2, 3]
    assert any("left to other jobs" in n and "nvidia 1" in n for n in plan.notes)


# --- no GPU links: PCIe switches and NUMA nodes decide ---------------------------------------

PCIE = "8x-l40s-pcie.json"


def test_pcie_box_prefers_gpus_under_one_switch() -> None:
    assert chosen(plan_for(PCIE, gpus="2")) == [0, 1]
    plan = plan_for(PCIE, gpus="3")  # 0, 1, 2 share only NUMA node 0; 4-7 share a switch
    assert chosen(plan) == [4, 5, 6]
    assert "topology: the 3 chosen devices share one PCIe switch" in plan.notes


def test_pcie_box_falls_back_to_one_numa_node() -> None:
    plan = plan_for(PCIE, gpus="2", unavailable=leased(PCIE, 1, 4, 5, 6))
    assert chosen(plan) == [0, 2]
    assert topology_notes(plan) == ["topology: the 2 chosen devices share NUMA node 0"]


def test_pcie_box_with_nothing_shared_keeps_the_first() -> None:
    plan = plan_for(PCIE, gpus="5")
    assert chosen(plan) == [0, 1, 2, 3, 4]
    assert topology_notes(plan) == [
        "topology: the 5 chosen devices share no link, PCIe switch or NUMA node (only the "
        "CPUs' interconnect)"
    ]
    with pytest.raises(SelectionError, match="no 5 devices of this host share a link") as caught:
        plan_for(PCIE, gpus="5", topology="require")
    assert str(caught.value).endswith("ask for fewer devices, or use --topology prefer")


def test_pcie_cells_follow_nvidia_smi_legend() -> None:
    devices = load_inventory(PCIE).devices
    assert pcie_cell(devices[0], devices[1]) == "PIX"
    assert pcie_cell(devices[0], devices[2]) == "NODE"
    assert pcie_cell(devices[2], devices[4]) == "SYS"
    deeper = inventory_doc.from_dict(
        {
            "schema": "xpulaunch.inventory/1",
            "devices": [
                {
                    "vendor": "nvidia",
                    "index": 0,
                    "pci_path": [
                        "pci0000:00",
                        "0000:00:01.0",
                        "0000:01:00.0",
                        "0000:02:00.0",
                        "0000:03:00.0",
                        "0000:04:00.0",
                    ],
                },
                {
                    "vendor": "nvidia",
                    "index": 1,
                    "pci_path": ["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0"],
                },
                {
                    "vendor": "nvidia",
                    "index": 2,
                    "pci_path": ["pci0000:00", "0000:00:02.0"],
                    "pcie": {"nvidia:0": "PXB"},
                },
            ],
        }
    ).devices
    assert pcie_cell(deeper[0], deeper[1]) == "PXB"  # two switches deep
    assert pcie_cell(deeper[1], deeper[2]) == "PHB"  # only the host bridge shared
    assert pcie_cell(deeper[0], deeper[2]) == "PXB"  # what NVML said wins over the paths


# --- AMD: one XGMI hive ---------------------------------------------------------------------

HIVE = "8x-mi300x-xgmi.json"


def test_xgmi_hive_any_free_set_is_linked() -> None:
    plan = plan_for(HIVE, gpus="2", unavailable=leased(HIVE, 0, 2))
    assert chosen(plan) == [1, 3]
    assert topology_notes(plan) == ["topology: the 2 chosen devices share one XGMI hive (XGMI)"]
    rows = matrix(load_inventory(HIVE).devices)
    assert rows[1][1:9] == ["X", *["XGMI"] * 7]


# --- Intel: two Max 1550 with Xe Link (tiles are the units under FLAT) ----------------------

XELINK = "2x-max1550-xelink.json"


def test_xe_link_joins_tiles_of_two_cards() -> None:
    plan = plan_for(XELINK, gpus="3")
    assert [(u.device.index, u.tile) for u in plan.devices] == [(0, 0), (0, 1), (1, 0)]
    assert topology_notes(plan) == ["topology: the 3 chosen devices share one Xe Link group (XL4)"]
    rows = matrix(load_inventory(XELINK).devices)
    assert rows[1][1:3] == ["X", "XL4"]


def test_two_tiles_of_one_card_share_the_card() -> None:
    plan = plan_for(XELINK, gpus="2")
    assert [(u.device.index, u.tile) for u in plan.devices] == [(0, 0), (0, 1)]
    assert topology_notes(plan) == ["topology: the 2 chosen devices share one card"]


# --- old documents ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["2x-h200.json", "4x-mi300x.json", "2x-max1550.json"])
def test_documents_without_topology_plan_as_before_without_a_note(name: str) -> None:
    plan = plan_for(name, gpus="2")
    assert topology_notes(plan) == []
    ignored = plan_for(name, gpus="2", topology="ignore")
    assert plan.devices == ignored.devices
    with pytest.raises(SelectionError, match="says nothing of how these devices are linked"):
        plan_for(name, gpus="2", topology="require")


def test_matrix_of_a_document_without_topology_says_unknown() -> None:
    table = matrix_dict(load_inventory("2x-h200.json").devices)
    assert table["cells"] == [["X", "?"], ["?", "X"]]
    assert table["numa_affinity"] == [None, None]


def test_a_bad_topology_word_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="expected one of prefer, require, ignore"):
        plan_for(PAIRS, gpus="2", topology="best")


def test_links_of_a_foreign_shape_are_ignored() -> None:
    devices = inventory_doc.from_dict(
        {
            "schema": "xpulaunch.inventory/1",
            "devices": [
                {"vendor": "nvidia", "index": 0, "links": [{"kind": "ib"}, 7, "x"]},
                {"vendor": "nvidia", "index": 1, "links": "NV4"},
            ],
        }
    ).devices
    assert Fabric(devices).cell(devices[0], devices[1]) is None


# --- --isolate and collectives over IPC -------------------------------------------------------


def _ipc_warnings(plan: Plan) -> list[str]:
    return [n for n in plan.notes if n.startswith("warning: --isolate with")]


@pytest.mark.parametrize(
    ("name", "stack"),
    [
        ("8x-mi300x-xgmi.json", "AMD (RCCL over HIP IPC)"),
        ("2x-max1550-xelink.json", "Intel (oneCCL over Level Zero IPC)"),
    ],
)
def test_isolate_with_several_ranks_on_intel_or_amd_warns_about_ipc(name: str, stack: str) -> None:
    plan = plan_for(name, gpus="2", nproc_per_node=2, isolate=True)
    (warning,) = _ipc_warnings(plan)
    assert warning.startswith(f"warning: --isolate with 2 ranks on {stack}: each worker sees only")


def test_no_ipc_warning_without_isolate_one_rank_cuda_or_llama_replicas() -> None:
    assert _ipc_warnings(plan_for(HIVE, gpus="2", nproc_per_node=2)) == []
    assert _ipc_warnings(plan_for(HIVE, gpus="2", isolate=True)) == []  # one worker
    assert _ipc_warnings(plan_for("8x-h100.json", gpus="2", nproc_per_node=2, isolate=True)) == []
    replicas = plan_for(HIVE, gpus="2", nproc_per_node=2, isolate=True, distributed=False)
    assert _ipc_warnings(replicas) == []


def test_the_python_api_takes_topology() -> None:
    held = leased(PAIRS, 1)
    plan = xpulaunch.plan(
        ["true"], gpus="2", inventory=inventory_path(PAIRS), unavailable=held, master_port=29555
    )
    assert chosen(plan) == [2, 3]
    ignored = xpulaunch.plan(
        ["true"],
        gpus="2",
        inventory=inventory_path(PAIRS),
        unavailable=held,
        master_port=29555,
        topology="ignore",
    )
    assert chosen(ignored) == [0, 2]
    with pytest.raises(UsageError, match="expected one of prefer, require, ignore"):
        xpulaunch.plan(
            ["true"], gpus="2", inventory=inventory_path(PAIRS), topology="near", master_port=29555
        )
