"""nvidia-smi CSV and procfs parsers, fed the verbatim outputs of reference sections 4.3/4.5."""

from __future__ import annotations

import pytest
from probe_fakes import FIXTURES

from xpulaunch.probing.parsers.nvidia import QUERY_FIELDS, parse_proc_information, parse_query_gpu

MIB = 1024 * 1024


def fixture(name: str) -> str:
    return (FIXTURES / "nvidia" / name).read_text()


def test_header_with_units_names_the_columns() -> None:
    gpus = parse_query_gpu(fixture("smi-query-8col.csv"))
    assert [g.index for g in gpus] == [0, 1]
    assert [g.pci_bus_id for g in gpus] == ["0000:00:06.0", "0000:00:07.0"]
    assert gpus[1].uuid == "GPU-e436550d-4102-c58c-de2e-988dc6aaa541"
    assert gpus[0].name == "NVIDIA H200"
    assert gpus[0].memory_total_bytes == 143771 * MIB
    # memory.used excludes the driver reserve: 0 on an idle GPU, although total - free = 615 MiB
    assert gpus[0].memory_used_bytes == 0
    assert gpus[0].utilization_percent == 0.0


def test_noheader_nounits_needs_the_queried_fields() -> None:
    fields = ["index", "uuid", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu"]
    gpus = parse_query_gpu(fixture("smi-query-noheader-nounits.csv"), fields)
    assert [(g.index, g.pci_bus_id, g.memory_total_bytes) for g in gpus] == [
        (0, "0000:00:06.0", 143771 * MIB),
        (1, "0000:00:07.0", 143771 * MIB),
    ]
    assert gpus[0].name is None


def test_reserved_column_and_enabled_flags_do_not_shift_values() -> None:
    fields = ["index", "uuid", "pci.bus_id", "memory.total", "memory.used", "memory.reserved",
              "utilization.gpu", "persistence_mode", "mig.mode.current"]  # fmt: skip
    (gpu,) = parse_query_gpu(fixture("smi-query-reserved-h100.csv"), fields)
    assert gpu.memory_total_bytes == 81559 * MIB
    assert gpu.memory_used_bytes == 0
    assert gpu.extra == {"mig_mode": "Disabled"}


def test_under_load_values() -> None:
    fields = ["index", "memory.used", "memory.free", "utilization.gpu"]
    gpus = parse_query_gpu(fixture("smi-query-under-load.csv"), fields)
    assert [(g.index, g.memory_used_bytes, g.utilization_percent) for g in gpus] == [
        (0, 527 * MIB, 3.0),
        (1, 4623 * MIB, 0.0),
    ]


@pytest.mark.parametrize("cell", ["[N/A]", "[Not Supported]", "N/A", "", "[Unknown Error]"])
def test_sentinel_cells_are_unknown_not_zero(cell: str) -> None:
    uuid = "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04"
    line = f"0, {uuid}, 00000000:00:06.0, 143771, {cell}, {cell}, {cell}, NVIDIA H200"
    (gpu,) = parse_query_gpu(line, QUERY_FIELDS)
    assert gpu.memory_total_bytes == 143771 * MIB
    assert gpu.memory_used_bytes is None
    assert gpu.utilization_percent is None
    assert gpu.name == "NVIDIA H200"


def test_name_is_queried_last_and_may_contain_commas() -> None:
    line = "0, GPU-x, 00000000:01:00.0, 24564, 1, 5, Disabled, NVIDIA GeForce RTX 4090, Founders"
    (gpu,) = parse_query_gpu(line, QUERY_FIELDS)
    assert gpu.name == "NVIDIA GeForce RTX 4090, Founders"
    assert gpu.utilization_percent == 5.0


def test_no_devices_text_is_not_a_row() -> None:
    assert parse_query_gpu(fixture("smi-no-devices.txt"), QUERY_FIELDS) == []


def test_proc_information_gives_identity() -> None:
    gpu = parse_proc_information(fixture("proc-information-h100.txt"))
    assert gpu.pci_bus_id == "0000:00:06.0"
    assert gpu.uuid == "GPU-9755e7df-acbd-f438-f3da-904cad73240b"
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.extra == {"device_minor": 0}
    assert gpu.memory_total_bytes is None
