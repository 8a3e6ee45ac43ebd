"""xpu-smi (1.x, 2.x), torch.xpu helper, rocm-smi and amd-smi parsers (sections 2.5, 5.3, 5.4)."""

from __future__ import annotations

import pytest
from probe_fakes import FIXTURES

from xpulaunch.probing.parsers.amd import parse_amd_smi, parse_rocm_smi_json
from xpulaunch.probing.parsers.common import ParseError
from xpulaunch.probing.parsers.intel import (
    QUERY_V2_FIELDS,
    is_discrete,
    parse_discovery_detail_json,
    parse_discovery_json,
    parse_dump_csv,
    parse_list_gpus_v2,
    parse_query_gpu_v2,
    parse_torch_xpu_json,
)

MIB = 1024 * 1024


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_dump_1_3_two_cards_by_position() -> None:
    rows = parse_dump_csv(fixture("intel/xpu-smi-1.3-dump-2card.txt"), (0, 5, 18))
    assert rows == {0: {0: 0.0, 5: 0.04, 18: 26.31}, 1: {0: 97.5, 5: 61.23, 18: 40102.55}}


def test_dump_header_text_does_not_matter() -> None:
    """xpu-smi 1.2 and 1.3 name metric 0 differently; columns are read by position."""
    sample = fixture("intel/xpu-smi-1.2-dump-sample.txt")
    renamed = sample.replace("GPU Utilization (%)", "Average % utilization of all GPU Engines")
    assert parse_dump_csv(sample, (0, 1, 2)) == parse_dump_csv(renamed, (0, 1, 2))
    assert parse_dump_csv(sample, (0, 1, 2))[0] == {0: 0.0, 1: 14.59, 2: 0.0}


def test_dump_na_cells_are_unknown() -> None:
    text = "Timestamp, DeviceId, A, B, C\n10:02:03.000,    0,  N/A, 0.04,  N/A\n"
    assert parse_dump_csv(text, (0, 5, 18)) == {0: {0: None, 5: 0.04, 18: None}}


def test_dump_with_wrong_column_count_is_an_error_not_a_guess() -> None:
    with pytest.raises(ParseError, match="no data rows"):
        parse_dump_csv(fixture("intel/xpu-smi-1.3-dump-2card.txt"), (0, 18))


def test_dump_json_refusal_is_a_clear_error() -> None:
    with pytest.raises(ParseError, match="no JSON dump"):
        parse_dump_csv(fixture("intel/xpu-smi-1.x-dump-json-refusal.txt"))


def test_discovery_json_1_3() -> None:
    (card,) = parse_discovery_json(fixture("intel/xpu-smi-1.3-discovery.json"))
    assert card.device_id == 0
    obs = card.observation
    assert obs.pci_bus_id == "0000:29:00.0"
    assert obs.uuid == "00000000-0000-0029-0000-00000bd58086"
    assert obs.name == "Intel(R) Data Center GPU Max 1550"
    assert obs.integrated is False
    assert obs.extra == {"pci_device_id": "0x0bd5"}


@pytest.mark.parametrize(
    "name", ["intel/xpu-smi-1.x-discovery-error.json", "intel/xpu-smi-1.3-discovery.txt"]
)
def test_discovery_error_or_table_is_a_parse_error(name: str) -> None:
    with pytest.raises(ParseError, match="discovery -j"):
        parse_discovery_json(fixture(name))


def test_discovery_detail_strings_are_numbers() -> None:
    detail = parse_discovery_detail_json(fixture("intel/xpu-smi-1.3-discovery-detail.json"))
    assert detail.memory_physical_bytes == 137438953472
    assert detail.memory_free_bytes == 137411248128
    assert detail.tiles == 2


def test_query_gpu_v2_with_units_header_and_na() -> None:
    b580, uhd = parse_query_gpu_v2(fixture("intel/xpu-smi-2-query-gpu.csv"))
    assert b580.uuid == "00000000-0000-0003-0000-0000e20b8086"  # GPU- prefix dropped
    assert (b580.pci_bus_id, b580.memory_total_bytes, b580.memory_used_bytes) == (
        "0000:03:00.0", 12216 * MIB, 1183 * MIB,
    )  # fmt: skip
    assert b580.utilization_percent == 3.0
    assert (uhd.memory_total_bytes, uhd.memory_used_bytes) == (None, None)


def test_query_gpu_v2_noheader() -> None:
    text = "0, GPU-00000000-0000-0003-0000-0000e20b8086, 0000:03:00.0, 12216, 0, 0\n"
    (card,) = parse_query_gpu_v2(text, QUERY_V2_FIELDS)
    assert card.memory_used_bytes == 0


