"""How GPUs are linked, as the probe reads it: sysfs bridge paths, NVML's NVLinks and PCIe
ancestors, ``nvidia-smi topo -m``, the KFD topology's XGMI io_links, ``xpu-smi topology -m``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kfd_fakes import kfd_node
from probe_fakes import NVIDIA_SMI, FakeMachine, FakeNvml, mi300x_host, probe_fake, write_tool

from xpulaunch.core.topology import matrix
from xpulaunch.probing.host import probe_host
from xpulaunch.probing.parsers.common import ParseError
from xpulaunch.probing.parsers.kfd import gpu_node, parse_properties, xgmi_links
from xpulaunch.probing.parsers.topology import (
    parse_nvidia_topo,
    parse_xpu_smi_topology,
    pci_path,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "probe"


def test_pci_path_names_the_host_bridge_and_every_bridge_above() -> None:
    resolved = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0/0000:18:00.0"
    assert pci_path(resolved) == ["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:02.0"]
    assert pci_path("/sys/devices/pci0000:00/0000:00:06.0") == ["pci0000:00"]  # a VM
    hyper_v = "/sys/devices/LNXSYSTM:00/VMBUS:00/7c1e-4a2b/pci7c1e:00/7c1e:00:00.0"
    assert pci_path(hyper_v) == ["pci7c1e:00"]
    assert pci_path("/sys/devices/platform/soc/gpu") is None


def test_nvidia_smi_topo_of_an_nvswitch_board() -> None:
    topology = parse_nvidia_topo((FIXTURES / "nvidia" / "topo-m-8x-h100.txt").read_text())
    assert topology.cells[(0, 7)] == "NV18" and topology.cells[(3, 3)] == "X"
    assert len(topology.cells) == 64  # the NIC columns and rows are not GPUs
    assert topology.cpu_affinity[4] == "56-111,168-223"
    assert topology.numa_affinity == {i: i // 4 for i in range(8)}


def test_nvidia_smi_topo_of_an_older_driver_with_bridges() -> None:
    topology = parse_nvidia_topo((FIXTURES / "nvidia" / "topo-m-4x-nvlink-pairs.txt").read_text())
    assert topology.cells[(0, 1)] == "NV4" and topology.cells[(1, 2)] == "SYS"
    assert topology.numa_affinity[3] == 1
    with pytest.raises(ParseError, match="no header row"):
        parse_nvidia_topo("No devices were found\n")


def test_xpu_smi_topology_matrix_of_two_max1550() -> None:
    text = (FIXTURES / "intel" / "xpu-smi-topology-m-2x-max1550.txt").read_text()
    topology = parse_xpu_smi_topology(text)
    assert topology.cells[((0, 0), (0, 1))] == "MDF"
    assert topology.cells[((0, 0), (1, 0))] == "XL 1,2"
    assert topology.cells[((0, 0), (1, 1))] == "XL*"
    assert topology.cpu_affinity[(1, 1)] == "56-111,168-223"
    assert topology.xe_link_ports() == {(0, 1): 4}  # two ports each from both tiles of card 0
    with pytest.raises(ParseError, match="CPU Affinity"):
        parse_xpu_smi_topology("Error: Level Zero Initialization Error\n")


def test_gpus_behind_one_pcie_switch_are_pix(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    switch = "pci0000:15/0000:15:01.0/0000:16:00.0"
    for i, (bdf, port) in enumerate(
        (("0000:18:00.0", "0000:17:00.0"), ("0000:19:00.0", "0000:17:01.0"))
    ):
        m.pci(
            bdf,
            vendor=0x10DE,
            device=0x26B9,
            cls=0x030200,
            driver="nvidia",
            attrs={"numa_node": "0\n"},
            under=f"{switch}/{port}",
        )
        m.nvidia_proc(
            bdf,
            f"Model: \t\t NVIDIA L40S\nGPU UUID: \t GPU-{i:08x}-1111-2222-3333-444444444444\n"
            f"Bus Location: \t {bdf}\nDevice Minor: \t {i}\n",
        )
    inv = probe_fake(m)
    assert inv.devices[1].extra["pci_path"] == [
        "pci0000:15",
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:01.0",
    ]
    assert matrix(inv.devices)[1][1:3] == ["X", "PIX"]


def _nvml_gpus(**per_gpu: Any) -> list[dict[str, Any]]:
    return [
        {
            "uuid": f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd",
            "bus": f"00000000:{bus}:00.0",
            "name": "NVIDIA H100 80GB HBM3",
            "total": 85520809984,
            "used_v1": 500 << 20,
            "used_v2": 0,
            "util": 0,
            "mig": None,
            **per_gpu,
        }
        for i, bus in enumerate(("18", "2A"))
    ]


def _nvml_probe(tmp_path: Path, nvml: FakeNvml, **kwargs: Any) -> Any:
    m = FakeMachine(tmp_path)
    for gpu in nvml.gpus:
        m.pci(gpu["bus"][4:].lower(), vendor=0x10DE, device=0x2330, cls=0x030200, driver="nvidia")
    return probe_host(
        sys_root=m.sys,
        proc_root=m.proc,
        env={"PATH": ""},
        nvml_module=nvml,
        use_pyzes=False,
        **kwargs,
    )


def test_nvml_nvlinks_into_nvswitches_make_one_group(tmp_path: Path) -> None:
    switches = [("00000000:05:00.0", 2)] * 5 + [("00000000:06:00.0", 2)] * 4
    gpus = _nvml_gpus(nvlinks=switches)
    gpus[0]["ancestors"] = {gpus[1]["bus"]: 40}  # NVML_TOPOLOGY_NODE
    inv = _nvml_probe(tmp_path, FakeNvml(gpus))
    assert inv.problems == ()
    assert inv.devices[0].extra["links"] == [
        {"kind": "nvlink", "peer": "0000:05:00.0", "count": 5, "peer_type": "switch"},
        {"kind": "nvlink", "peer": "0000:06:00.0", "count": 4, "peer_type": "switch"},
    ]
    assert inv.devices[1].extra["pcie"] == {"0000:18:00.0": "NODE"}
    assert matrix(inv.devices)[1][1:3] == ["X", "NV9"]


def test_nvml_direct_links_and_no_topology_read(tmp_path: Path) -> None:
    gpus = _nvml_gpus()
    gpus[0]["nvlinks"] = [(gpus[1]["bus"], 0)] * 4
    gpus[1]["nvlinks"] = [(gpus[0]["bus"], 0)] * 4
    inv = _nvml_probe(tmp_path, FakeNvml(gpus))
    assert inv.devices[1].extra["links"] == [
        {"kind": "nvlink", "peer": "0000:18:00.0", "count": 4, "peer_type": "gpu"}
    ]
    nvml = FakeNvml(gpus)
    bare = _nvml_probe(tmp_path / "again", nvml, read_topology=False)
    assert "links" not in bare.devices[0].extra
    assert "nvlink state" not in nvml.calls and "common ancestor" not in nvml.calls


def test_nvidia_smi_topo_fills_links_where_nvml_is_missing(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path / "m")
    rows = []
    for i, bus in enumerate(("18", "2a", "3a", "5d")):
        bdf = f"0000:{bus}:00.0"
        m.pci(bdf, vendor=0x10DE, device=0x2230, cls=0x030200, driver="nvidia")
        rows.append(
            {
                "index": i,
                "uuid": f"GPU-{i:08x}-6000-4000-8000-a6000a6000a6",
                "pci.bus_id": "0000" + bdf.upper(),
                "name": "NVIDIA RTX A6000",
                "memory.total": 49140,
                "memory.used": 0,
                "memory.free": 48600,
                "memory.reserved": 540,
                "utilization.gpu": 0,
                "mig.mode.current": "[N/A]",
            }
        )
    bin_dir = tmp_path / "bin"
    topo = (FIXTURES / "nvidia" / "topo-m-4x-nvlink-pairs.txt").read_text()
    write_tool(bin_dir, "nvidia-smi", NVIDIA_SMI, gpus=rows, topo=topo)
    inv = probe_fake(m, bin_dir)
    assert [d.extra["links"] for d in inv.devices][2] == [
        {"kind": "nvlink", "peer": "0000:5d:00.0", "count": 4, "peer_type": "gpu"}
    ]
    assert inv.devices[0].extra["pcie"] == {"0000:3a:00.0": "SYS", "0000:5d:00.0": "SYS"}
    assert [row[1:5] for row in matrix(inv.devices)[1:3]] == [
        ["X", "NV4", "SYS", "SYS"],
        ["NV4", "X", "SYS", "SYS"],
    ]


IO_LINK = (
    "type {kind}\nversion_major 0\nversion_minor 0\nnode_from {src}\nnode_to {dst}\n"
    "weight {weight}\nmin_latency 0\nmax_latency 0\nmin_bandwidth 50000\n"
    "max_bandwidth 50000\nrecommended_transfer_size 0\nrecommended_sdma_engine_id 0\n"
    "flags 1\n"
)


def _io_link(sys_root: Path, node: int, link: int, **values: int) -> None:
    path = sys_root / "class/kfd/kfd/topology/nodes" / str(node) / "io_links" / str(link)
    path.mkdir(parents=True)
    (path / "properties").write_text(IO_LINK.format(src=node, **values))


def test_kfd_xgmi_io_links_link_the_two_mi300x(tmp_path: Path) -> None:
    m = FakeMachine(tmp_path)
    mi300x_host(m)
    kfd_node(m.sys, 0)  # the CPU node
    for node, bus in ((1, 0x0C), (2, 0x22)):
        kfd_node(m.sys, node, simd=304, location_id=bus << 8, unique_id=0x4B2C1A9F0C1D2E30 + node)
        _io_link(m.sys, node, 0, kind=2, dst=0, weight=20)  # PCIe to the CPU: not a GPU link
        _io_link(m.sys, node, 1, kind=11, dst=3 - node, weight=15)
    inv = probe_fake(m)
    assert inv.devices[0].extra["links"] == [
        {"kind": "xgmi", "peer": "0000:22:00.0", "count": 1, "peer_type": "gpu", "weight": 15}
    ]
    assert matrix(inv.devices)[2][1:3] == ["XGMI", "X"]


def test_kfd_links_to_a_cpu_or_itself_are_not_gpu_links() -> None:
    link = parse_properties(IO_LINK.format(kind=11, src=1, dst=0, weight=15))
    node = gpu_node(1, {"simd_count": 304, "location_id": 0x0C00}, [], [link])
    assert node is not None and node.io_links == ((11, 0, 15),)
    assert xgmi_links([node]) == {}


def test_xpu_smi_1x_topology_gives_the_cards_their_xe_links(tmp_path: Path) -> None:
    from probe_fakes import MAX1550, XPU_SMI_V1, max1550_cards

    bin_dir = tmp_path / "bin"
    text = (FIXTURES / "intel" / "xpu-smi-topology-m-2x-max1550.txt").read_text()
    write_tool(bin_dir, "xpu-smi", XPU_SMI_V1, cards=max1550_cards(), interval_s=0.1, topology=text)
    m = FakeMachine(tmp_path / "m")
    for card in MAX1550:
        m.pci(
            card["bdf"],
            vendor=0x8086,
            device=0x0BD5,
            cls=0x038000,
            driver="i915",
            drm=(card["minor"],),
        )
    inv = probe_fake(m, bin_dir)
    assert inv.devices[0].extra["links"] == [
        {"kind": "xelink", "peer": MAX1550[1]["bdf"], "count": 4, "peer_type": "gpu"}
    ]
    assert matrix(inv.devices)[2][1:3] == ["XL4", "X"]
    assert all("topology" not in p.source for p in inv.problems)


def test_a_one_gpu_vm_reads_as_nvidia_smi_topo_shows_it(tmp_path: Path) -> None:
    """The lent H200 VM [run]: its GPU at /sys/devices/pci0000:00/0000:00:06.0, numa_node -1,
    local_cpulist 0-15, one NUMA node; nvidia-smi says NUMA affinity 0 all the same."""
    from xpulaunch.core.topology import host_node

    m = FakeMachine(tmp_path)
    bdf = "0000:00:06.0"
    m.pci(
        bdf,
        vendor=0x10DE,
        device=0x2335,
        cls=0x030200,
        driver="nvidia",
        attrs={"numa_node": "-1\n", "local_cpulist": "0-15\n"},
    )
    m.nvidia_proc(
        bdf,
        f"Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-a6026e70-2f8a-387f-486f-"
        f"d49cebe1fb04\nBus Location: \t {bdf}\nDevice Minor: \t 0\n",
    )
    node = m.sys / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-15\n")
    inv = probe_fake(m)
    assert inv.devices[0].extra["pci_path"] == ["pci0000:00"]
    smi = parse_nvidia_topo((FIXTURES / "nvidia" / "topo-m-1x-h200.txt").read_text())
    ours = matrix(inv.devices, only_node=host_node(inv))
    assert ours[1] == ["GPU0", "X", smi.cpu_affinity[0], str(smi.numa_affinity[0])]
    assert smi.cells == {(0, 0): "X"}


def test_a_probed_fixture_machine_plans_a_pair_under_one_switch() -> None:
    """From the PCI walk to the plan: the 8x H100 fixture machine (two GPUs a PCIe switch, no
    NVML there, so no NVLinks) gives two GPUs of one switch."""
    from xpulaunch.core.plan import LaunchRequest, make_plan

    machine = Path(__file__).parents[1] / "fixtures" / "sysfs" / "nvidia-8x-h100-2socket"
    inv = probe_host(
        sys_root=machine / "sys",
        proc_root=machine / "proc",
        env={"PATH": ""},
        use_nvml=False,
        use_pyzes=False,
    )
    assert matrix(inv.devices)[1][1:5] == ["X", "PIX", "NODE", "NODE"]
    request = LaunchRequest(argv=("true",), gpus="2", master_port=29555)
    held = {inv.devices[0].key: "pid 9 (python a.py)"}
    plan = make_plan(request, inv, {}, unavailable=held)
    assert [u.device.index for u in plan.devices] == [2, 3]
    assert "topology: the 2 chosen devices share one PCIe switch" in plan.notes
