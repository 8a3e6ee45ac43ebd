#!/usr/bin/env bash
# The job queue, slots and `xpulaunch top` on a real 2-GPU NVIDIA host (written for
# nvidia-h100-x2: root, offline, python3 with torch, click, psutil and nvidia-ml-py; source
# docs/hardware/gpu_env.sh first where the image lacks them). About 3 minutes. Run from the
# repository root:
#
#     bash docs/hardware/queue_check.sh
#
# 1. four `submit --slots-per-gpu 2 --gpus 1` jobs, each a torch process holding 4 GiB on its
#    GPU: all four run at once, two per GPU (nvidia-smi's compute apps), each with
#    XPULAUNCH_MAX_MEMORY half of its GPU; a fifth waits, and `queue` says which jobs share
#    the devices; a whole-device `run --gpus 1` is refused; `top --once` names each GPU's
#    holders (the NVML processes of the jobs are not "other"), while a torch process started
#    without xpulaunch shows as "other";
# 2. `kill -9` of the runner: the running jobs finish, the next runner adopts them;
# 3. submit to start on the real probe: the submit command's time and the job's start.
# Prints PASS/FAIL lines and a summary; exits 1 when anything FAILed. With OUT set, the log is
# also written to "$OUT/queue_check.log".
set -u
cd "$(dirname "$0")/../.." || exit 2
# NVLink multicast stays off on the shared machines (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY
# The checks count on two GPUs (four slots): on a bigger host, xpulaunch is shown the first two.
if [ "$(nvidia-smi -L | grep -c '^GPU')" -gt 2 ]; then
    export CUDA_VISIBLE_DEVICES=0,1
    echo "more than 2 GPUs: CUDA_VISIBLE_DEVICES=0,1 for every command"
fi
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/queue_check.log") 2>&1
fi
WORK=$(mktemp -d /tmp/queue-check.XXXXXX)
export XPULAUNCH_LOCK_DIR=$WORK/locks
FAILED=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }
x() { python3 -m xpulaunch "$@"; }
state() { x queue --json -a | python3 -c "import json,sys; print(' '.join(j['state'] for j in json.load(sys.stdin)['jobs']))"; }
cleanup() {
    x cancel --all >/dev/null 2>&1
    local pid
    pid=$(head -1 "$WORK/locks/queue-runner-0.lock" 2>/dev/null)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    [ -n "${OTHER:-}" ] && kill "$OTHER" 2>/dev/null
    sleep 2
}
trap cleanup EXIT

cat > "$WORK/hold.py" <<'EOF'
import os, sys, time
import torch
x = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
free, total = torch.cuda.mem_get_info()
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "XPULAUNCH_MAX_MEMORY", os.environ.get("XPULAUNCH_MAX_MEMORY"), "total", total, flush=True)
time.sleep(float(sys.argv[1]))
EOF
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'GPUs')"

echo "== 1. four jobs on two GPUs with --slots-per-gpu 2"
for n in 1 2 3 4 5; do
    x submit --slots-per-gpu 2 --gpus 1 -- python3 "$WORK/hold.py" 40 || fail "submit $n"
done
for _ in $(seq 120); do
    [ "$(state)" = "running running running running waiting" ] && break
    sleep 1
done
x queue
[ "$(state)" = "running running running running waiting" ] && pass "four run at once, the fifth waits" \
    || fail "states: $(state)"
sleep 5  # each torch process has its 4 GiB
nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader | tee "$WORK/apps"
per_gpu=$(cut -d, -f2 "$WORK/apps" | sort | uniq -c | awk '{print $1}' | sort | tr '\n' ' ')
[ "$per_gpu" = "2 2 " ] && pass "nvidia-smi: two processes on each GPU" || fail "per GPU: $per_gpu"
x queue --json | grep -q '"reason": "waiting for a slot on 1 device: nvidia 0 shared by job' \
    && pass "the fifth job says which jobs share the devices" || fail "the fifth job's reason"
for id in 1 2 3 4; do x logs "$id"; done | grep XPULAUNCH_MAX_MEMORY | tee "$WORK/env"
python3 - "$WORK/env" <<'EOF' && pass "XPULAUNCH_MAX_MEMORY is half of each GPU" || fail "XPULAUNCH_MAX_MEMORY"
import json, sys
for line in open(sys.argv[1]):
    words = line.split()
    budget = json.loads(words[words.index("XPULAUNCH_MAX_MEMORY") + 1])["0"]
    total = int(words[words.index("total") + 1])
    assert abs(budget - total // 2) < 2**30, (budget, total)
EOF
if x run --gpus 1 -- true 2>"$WORK/refused"; then
    fail "a whole-device run started on shared GPUs"
else
    grep -q "sharing it" "$WORK/refused" && pass "a whole-device run is refused: $(cat "$WORK/refused")" \
        || fail "refusal: $(cat "$WORK/refused")"
fi
CUDA_VISIBLE_DEVICES=1 python3 "$WORK/hold.py" 30 >/dev/null 2>&1 &
OTHER=$!
sleep 8
COLUMNS=120 x top --once | tee "$WORK/top"
grep -q "^nvidia 0 .*slot: job" "$WORK/top" && pass "top: nvidia 0's slot holders" || fail "top: holders"
grep -q "other: pid $OTHER " "$WORK/top" && pass "top: the process started without xpulaunch is other" \
    || fail "top: other process"
[ "$(grep -c 'other: ' "$WORK/top")" = 1 ] && pass "top: the jobs' processes are not other" \
    || fail "top: jobs' processes listed as other"

echo "== 2. kill -9 of the runner"
runner=$(head -1 "$WORK/locks/queue-runner-0.lock")
kill -9 "$runner" && pass "runner $runner killed"
for _ in $(seq 120); do
    [ -z "$(x status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["slots"] or "")')" ] && break
    sleep 1
done
x status
x runner
for _ in $(seq 120); do
    [ "$(state)" = "done done done done done" ] && break
    sleep 1
done
x queue -a
[ "$(state)" = "done done done done done" ] && pass "every job done after the runner's kill -9" \
    || fail "states: $(state)"

echo "== 3. submit to start on the real probe"
for n in 1 2 3; do
    t0=$(date +%s.%N)
    x submit --gpus 1 -- python3 -c "import time; open('$WORK/s$n', 'w').write(repr(time.time()))" >/dev/null
    t1=$(date +%s.%N)
    for _ in $(seq 200); do [ -s "$WORK/s$n" ] && break; sleep 0.05; done
    python3 -c "print('submit command %.3f s, id printed -> program started %.3f s' % ($t1 - $t0, float(open('$WORK/s$n').read()) - $t1))"
    sleep 1
done
echo "== summary"
[ "$FAILED" = 0 ] && echo "ALL PASS" || echo "SOME FAILED"
exit "$FAILED"
