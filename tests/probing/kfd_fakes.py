"""A fake KFD topology (``/sys/class/kfd/kfd/topology/nodes``) laid out as amdgpu writes it.

Node properties carry the keys and the ``name value`` format of kfd_topology.c
(``node_show``); the mem bank text is the CPX sample in fixtures/probe/amd. Values invented.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "probe"
CPX_BANK = (FIXTURES / "amd" / "kfd-node-mem_banks-cpx.txt").read_text().split("\n", 1)[1]
CPX_BANK_BYTES = 25767706624


def _properties(simd: int, location_id: int, domain: int, unique_id: int, minor: int) -> str:
    pairs = [
        ("cpu_cores_count", 0 if simd else 96), ("simd_count", simd), ("mem_banks_count", 1),
        ("caches_count", 0), ("io_links_count", 1), ("p2p_links_count", 0),
        ("cpu_core_id_base", 0), ("simd_id_base", 2147487744 if simd else 0),
        ("max_waves_per_simd", 8), ("lds_size_in_kb", 64), ("wave_front_size", 64),
        ("array_count", 4), ("gfx_target_version", 90402 if simd else 0),
        ("vendor_id", 4098 if simd else 0), ("device_id", 29857 if simd else 0),
        ("location_id", location_id), ("domain", domain),
        ("drm_render_minor", minor), ("hive_id", 0), ("num_sdma_engines", 2),
        ("unique_id", unique_id), ("num_xcc", 1 if simd else 0),
    ]  # fmt: skip
    return "".join(f"{name} {value}\n" for name, value in pairs)


def kfd_node(sys_root: Path, node: int, *, simd: int = 0, location_id: int = 0,
             domain: int = 0, unique_id: int = 0, minor: int = 0,
             bank: str | None = None) -> None:  # fmt: skip
    path = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(node)
    path.mkdir(parents=True)
    (path / "properties").write_text(_properties(simd, location_id, domain, unique_id, minor))
    (path / "gpu_id").write_text(f"{node * 1111 if simd else 0}\n")
    if bank is not None:
        (path / "mem_banks" / "0").mkdir(parents=True)
        (path / "mem_banks" / "0" / "properties").write_text(bank)


def partitioned_card(sys_root: Path, first_node: int, *, bus: int, partitions: int,
                     high_bits: bool, shared_uuid: bool, unique_base: int) -> None:  # fmt: skip
    """One card's GPU nodes: partition number in bits 31..28 of location_id (later kernels)
    or ORed into the function bits (the kernels that first supported GC 9.4.3)."""
    for part in range(partitions):
        low = bus << 8
        location = low | (part << 28) if high_bits else low | part
        unique = unique_base if shared_uuid else unique_base + part
        kfd_node(sys_root, first_node + part, simd=38, location_id=location, unique_id=unique,
                 minor=128 + first_node + part, bank=CPX_BANK)  # fmt: skip
