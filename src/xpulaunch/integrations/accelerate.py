"""Device maps through accelerate, for one process that spans the devices xpulaunch gave it.

xpulaunch plans the map (``XPULAUNCH_DEVICE_MAP``: sequential, balanced or balanced_low_0)
and per-device budgets from what the probe saw free (``XPULAUNCH_MAX_MEMORY``, 10% headroom
kept, as accelerate's ``get_balanced_memory`` does). One call turns them into what
accelerate and transformers take::

    from xpulaunch.integrations.accelerate import from_pretrained_kwargs
    model = AutoModelForCausalLM.from_pretrained("my-model", **from_pretrained_kwargs())

    from xpulaunch.integrations.accelerate import dispatch
    model = dispatch(MyModel())              # infer_auto_device_map + dispatch_model

``max_memory=`` overrides a device's budget; a budget above what the probe saw free on that
device, or for a device this process was not given, is an error. accelerate is imported only
by :func:`infer_device_map` and :func:`dispatch`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from xpulaunch.core.devicemap import fitted_budgets, parse_max_memory
from xpulaunch.errors import UsageError
from xpulaunch.model import DeviceMap

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["budgets", "device_map", "dispatch", "from_pretrained_kwargs", "infer_device_map"]


def device_map(env: Mapping[str, str] | None = None) -> DeviceMap | None:
    """The planned map; None when the process runs on the CPU. A worker given devices but no
    map (the workers of torch's agent under c10d share one environment) is an error: a
    silent ``"cpu"`` would load the model where nobody asked."""
    env = _launched_env(env)
    value = env.get("XPULAUNCH_DEVICE_MAP")
    if not value and env.get("XPULAUNCH_DEVICES"):
        raise UsageError(
            "this worker has devices but no device map (several workers under --rdzv-backend "
            "c10d): place the model on the device its LOCAL_RANK picks, e.g. "
            "device_map={'': int(os.environ['LOCAL_RANK'])}"
        )
    return DeviceMap(value) if value else None


def budgets(
    env: Mapping[str, str] | None = None, *, max_memory: Mapping[int | str, int] | None = None
) -> dict[int | str, int]:
    """accelerate's ``max_memory``: bytes per device ordinal, overrides checked."""
    env = _launched_env(env)
    planned = env.get("XPULAUNCH_MAX_MEMORY")
    devices = [key for key in env.get("XPULAUNCH_DEVICES", "").split(",") if key]
    return fitted_budgets(parse_max_memory(planned) if planned else {}, max_memory, len(devices))


def from_pretrained_kwargs(
    env: Mapping[str, str] | None = None, *, max_memory: Mapping[int | str, int] | None = None
) -> dict[str, Any]:
    """``device_map`` and ``max_memory`` for transformers' ``from_pretrained`` (which does
    the balancing itself); ``{"device_map": "cpu"}`` on the CPU."""
    chosen = device_map(env)
    if chosen is None:
        return {"device_map": "cpu"}
    return {"device_map": chosen.value, "max_memory": budgets(env, max_memory=max_memory)}


def infer_device_map(
    model: Any,
    env: Mapping[str, str] | None = None,
    *,
    max_memory: Mapping[int | str, int] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: Any = None,
) -> dict[str, int | str]:
    """accelerate's ``infer_auto_device_map`` for the planned map: balanced maps first get
    ``get_balanced_memory`` (what transformers does for a string device_map)."""
    chosen = device_map(env)
    if chosen is None:
        return {"": "cpu"}
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    memory: dict[int | str, int] = budgets(env, max_memory=max_memory)
    if chosen is not DeviceMap.SEQUENTIAL:
        memory = get_balanced_memory(
            model,
            max_memory=memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            low_zero=chosen is DeviceMap.BALANCED_LOW_0,
        )
    placed = infer_auto_device_map(
        model, max_memory=memory, no_split_module_classes=no_split_module_classes, dtype=dtype
    )
    return dict(placed)


def dispatch(model: Any, env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
    """Place ``model`` on this process's devices: :func:`infer_device_map`, then accelerate's
    ``dispatch_model`` (keyword arguments go to :func:`infer_device_map`)."""
    from accelerate import dispatch_model

    placement = infer_device_map(model, env, **kwargs)
    if placement == {"": "cpu"}:
        return model
    return dispatch_model(model, device_map=placement)


def _launched_env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    env = os.environ if env is None else env
    if "XPULAUNCH_BACKEND" not in env:
        raise UsageError(
            "this process was not started by xpulaunch (XPULAUNCH_BACKEND is not set); "
            "run it with `xpulaunch PROGRAM`"
        )
    return env