def test_list_gpus_v2_names_by_bare_uuid() -> None:
    names = parse_list_gpus_v2(fixture("intel/xpu-smi-2-list-gpus.txt"))
    assert names["00000000-0000-0003-0000-0000e20b8086"] == "Intel(R) Arc(TM) B580 Graphics"
    assert len(names) == 2


def test_torch_helper_output() -> None:
    out = (
        "some warning from a runtime\n"
        '{"devices": [{"index": 0, "name": "Intel(R) Arc(TM) B580 Graphics", '
        '"total_memory": 12168933376, "uuid": null, "is_integrated": false, '
        '"free_memory": 11811160064}, {"index": 1, "name": "Intel(R) UHD Graphics 770", '
        '"total_memory": 30000000000, "uuid": null, "is_integrated": true, '
        '"free_error": "The device (Intel(R) UHD Graphics 770) doesn\'t support querying the '
        'available free memory"}]}\n'
    )
    b580, uhd = parse_torch_xpu_json(out)
    assert (b580.total_memory_bytes, b580.free_memory_bytes, b580.integrated) == (
        12168933376, 11811160064, False,
    )  # fmt: skip
    assert uhd.free_memory_bytes is None
    assert uhd.free_error is not None and "free memory" in uhd.free_error


def test_torch_helper_error() -> None:
    with pytest.raises(ParseError, match="torch is not importable"):
        parse_torch_xpu_json('{"error": "torch is not importable: No module named torch"}\n')


@pytest.mark.parametrize(
    ("device_id", "bus", "discrete"),
    [
        (0x0BD5, "0000:29:00.0", True),  # Max 1550
        (0xE20B, "0000:03:00.0", True),  # Arc B580
        (0x56A0, "0000:00:02.0", True),  # Arc A770 passed through to a VM slot 2: still discrete
        (0xA780, "0000:00:02.0", False),  # UHD 770
        (0x7D55, "0000:00:02.0", False),  # Meteor Lake iGPU
        (0x1234, "0000:05:00.0", True),  # unknown id off the iGPU slot: a newer card
    ],
)
def test_discrete_or_integrated(device_id: int, bus: str, discrete: bool) -> None:
    assert is_discrete(device_id, bus) is discrete


def test_rocm_smi_documented_line() -> None:
    (card,) = parse_rocm_smi_json(fixture("amd/rocm-smi-showmeminfo-vram.json"))
    assert (card.memory_total_bytes, card.memory_used_bytes) == (34342961152, 7028736)
    assert card.pci_bus_id is None  # no --showbus: the adapter must not join this by index
    assert card.extra == {"smi_index": "card0"}


def test_rocm_smi_after_a_warning_line_with_bus() -> None:
    a, b = parse_rocm_smi_json(fixture("amd/rocm-smi-mi300x.json"))
    assert (a.pci_bus_id, b.pci_bus_id) == ("0000:0c:00.0", "0000:22:00.0")  # upper-case in
    assert b.utilization_percent == 12.0


def test_amd_smi_list_and_metric_joined_on_gpu() -> None:
    a, b = parse_amd_smi(
        fixture("amd/amd-smi-list.json"), fixture("amd/amd-smi-metric-mem-usage.json")
    )
    assert a.pci_bus_id == "0000:0c:00.0"
    assert (a.memory_total_bytes, a.memory_used_bytes) == (196592 * MIB, 6 * MIB)
    assert (b.memory_total_bytes, b.memory_used_bytes) == (196592 * MIB, None)  # "N/A"


def test_amd_smi_list_without_metrics() -> None:
    a, _ = parse_amd_smi(fixture("amd/amd-smi-list.json"), None)
    assert a.uuid is None  # amd-smi's uuid is not ROCr's GPU-<16 hex>
    assert a.extra["amd_smi_uuid"] == "4bff74a1-0000-1000-80b2-e7f5d6a1c2b3"
    assert a.memory_total_bytes is None


def test_amd_smi_wrapped_list_is_unwrapped() -> None:
    wrapped = '{"gpu_data": ' + fixture("amd/amd-smi-list.json") + "}"
    assert len(parse_amd_smi(wrapped, None)) == 2
    # amd-smi >= 26: the list under "gpu_data", next to other keys
    with_more = '{"version": [], "gpu_data": ' + fixture("amd/amd-smi-list.json") + "}"
    assert len(parse_amd_smi(with_more, None)) == 2


def test_amd_smi_garbage_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="amd-smi list"):
        parse_amd_smi("amd-smi: command failed", None)
