"""llama.cpp's llama-server: pinned per build, health-checked, supervised (``xpulaunch llama``).

Pure parts: :mod:`.devices` (``--list-devices``), :mod:`.vulkan` (Vulkan names),
:mod:`.args` (command lines) and :mod:`.plan`. Side effects: :mod:`.binary` (asks the
binary), :mod:`.health` (HTTP, ports), :mod:`.server` (the supervised replicas) and
:mod:`.serve` (the two calls most users want).

Names are imported on first use, so that a dry run never loads the supervisor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch._lazy import exports

if TYPE_CHECKING:
    from xpulaunch.llamacpp.devices import LlamaBackend, LlamaDevice, parse_list_devices
    from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, Replica, make_llama_plan
    from xpulaunch.llamacpp.serve import plan_llama, serve_llama
    from xpulaunch.llamacpp.server import HealthOptions, LlamaServer

_WHERE = {
    "HealthOptions": "server",
    "LlamaBackend": "devices",
    "LlamaDevice": "devices",
    "LlamaPlan": "plan",
    "LlamaRequest": "plan",
    "LlamaServer": "server",
    "Replica": "plan",
    "make_llama_plan": "plan",
    "parse_list_devices": "devices",
    "plan_llama": "serve",
    "serve_llama": "serve",
}
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

_MODULE_OF = {name: f"{__name__}.{module}" for name, module in _WHERE.items()}

__getattr__, __dir__ = exports(globals(), _MODULE_OF)
