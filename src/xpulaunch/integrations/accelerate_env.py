"""The variables ``accelerate launch`` gives its children, from its launch arguments (pure).

Each function mirrors one block of ``accelerate/utils/launch.py``; values are written with
``str()`` of what the YAML file held, as accelerate writes them (``True``, ``false``, ``2``).
Device masks and ``MASTER_ADDR``/``MASTER_PORT`` are left out: they come from our own plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

PRECISIONS = ("no", "fp8", "fp16", "bf16")
# accelerate's DynamoBackend members (utils/dataclasses.py).
DYNAMO_BACKENDS = [
    "NO",
    "EAGER",
    "AOT_EAGER",
    "INDUCTOR",
    "AOT_TS_NVFUSER",
    "NVPRIMS_NVFUSER",
    "CUDAGRAPHS",
    "OFI",
    "FX2TRT",
    "ONNXRT",
    "TENSORRT",
    "AOT_TORCHXLA_TRACE_ONCE",
    "TORCHXLA_TRACE_ONCE",
    "IPEX",
    "TVM",
    "HPU_BACKEND",
]
# The accelerate release whose launch functions these blocks mirror; older ones differ where
# ``launch_env`` says so (its ``accelerate`` argument).
NEWEST = (1, 16)
# The launch parser's defaults that the blocks below read (commands/launch.py).
DEFAULTS: dict[str, Any] = {
    "debug": False,
    "use_cpu": False,
    "dynamo_backend": "no",
    "dynamo_mode": "default",
    "dynamo_use_fullgraph": False,
    "dynamo_use_dynamic": None,  # torch.compile's own choice; False before 1.16 (below)
    "dynamo_use_regional_compilation": False,
    "fsdp_version": "1",
    "fsdp_sharding_strategy": "FULL_SHARD",
    "fsdp_reshard_after_forward": "true",
    "fsdp_offload_params": "false",
    "fsdp_min_num_params": 100000000,
    "fsdp_forward_prefetch": "false",
    "fsdp_use_orig_params": "true",
    "fsdp_cpu_ram_efficient_loading": "true",
    "fsdp_sync_module_states": "true",
    "fsdp_activation_checkpointing": "false",
    "fsdp_activation_checkpointing_offload": "false",
    "megatron_lm_tp_degree": 1,
    "megatron_lm_pp_degree": 1,
    "megatron_lm_use_custom_fsdp": False,
    "megatron_lm_gradient_clipping": 1.0,
    "megatron_lm_eod_mask_loss": False,
    "megatron_lm_no_load_optim": False,
    "megatron_lm_no_save_optim": False,
    "megatron_lm_optimizer_cpu_offload": False,
    "megatron_lm_use_precision_aware_optimizer": False,
    "megatron_lm_overlap_cpu_optimizer_d2h_h2d": False,
    "fp8_amax_compute_algo": "most_recent",
    "fp8_amax_history_len": 1024,
    "fp8_enable_fsdp_float8_all_gather": 1,
    "fp8_format": "HYBRID",
    "fp8_interval": 1,
    "fp8_margin": 0,
    "fp8_override_linear_precision": (False, False, False),
    "fp8_pad_inner_dim": 1,
    "fp8_use_autocast_during_eval": False,
    "parallelism_config_cp_backend": "torch",
    "parallelism_config_cp_comm_strategy": "allgather",
    "parallelism_config_cp_size": 1,
    "parallelism_config_dp_replicate_size": 1,
    "parallelism_config_dp_shard_size": 1,
    "parallelism_config_sp_attn_implementation": "sdpa",
    "parallelism_config_sp_backend": "deepspeed",
    "parallelism_config_sp_seq_length_is_variable": True,
    "parallelism_config_sp_size": 1,
    "parallelism_config_tp_size": 1,
}
FSDP_OPTIONAL = {
    "FSDP_AUTO_WRAP_POLICY": "fsdp_auto_wrap_policy",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "fsdp_transformer_layer_cls_to_wrap",
    "FSDP_BACKWARD_PREFETCH": "fsdp_backward_prefetch",
    "FSDP_STATE_DICT_TYPE": "fsdp_state_dict_type",
    "FSDP_IGNORED_MODULES": "fsdp_ignored_modules",
}
FSDP_LOWERED = [
    "reshard_after_forward",
    "offload_params",
    "forward_prefetch",
    "use_orig_params",
    "cpu_ram_efficient_loading",
    "sync_module_states",
    "activation_checkpointing",
    "activation_checkpointing_offload",
]
MEGATRON_ALWAYS = ("tp_degree", "use_custom_fsdp", "pp_degree", "gradient_clipping")
MEGATRON_OPTIONAL = [
    "no_load_optim",
    "eod_mask_loss",
    "no_save_optim",
    "optimizer_cpu_offload",
    "use_precision_aware_optimizer",
    "overlap_cpu_optimizer_d2h_h2d",
    "decoder_last_pipeline_num_layers",
    "num_micro_batches",
    "sequence_parallelism",
    "recompute_activations",
    "use_distributed_optimizer",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "attention_backend",
    "expert_model_parallel_size",
    "context_parallel_size",
    "attention_dropout",
    "hidden_dropout",
    "attention_softmax_in_fp32",
    "expert_tensor_parallel_size",
    "calculate_per_token_loss",
    "use_rotary_position_embeddings",
]
DEEPSPEED_OPTIONAL = {
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": ("zero_stage", False),
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": ("gradient_accumulation_steps", False),
    "ACCELERATE_GRADIENT_CLIPPING": ("gradient_clipping", True),
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": ("offload_optimizer_device", True),
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": ("offload_param_device", True),
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": ("zero3_init_flag", True),
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": ("zero3_save_16bit_model", True),
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": ("deepspeed_config_file", False),
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": ("deepspeed_moe_layer_cls_names", False),
}


def launch_env(
    config_args: Mapping[str, Any],
    launcher: str,
    parent_env: Mapping[str, str],
    cwd: str = "",
    *,
    accelerate: tuple[int, int] = NEWEST,
) -> dict[str, str]:
    """The variables of ``launcher`` (simple, multi_gpu or deepspeed) for these arguments, as
    the ``accelerate`` release (major, minor) that the workers import would set them."""
    defaults = dict(DEFAULTS)
    if accelerate < (1, 16):
        # Until 1.16 the flag defaulted to False, which a worker's TorchDynamoPlugin reads as
        # "static shapes"; from 1.16 the variable is left out and torch.compile decides.
        defaults["dynamo_use_dynamic"] = False
        # MS-AMP's level, a launch option until 1.16 dropped MS-AMP (a file's value still
        # reaches the workers, as under accelerate launch).
        defaults["fp8_opt_level"] = "O2"
    args = {**defaults, **{k: v for k, v in config_args.items() if v is not None}}
    env: dict[str, str] = {}
    if launcher == "simple":
        env["ACCELERATE_USE_CPU"] = str(bool(args["use_cpu"]))
    if args["debug"]:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if launcher == "simple" and args["use_cpu"]:
        env.update(KMP_AFFINITY="granularity=fine,compact,1,0", KMP_BLOCKTIME="1")
    env.update(_precision_env(args))
    if launcher == "deepspeed":
        env.update(_deepspeed_env(config_args, args))
        if cwd:  # accelerate adds the launch directory to the path of DeepSpeed jobs
            paths = [p for p in parent_env.get("PYTHONPATH", "").split(":") if p]
            env["PYTHONPATH"] = ":".join([*paths, cwd])
    else:
        env.update(_dynamo_env(args))
    if launcher == "multi_gpu":
        env.update(_fsdp_env(args) if args["distributed_type"] == "FSDP" else {})
        env.update(_megatron_env(args) if args["distributed_type"] == "MEGATRON_LM" else {})
    if launcher != "deepspeed" and "OMP_NUM_THREADS" not in parent_env:
        # accelerate's default num_cpu_threads_per_process. Its CPU-only guess (physical
        # cores / processes, through psutil) is not copied: torchrun's 1 is what xpulaunch
        # gives every several-worker job, and OMP_NUM_THREADS in the environment wins.
        env["OMP_NUM_THREADS"] = "1"
    if config_args.get("parallelism_config") and launcher != "simple":
        env.update(_parallelism_env(args))
    return env


def _precision_env(args: Mapping[str, Any]) -> dict[str, str]:
    precision = str(args["mixed_precision"]).lower()
    if precision not in PRECISIONS:
        raise UsageError(f"mixed_precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    env = {"ACCELERATE_MIXED_PRECISION": precision}
    if precision == "fp8":
        env.update(_fp8_env(args))
    return env


def _fp8_env(args: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, value in args.items():
        if not name.startswith("fp8_") or name == "fp8_config" or value is None:
            continue
        if name == "fp8_override_linear_precision":
            for part, flag in zip(("FPROP", "DGRAD", "WGRAD"), value, strict=True):
                env[f"ACCELERATE_FP8_OVERRIDE_{part}"] = str(flag)
        else:
            env[f"ACCELERATE_{name.upper()}"] = str(value)
    return env


def _dynamo_env(args: Mapping[str, Any]) -> dict[str, str]:
    backend = str(args["dynamo_backend"]).upper()
    if backend not in DYNAMO_BACKENDS:
        raise UsageError(
            f"dynamo_backend {backend!r}: expected one of {', '.join(DYNAMO_BACKENDS)}"
        )
    env = {"ACCELERATE_DYNAMO_BACKEND": backend, "ACCELERATE_DYNAMO_MODE": str(args["dynamo_mode"])}
    for flag in ("fullgraph", "dynamic", "regional_compilation"):
        if args[f"dynamo_use_{flag}"] is not None:
            env[f"ACCELERATE_DYNAMO_USE_{flag.upper()}"] = str(args[f"dynamo_use_{flag}"])
    return env


def _fsdp_env(args: Mapping[str, Any]) -> dict[str, str]:
    if _lower(args["fsdp_cpu_ram_efficient_loading"]) == "true" and (
        _lower(args["fsdp_sync_module_states"]) != "true"
    ):
        raise UsageError("fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states: true")
    env = {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": str(args["fsdp_version"]),
        "FSDP_SHARDING_STRATEGY": str(args["fsdp_sharding_strategy"]),
        "FSDP_MIN_NUM_PARAMS": str(args["fsdp_min_num_params"]),
    }
    for name in FSDP_LOWERED:
        env[f"FSDP_{name.upper()}"] = _lower(args[f"fsdp_{name}"])
    for var, name in FSDP_OPTIONAL.items():
        if args.get(name) is not None:
            env[var] = str(args[name])
    return env


def _megatron_env(args: Mapping[str, Any]) -> dict[str, str]:
    env = {"ACCELERATE_USE_MEGATRON_LM": "true"}
    for name in (*MEGATRON_ALWAYS, *MEGATRON_OPTIONAL):
        value = args.get(f"megatron_lm_{name}")
        if value is not None:
            env[f"MEGATRON_LM_{name.upper()}"] = str(value)
    return env


def _deepspeed_env(config_args: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, str]:
    """The fields named in ACCELERATE_CONFIG_DS_FIELDS are the deepspeed_config keys (and
    mixed_precision when the file sets it), which the DeepSpeed plugin then refuses to take
    from the script as well."""
    fields = list(config_args.get("deepspeed_config") or {})
    if config_args.get("mixed_precision_from_config"):
        fields.append("mixed_precision")
    env = {
        "ACCELERATE_CONFIG_DS_FIELDS": ",".join(fields).lower(),
        "ACCELERATE_USE_DEEPSPEED": "true",
    }
    for var, (name, lowered) in DEEPSPEED_OPTIONAL.items():
        if args.get(name) is not None:
            env[var] = _lower(args[name]) if lowered else str(args[name])
    return env


def _parallelism_env(args: Mapping[str, Any]) -> dict[str, str]:
    prefix = "PARALLELISM_CONFIG_"
    env = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    always = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size")
    for name in (*always, "sp_backend"):
        env[prefix + name.upper()] = str(args[f"parallelism_config_{name}"])
    if int(args["parallelism_config_cp_size"]) > 1:
        env[prefix + "CP_COMM_STRATEGY"] = str(args["parallelism_config_cp_comm_strategy"])
    if int(args["parallelism_config_sp_size"]) > 1:
        for name in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"):
            env[prefix + name.upper()] = str(args.get(f"parallelism_config_{name}"))
    return env


def _lower(value: object) -> str:
    return str(value).lower()
