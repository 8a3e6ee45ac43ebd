#!/bin/bash
# Where xpulaunch's own start goes on the lent machine (session 8): the interpreter's start,
# five single-node launch timelines, two without a job cgroup, three static two-node
# timelines (both nodes started at once), and the import times of one launch.
#   bash docs/hardware/launch_timeline_check.sh   (from the checkout's root, on the device)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE  # bytecode compiled, as pip leaves an install
python3 --version; nproc; uname -r; head -1 /proc/self/cgroup
python3 -m xpulaunch --gpus none --nproc-per-node 2 -- /bin/true >/dev/null 2>&1  # compile
for k in 1 2 3 4 5; do
  s=$(date +%s%N); python3 -c pass; e=$(date +%s%N); echo "python3 -c pass $(( (e-s)/100000 ))e-1 ms"
done
for k in 1 2 3 4 5; do
  echo "== single $k"
  XPULAUNCH_T0_NS=$(date +%s%N) python3 bench/launch_timeline.py -- --gpus none --nproc-per-node 2 -- /bin/true 2>&1
done
for k in 1 2; do
  echo "== single, no job cgroup, $k"
  XPULAUNCH_T0_NS=$(date +%s%N) python3 bench/launch_timeline.py --no-cgroup -- --gpus none --nproc-per-node 2 -- /bin/true 2>&1
done
for k in 1 2 3; do
  port=$((20000 + RANDOM % 20000)); t=$(date +%s%N)
  for r in 0 1; do
    XPULAUNCH_T0_NS=$t python3 bench/launch_timeline.py -- --nnodes 2 --node-rank $r --master-port $port \
      --gpus none --nproc-per-node 2 -- /bin/true > /tmp/tl$r 2>&1 &
  done
  wait
  echo "== static $k node 0"; cat /tmp/tl0; echo "== static $k node 1"; cat /tmp/tl1
done
echo "== import times of one launch (the 25 largest, cumulative)"
python3 -X importtime -m xpulaunch --gpus none --nproc-per-node 2 -- /bin/true 2>&1 | sort -t'|' -k2 -n -r | head -25
