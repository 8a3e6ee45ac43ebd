"""Faithful stand-ins for what cannot exist on this machine (GPU builds of llama-server)."""

from __future__ import annotations

# `llama-server --list-devices` of each build, in the format of common/arg.cpp
# (common_print_available_devices); names per reference 3.2-3.3, numbers constructed.
LISTINGS = {
    "cuda": "Available devices:\n"
    "  CUDA0: NVIDIA H200 (143156 MiB, 142000 MiB free)\n"
    "  CUDA1: NVIDIA H200 (143156 MiB, 142500 MiB free)\n",
    "sycl": "Available devices:\n"
    "  SYCL0: Intel(R) Data Center GPU Max 1550 (65536 MiB, 65000 MiB free)\n"
    "  SYCL1: Intel(R) Data Center GPU Max 1550 (65536 MiB, 65000 MiB free)\n"
    "  SYCL2: Intel(R) Data Center GPU Max 1550 (65536 MiB, 65000 MiB free)\n"
    "  SYCL3: Intel(R) Data Center GPU Max 1550 (65536 MiB, 65000 MiB free)\n",
    "rocm": "Available devices:\n"
    "  ROCm0: AMD Instinct MI300X (196592 MiB, 196000 MiB free)\n"
    "  ROCm1: AMD Instinct MI300X (196592 MiB, 196000 MiB free)\n"
    "  ROCm2: AMD Instinct MI300X (196592 MiB, 196000 MiB free)\n"
    "  ROCm3: AMD Instinct MI300X (196592 MiB, 196000 MiB free)\n",
    "vulkan": "Available devices:\n"
    "  Vulkan0: NVIDIA H200 (143771 MiB, 143000 MiB free)\n"
    "  Vulkan1: NVIDIA H200 (143771 MiB, 143000 MiB free)\n",
    "none": "Available devices:\n  (none)\n",
}
