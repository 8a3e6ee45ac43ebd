#!/bin/bash
# How long after its start each node of a static two-node xpulaunch job execs its workers
# (session 8): both nodes started at once, every worker /bin/sh stamping the clock as it
# starts; 20 rounds. Prints per round the first and the last worker's start in ms.
#   bash docs/hardware/static_prefix_check.sh [ROUNDS] [extra env, e.g. XPULAUNCH_PRESTART=0]
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONPYCACHEPREFIX=/tmp/pyc CUDA_VISIBLE_DEVICES=""
unset PYTHONDONTWRITEBYTECODE
rounds=${1:-20}; shift
python3 -m xpulaunch --gpus none -- /bin/true >/dev/null 2>&1  # compile
for i in $(seq "$rounds"); do
  d=$(mktemp -d); port=$((20000 + RANDOM % 20000)); s=$(date +%s%N)
  for r in 0 1; do
    env "$@" python3 -m xpulaunch --nnodes 2 --node-rank $r --master-port $port --gpus none \
      --nproc-per-node 2 -- /bin/sh -c "date +%s%N > $d/w\$RANK" >/dev/null 2>&1 &
  done
  wait
  first=$(sort -n "$d"/w* | head -1); last=$(sort -n "$d"/w* | tail -1)
  echo "round $i: workers $(ls "$d" | wc -l), first $(( (first - s) / 1000000 )) ms, last $(( (last - s) / 1000000 )) ms"
  rm -rf "$d"
done
