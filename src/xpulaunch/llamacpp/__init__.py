"""llama.cpp's llama-server: pinned per build, health-checked, supervised (``xpulaunch llama``).

Pure parts: :mod:`.devices` (``--list-devices``), :mod:`.vulkan` (Vulkan names),
:mod:`.args` (command lines), :mod:`.fit` (a model's need, llama.cpp's ``--fit``),
:mod:`.placement` and :mod:`.plan`. Side effects: :mod:`.binary` (asks the binary),
:mod:`.estimate` (``llama-fit-params``, the GGUF header), :mod:`.health` (HTTP, ports),
:mod:`.server` (the supervised replicas), :mod:`.serve` (the two calls most users want) and
:mod:`.router` (several models behind one port, ``xpulaunch llama serve``).
"""

from __future__ import annotations

from xpulaunch.llamacpp.devices import LlamaBackend, LlamaDevice, parse_list_devices
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, Replica, make_llama_plan
from xpulaunch.llamacpp.serve import plan_llama, serve_llama
from xpulaunch.llamacpp.server import HealthOptions, LlamaServer

__all__ = [
    "HealthOptions",
    "LlamaBackend",
    "LlamaDevice",
    "LlamaPlan",
    "LlamaRequest",
    "LlamaServer",
    "Replica",
    "make_llama_plan",
    "parse_list_devices",
    "plan_llama",
    "serve_llama",
]
