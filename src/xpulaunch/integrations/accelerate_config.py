"""An ``accelerate config`` file -> what ``xpulaunch run`` does with it (pure).

``accelerate launch`` turns its config file into launcher arguments (``_validate_launch_command``
in ``accelerate/commands/launch.py``) and those into the children's environment
(``prepare_simple_launcher_cmd_env``, ``prepare_multi_gpu_env``, ``prepare_deepspeed_cmd_env``
in ``accelerate/utils/launch.py``). This module does the same for one node without importing
accelerate: process counts, devices and the rendezvous become our own options (so device
selection, leases and restarts apply), and everything else becomes the same ``ACCELERATE_*``,
``FSDP_*``, ``MEGATRON_LM_*`` and ``PARALLELISM_CONFIG_*`` variables. The tests compare the
result with accelerate's own functions on the same files.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xpulaunch.core.masks import CUDA_VAR, HIP_VAR, ODS_VAR, ROCR_VAR, ZE_MASK_VAR
from xpulaunch.errors import UsageError
from xpulaunch.integrations.accelerate_env import NEWEST, launch_env

if TYPE_CHECKING:
    from collections.abc import Mapping

# distributed_type -> the launcher accelerate picks for it (launch_command).
LAUNCHERS = {
    "NO": "simple",
    "MULTI_CPU": "simple",
    "MULTI_GPU": "multi_gpu",
    "MULTI_XPU": "multi_gpu",
    "FSDP": "multi_gpu",
    "MEGATRON_LM": "multi_gpu",
    "DEEPSPEED": "deepspeed",
}
# use_cpu: true under these runs the processes as one MULTI_CPU job. accelerate launch
# starts them with its multi-GPU launcher instead (launch_command looks at its --cpu flag, not
# at the file's use_cpu), without ACCELERATE_USE_CPU; each then finds no GPU and runs as a job
# of one process ("process 0 of 1"), N unconnected copies writing the same checkpoints.
CPU_AS_MULTI_CPU = ("MULTI_GPU", "MULTI_XPU")
# Keys accelerate launch reads from the file but xpulaunch does not act on, with their
# defaults: a value other than the default (or an empty one: `accelerate config` writes
# downcast_bf16: 'no' and tpu_env: []) is named in the warning. accelerate launch itself
# ignores rdzv_backend, same_network and enable_cpu_affinity from a file (its argparse defaults
# are not None, so the file's value is never copied), and so do we, to give the same env;
# same_network only picks between two spellings of one static rendezvous, so it goes unnamed.
IGNORED_UNLESS_DEFAULT: dict[str, object] = {
    "rdzv_backend": "static",
    "enable_cpu_affinity": False,
    "main_training_function": "main",
    "downcast_bf16": False,
    "tpu_name": None,
    "tpu_zone": None,
    "tpu_use_cluster": False,
    "tpu_use_sudo": False,
    "command_file": None,
    "commands": None,
    "tpu_vm": None,
    "tpu_env": None,
    "mpirun_config": {},
}
_EMPTY: tuple[object, ...] = (None, False, "no", [], {})
# Every key of accelerate's ClusterConfig (commands/config/config_args.py), plus the two old
# spellings that its process_config still converts: those read here (same_network is ignored
# unnamed, as said above), then those ignored with a warning.
KNOWN_KEYS = frozenset(
    [
        "compute_environment",
        "distributed_type",
        "mixed_precision",
        "use_cpu",
        "debug",
        "num_processes",
        "machine_rank",
        "num_machines",
        "gpu_ids",
        "main_process_ip",
        "main_process_port",
        "same_network",
        "fp8_config",
        "deepspeed_config",
        "fsdp_config",
        "parallelism_config",
        "megatron_lm_config",
        "dynamo_config",
        "fp16",
        "dynamo_backend",
        *IGNORED_UNLESS_DEFAULT,
    ]
)
VISIBILITY_VARS = (CUDA_VAR, ZE_MASK_VAR, ODS_VAR, ROCR_VAR, HIP_VAR)


@dataclass(frozen=True)
class AccelerateLaunch:
    """What a config file asks of ``run``.

    ``options``: values for ``run``'s own options, keyed by their Python names (``gpus``,
    ``nproc_per_node``, ``backend``, ``master_addr``, ``master_port``, ``nnodes``,
    ``node_rank``); ``env``: variables every worker gets; ``ignored``: ``key=value`` texts of
    what is not honoured; ``warnings``: other things the user should know; ``summary``: what
    the file asked for, for the plan's notes.
    """

    options: dict[str, object]
    env: dict[str, str]
    ignored: tuple[str, ...]
    warnings: tuple[str, ...]
    summary: str
    # gpu_ids other than "all": ordinals the children's runtime reads (core.runtime_ids),
    # which the plan resolves against the inventory in place of ``--gpus``.
    gpu_ids: str | None = None
    # The keys that chose the devices (``num_processes 2, distributed_type MULTI_GPU, gpu_ids
    # all``), for an error about them: the user wrote the file, not ``--gpus``.
    devices_from: str = ""


def translate(
    config: Mapping[str, Any],
    parent_env: Mapping[str, str],
    *,
    source: str,
    cwd: str = "",
    nproc_per_node: int | None = None,
    accelerate: tuple[int, int] = NEWEST,
) -> AccelerateLaunch:
    """Map a parsed config file (``source`` names it in errors) onto ``run``; ``cwd`` is the
    directory DeepSpeed jobs get on their ``PYTHONPATH``, as under accelerate launch.
    ``nproc_per_node``: the user's own count, which wins over the file's, as accelerate
    launch's ``--num_processes`` does (and so sets how many devices ``gpu_ids: all`` takes).
    ``accelerate``: the release (major, minor) the workers import, whose defaults apply."""
    args = _launch_args(config, source)
    launcher = LAUNCHERS[args["distributed_type"]]
    warnings = _mask_clash(args, parent_env)
    if args.get("use_cpu") and args["distributed_type"] in CPU_AS_MULTI_CPU:
        launcher = "simple"  # the variables of MULTI_CPU, ACCELERATE_USE_CPU among them
        warnings += (_cpu_note(args),)
    if args["distributed_type"] == "NO" and int(args["num_processes"]) > 1 and not nproc_per_node:
        warnings += (
            f"distributed_type NO: one process, as accelerate launch starts; num_processes "
            f"{args['num_processes']} is for a distributed type (MULTI_GPU, MULTI_XPU, MULTI_CPU)",
        )
    try:
        env = launch_env(args, launcher, parent_env, cwd=cwd, accelerate=accelerate)
    except UsageError as exc:  # a value of the file's: say which file, as for every key
        raise UsageError(f"{source}: {exc.detail}") from exc
    return AccelerateLaunch(
        options=_run_options(args, launcher, nproc_per_node),
        env=env,
        ignored=_ignored(config),
        warnings=warnings,
        summary=_summary(args),
        gpu_ids=_gpu_ids(args),
        devices_from=_devices_from(config, args),
    )


def _devices_from(config: Mapping[str, Any], args: Mapping[str, Any]) -> str:
    keys = ("num_processes", "distributed_type", "gpu_ids", "use_cpu")
    return ", ".join(f"{key} {_yaml_word(args[key])}" for key in keys if key in config)


def _yaml_word(value: object) -> str:
    """A value as the file spells it (``false``, not Python's ``False``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _cpu_note(args: Mapping[str, Any]) -> str:
    count = int(args["num_processes"])
    return (
        f"use_cpu: true under distributed_type {args['distributed_type']}: the "
        f"{count} process{'es' if count != 1 else ''} run on the CPU as one MULTI_CPU job "
        "(accelerate launch would start each as a job of its own)"
    )


def _summary(args: Mapping[str, Any]) -> str:
    processes = int(args["num_processes"])
    machines = int(args.get("num_machines") or 1)
    where = f" on {machines} machines" if machines > 1 else ""
    return (
        f"{args['distributed_type']}, {processes} process{'es' if processes != 1 else ''}"
        f"{where}, mixed precision {args['mixed_precision']}; the workers get the variables "
        "accelerate launch would set"
    )


def _launch_args(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """accelerate's launch arguments after _validate_launch_command read the file."""
    _check_keys(config, source)
    args: dict[str, Any] = dict(config)
    if args.get("compute_environment", "LOCAL_MACHINE") != "LOCAL_MACHINE":
        raise UsageError(
            f"{source}: compute_environment {args['compute_environment']!r}: xpulaunch runs "
            "LOCAL_MACHINE configs only"
        )
    kind = args.get("distributed_type")
    if kind not in LAUNCHERS:
        valid = ", ".join(LAUNCHERS)
        raise UsageError(f"{source}: distributed_type {kind!r}: expected one of {valid}")
    if "fp16" in args and "mixed_precision" not in args:  # the old spelling
        args["mixed_precision"] = "fp16" if args["fp16"] else None
    if "dynamo_backend" in args and "dynamo_config" not in args:
        backend = args.pop("dynamo_backend")
        args["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
    # Whether the file chose the precision: DeepSpeed then refuses it from the script too.
    args["mixed_precision_from_config"] = args.get("mixed_precision") is not None
    args["mixed_precision"] = args.get("mixed_precision") or "no"
    args.setdefault("num_processes", 1 if kind == "NO" else -1)
    if args["num_processes"] == -1:
        raise UsageError(f"{source}: num_processes is not set; give --nproc-per-node")
    _whole(args, "num_processes", source, low=1)
    _whole(args, "num_machines", source, low=1)
    _whole(args, "machine_rank", source, low=0)
    _whole(args, "main_process_port", source, low=0, high=65535)
    ids = str(args.get("gpu_ids", "all"))
    one_node = int(args.get("num_machines") or 1) <= 1
    if kind in ("MULTI_GPU", "MULTI_XPU") and one_node and ids != "all" and "," not in ids:
        raise UsageError(  # accelerate launch refuses it too
            f"{source}: gpu_ids {ids!r}: distributed_type {kind} needs at least two GPU ids, "
            "or all (for one GPU: distributed_type NO)"
        )
    _flatten_sections(args)
    return args


def _whole(args: Mapping[str, Any], key: str, source: str, *, low: int, high: int = 2**31) -> None:
    """A count or port as accelerate's argparse would accept it (an integer, or its text),
    never a boolean or a fraction that ``int()`` would quietly round."""
    value = args.get(key)
    if value is None:
        return
    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value):
        number = int(value)
    if number is None or not low <= number <= high:
        bound = f"from {low} to {high}" if high < 2**31 else f"of at least {low}"
        raise UsageError(f"{source}: {key}: {value!r} is not a whole number {bound}")


def _check_keys(config: Mapping[str, Any], source: str) -> None:
    for key in config:
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(str(key), sorted(KNOWN_KEYS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"{source}: unknown key {key!r}{hint}")


def _flatten_sections(args: dict[str, Any]) -> None:
    """``fsdp_config: {version: 2}`` -> ``fsdp_version: 2``, as launch does with each
    dict-valued key (fsdp_, fp8_ and dynamo_ prefixes added where missing)."""
    prefixes = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}
    for name in [k for k, v in args.items() if isinstance(v, dict)]:
        prefix = prefixes.get(name, "")
        for key, value in args[name].items():
            args[key if key.startswith(prefix) else prefix + key] = value


def _run_options(
    args: Mapping[str, Any], launcher: str, nproc_per_node: int | None
) -> dict[str, object]:
    machines = int(args.get("num_machines") or 1)
    processes = int(args["num_processes"])
    per_node = nproc_per_node or max(processes // machines, 1)
    if args["distributed_type"] == "NO" and nproc_per_node is None:
        per_node = 1  # accelerate launch's simple launcher: one process, whatever the count
    options: dict[str, object] = {"nproc_per_node": str(per_node)}
    options["gpus"] = _gpus(args, launcher, per_node)
    if args["distributed_type"] == "MULTI_XPU" and not args.get("use_cpu"):
        options["backend"] = "xpu"
    if args.get("main_process_ip") is not None:
        options["master_addr"] = str(args["main_process_ip"])
    port = args.get("main_process_port")
    if port is None and machines > 1:
        port = 29500  # accelerate's default; every node must agree on it
    if port:  # 0: a free port, which is also our default
        options["master_port"] = int(port)
    if machines > 1:
        options["nnodes"] = str(machines)
        options["node_rank"] = int(args.get("machine_rank") or 0)
    return options


def _gpus(args: Mapping[str, Any], launcher: str, per_node: int) -> str:
    """ "all" becomes a count so that the free devices are chosen (accelerate would take the
    first ones, busy or not); explicit gpu_ids are read by the plan (``gpu_ids``)."""
    if args.get("use_cpu") or args["distributed_type"] == "MULTI_CPU":
        return "none"
    if _gpu_ids(args) is not None:
        return "all"  # stands for gpu_ids until the plan reads them
    return str(per_node) if launcher != "simple" else "auto"


def _gpu_ids(args: Mapping[str, Any]) -> str | None:
    ids = args.get("gpu_ids")
    cpu = args.get("use_cpu") or args["distributed_type"] == "MULTI_CPU"
    return None if ids is None or str(ids) == "all" or cpu else str(ids)


def _mask_clash(args: Mapping[str, Any], parent_env: Mapping[str, str]) -> tuple[str, ...]:
    ids = args.get("gpu_ids")
    masks = [f"{v}={parent_env[v]}" for v in VISIBILITY_VARS if v in parent_env]
    if ids is None or str(ids) == "all" or not masks:
        return ()
    return (
        f"gpu_ids {ids} are read as accelerate launch's children read them, and "
        f"{', '.join(masks)} restricts what may be handed out (accelerate launch would "
        "replace that mask with gpu_ids)",
    )


def _ignored(config: Mapping[str, Any]) -> tuple[str, ...]:
    ignored = [
        f"{key}={config[key]!r}"
        for key, default in IGNORED_UNLESS_DEFAULT.items()
        if key in config and config[key] != default and config[key] not in _EMPTY
    ]
    deepspeed = config.get("deepspeed_config") or {}
    for key in ("deepspeed_multinode_launcher", "deepspeed_hostfile"):
        if key in deepspeed and int(config.get("num_machines") or 1) > 1:
            ignored.append(f"deepspeed_config.{key}={deepspeed[key]!r}")
    return tuple(ignored)
