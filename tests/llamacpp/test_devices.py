"""``llama-server --list-devices`` parsing and build detection (pure)."""

from __future__ import annotations

import pytest
from llama_fakes import LISTINGS

from xpulaunch.errors import ProbeError, UsageError
from xpulaunch.llamacpp.devices import (
    MIB,
    LlamaBackend,
    detect_build,
    device_names,
    parse_list_devices,
    parse_llama_backend,
)
from xpulaunch.model import Backend


@pytest.mark.parametrize(
    ("kind", "build", "names"),
    [
        ("cuda", LlamaBackend.CUDA, ["CUDA0", "CUDA1"]),
        ("sycl", LlamaBackend.SYCL, ["SYCL0", "SYCL1", "SYCL2", "SYCL3"]),
        ("rocm", LlamaBackend.ROCM, ["ROCm0", "ROCm1", "ROCm2", "ROCm3"]),
        ("vulkan", LlamaBackend.VULKAN, ["Vulkan0", "Vulkan1"]),
    ],
)
def test_each_build_is_recognised(kind: str, build: LlamaBackend, names: list[str]) -> None:
    listing = parse_list_devices(LISTINGS[kind])
    assert [d.name for d in listing.devices] == names
    assert all(d.backend is build for d in listing.devices)
    assert listing.builds == (build,)
    assert detect_build(listing, None)[0] is build
    assert listing.ignored == ()


def test_fields_of_a_line_keep_parentheses_in_the_description() -> None:
    listing = parse_list_devices(LISTINGS["sycl"])
    first = listing.devices[0]
    assert first.description == "Intel(R) Data Center GPU Max 1550"
    assert first.memory_total_bytes == 65536 * MIB
    assert first.memory_free_bytes == 65000 * MIB


@pytest.mark.parametrize("text", [LISTINGS["none"], "Available devices:\n", "Available devices:"])
def test_no_gpu_device_means_a_cpu_build(text: str) -> None:
    listing = parse_list_devices(text)
    assert listing.devices == ()
    build, notes = detect_build(listing, None)
    assert build is LlamaBackend.CPU
    assert "CPU build" in notes[0]


def test_log_lines_before_the_header_are_skipped_and_odd_lines_kept() -> None:
    text = (
        "ggml_cuda_init: found 1 CUDA devices:\n"
        "Available devices:\n"
        "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80000 MiB free)\n"
        "  something unexpected\n"
    )
    listing = parse_list_devices(text)
    assert [d.name for d in listing.devices] == ["CUDA0"]
    assert listing.ignored == ("something unexpected",)


def test_output_without_the_header_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="Available devices"):
        parse_list_devices("usage: llama-server [options]\n")


def test_devices_of_kinds_we_do_not_pin_leave_a_cpu_build() -> None:
    listing = parse_list_devices("Available devices:\n  BLAS: OpenBLAS (0 MiB, 0 MiB free)\n")
    assert listing.devices[0].backend is None
    build, notes = detect_build(listing, None)
    assert build is LlamaBackend.CPU and "BLAS" in notes[0]


MULTI = LISTINGS["cuda"] + "  Vulkan0: NVIDIA H200 (143771 MiB, 143000 MiB free)\n"


@pytest.mark.parametrize(
    ("wanted", "build"),
    [
        (None, LlamaBackend.CUDA),
        (Backend.CUDA, LlamaBackend.CUDA),
        (Backend.XPU, LlamaBackend.VULKAN),
    ],
)
def test_multi_backend_build_prefers_native_or_follows_backend(
    wanted: Backend | None, build: LlamaBackend
) -> None:
    listing = parse_list_devices(MULTI)
    assert listing.builds == (LlamaBackend.CUDA, LlamaBackend.VULKAN)
    assert detect_build(listing, wanted)[0] is build


def test_multi_backend_build_without_the_wanted_backend_is_an_error() -> None:
    arc = "  SYCL0: Intel(R) Arc(TM) A770 Graphics (16256 MiB, 15800 MiB free)\n"
    listing = parse_list_devices(LISTINGS["cuda"] + arc)
    with pytest.raises(UsageError) as raised:
        detect_build(listing, Backend.ROCM)
    assert raised.value.message.startswith("backend='rocm': llama-server has only CUDA, SYCL")
    assert raised.value.cli_message().startswith("--backend rocm: llama-server has only CUDA")


def test_masked_children_count_their_devices_from_zero() -> None:
    assert device_names(LlamaBackend.ROCM, 2) == ("ROCm0", "ROCm1")
    with pytest.raises(ValueError, match="vulkan"):
        device_names(LlamaBackend.VULKAN, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("auto", None), (None, None), ("CUDA", LlamaBackend.CUDA), (" vulkan ", LlamaBackend.VULKAN)],
)
def test_llama_backend_option(text: str | None, expected: LlamaBackend | None) -> None:
    assert parse_llama_backend(text) is expected


def test_bad_llama_backend_names_the_valid_ones() -> None:
    with pytest.raises(UsageError, match="auto, cuda, sycl, vulkan, rocm, cpu"):
        parse_llama_backend("metal")


def test_plan_backend_mapping() -> None:
    assert LlamaBackend.CUDA.plan_backend is Backend.CUDA
    assert LlamaBackend.SYCL.plan_backend is Backend.XPU
    assert LlamaBackend.ROCM.plan_backend is Backend.ROCM
    assert LlamaBackend.CPU.plan_backend is Backend.CPU
    assert LlamaBackend.VULKAN.plan_backend is None
