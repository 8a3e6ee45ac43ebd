"""llama.cpp's llama-server: pinned per build, health-checked, supervised (``xpulaunch llama``).

Pure parts: :mod:`.devices` (``--list-devices``), :mod:`.vulkan` (Vulkan names),
:mod:`.args` (command lines), :mod:`.fit` (a model's need, llama.cpp's ``--fit``),
:mod:`.placement` and :mod:`.plan`. Side effects: :mod:`.binary` (asks the binary),
:mod:`.estimate` (``llama-fit-params``, the GGUF header), :mod:`.health` (HTTP, ports),
:mod:`.server` (the supervised replicas), :mod:`.prepare` (what is asked before the lease
lock), :mod:`.launch` (the one orchestrator: lease, plan, start), :mod:`.serve` (the two calls
most users want) and :mod:`.router` (several models behind one port, ``xpulaunch llama
serve``).

The names below are imported from their modules on first use (PEP 562): importing the pure
``xpulaunch.llamacpp.args`` loads no server, supervisor or HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpulaunch._lazy import exports

if TYPE_CHECKING:
    from xpulaunch.llamacpp.devices import (
        LlamaBackend as LlamaBackend,
        LlamaDevice as LlamaDevice,
        parse_list_devices as parse_list_devices,
    )
    from xpulaunch.llamacpp.plan import (
        LlamaPlan as LlamaPlan,
        LlamaRequest as LlamaRequest,
        Replica as Replica,
        make_llama_plan as make_llama_plan,
    )
    from xpulaunch.llamacpp.serve import plan_llama as plan_llama, serve_llama as serve_llama
    from xpulaunch.llamacpp.server import HealthOptions as HealthOptions, LlamaServer as LlamaServer

_EXPORTS = {
    "xpulaunch.llamacpp.devices": ("LlamaBackend", "LlamaDevice", "parse_list_devices"),
    "xpulaunch.llamacpp.plan": ("LlamaPlan", "LlamaRequest", "Replica", "make_llama_plan"),
    "xpulaunch.llamacpp.serve": ("plan_llama", "serve_llama"),
    "xpulaunch.llamacpp.server": ("HealthOptions", "LlamaServer"),
}
__all__ = [name for names in _EXPORTS.values() for name in names]
__getattr__, __dir__ = exports(globals(), _EXPORTS)
