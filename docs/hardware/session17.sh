#!/usr/bin/env bash
# Session 17 on the lent one-GPU machine (nvidia-h200): the topology read against
# nvidia-smi topo -m and its cost (topology_check.sh), and `top`'s CPU cost with its sampler
# on a real GPU (bench_top.py --host real). Run from the repository root on the device, with
# the wheels of gpu_env.sh carried in .whl/; $OUT is what comes back. Saved under
# docs/hardware/2026-12-02-s17-h200x1/.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT/t"
(source docs/hardware/gpu_env.sh) >"$OUT/gpu_env.log" 2>&1
# shellcheck source=/dev/null
source docs/hardware/gpu_env.sh >/dev/null 2>&1
OUT=$OUT/t RUNS=20 timeout 400 bash docs/hardware/topology_check.sh >/dev/null 2>&1
echo "topology_check rc=$?" >"$OUT/bench_top.log"
PYTHONPATH=$PWD/src timeout 120 python3 bench/bench_top.py --host real --seconds 30 >>"$OUT/bench_top.log" 2>&1
echo "bench_top rc=$?" >>"$OUT/bench_top.log"
nvidia-smi --query-gpu=name,driver_version --format=csv >>"$OUT/bench_top.log"
