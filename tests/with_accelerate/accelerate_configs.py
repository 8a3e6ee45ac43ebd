"""accelerate config files as `accelerate config` writes them, one per launcher and block."""

from __future__ import annotations

HEADER = """compute_environment: LOCAL_MACHINE
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
num_machines: 1
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
"""

CONFIGS = {
    "single": "distributed_type: 'NO'\nmixed_precision: bf16\nuse_cpu: false\ngpu_ids: all\n",
    "multi-cpu": """distributed_type: MULTI_CPU
mixed_precision: bf16
num_processes: 2
use_cpu: true
debug: true
""",
    "multi-gpu-dynamo": """distributed_type: MULTI_GPU
gpu_ids: all
mixed_precision: fp16
num_processes: 2
use_cpu: false
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
  dynamo_use_dynamic: true
  dynamo_use_fullgraph: true
  dynamo_use_regional_compilation: false
""",
    "multi-xpu-ids": """distributed_type: MULTI_XPU
gpu_ids: 0,1
mixed_precision: bf16
num_processes: 2
use_cpu: false
""",
    "fsdp": """distributed_type: FSDP
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: 2
gpu_ids: all
mixed_precision: bf16
num_processes: 4
use_cpu: false
""",
    "fsdp-v1-old-style": """distributed_type: FSDP
fsdp_config:
  backward_prefetch: BACKWARD_PRE
  sharding_strategy: SHARD_GRAD_OP
  sync_module_states: true
  use_orig_params: false
  min_num_params: 2000
num_processes: 2
fp16: true
dynamo_backend: EAGER
""",
    "fsdp-parallelism": """distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
parallelism_config:
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
  parallelism_config_cp_size: 2
num_processes: 8
mixed_precision: bf16
""",
    "megatron": """distributed_type: MEGATRON_LM
megatron_lm_config:
  megatron_lm_gradient_clipping: 1.0
  megatron_lm_num_micro_batches: 2
  megatron_lm_pp_degree: 2
  megatron_lm_recompute_activations: true
  megatron_lm_sequence_parallelism: true
  megatron_lm_tp_degree: 2
  megatron_lm_use_distributed_optimizer: true
mixed_precision: bf16
num_processes: 4
""",
    "deepspeed": """distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
mixed_precision: fp16
num_processes: 2
""",
    # The keys `accelerate config` writes for Transformer Engine (commands/config/cluster.py).
    "fp8-te": """distributed_type: MULTI_GPU
gpu_ids: all
mixed_precision: fp8
num_processes: 2
use_cpu: false
fp8_config:
  backend: TE
  use_autocast_during_eval: false
  margin: 0
  interval: 1
  fp8_format: HYBRID
  amax_history_length: 16
  amax_compute_algorithm: max
  override_linear_precision: [false, false, true]
""",
    "two-machines": """distributed_type: MULTI_GPU
gpu_ids: all
main_process_ip: 10.0.0.1
main_process_port: 29511
mixed_precision: 'no'
num_processes: 8
use_cpu: false
""",
}


def config_text(name: str) -> str:
    """The whole file: accelerate's header, then the case's keys (which win)."""
    body = CONFIGS[name]
    keys = {line.split(":")[0] for line in body.splitlines() if not line.startswith(" ")}
    header = [line for line in HEADER.splitlines() if line.split(":")[0] not in keys]
    if name == "two-machines":
        header = [line for line in header if not line.startswith(("num_machines", "machine_rank"))]
        header += ["num_machines: 2", "machine_rank: 1"]
    return "\n".join(header) + "\n" + body
