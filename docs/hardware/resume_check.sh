#!/usr/bin/env bash
# Is xpulaunch's gang restart exactly a resume? On one node of every GPU (NCCL), the weights of
# examples/train.py after 20 steps:
#   A  uninterrupted (xpulaunch)
#   B  resumed by hand: --steps 10, then --steps 20 from its checkpoint (xpulaunch, no restart)
#   C  a crash at step 12 and xpulaunch's restart (resumes from step 10)
#   D  the same crash under torchrun --max-restarts 1
#   E, F  A and C again with DDP's buckets laid out before the first step (ddp_warm_buckets.py)
# The restart is exactly a resume when C = B = D. With more than two ranks, C may differ from A
# in the last bits (DDP's first step after a resume all-reduces in another bucket layout);
# E = F says the layout is the whole difference.
#
#     OUT=/some/dir bash docs/hardware/resume_check.sh
set -u
cd "$(dirname "$0")/../.." || exit 2
: "${OUT:?set OUT}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 NO_COLOR=1 PYTHONPATH=$PWD/src
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
export XDG_RUNTIME_DIR=$WORK/run XPULAUNCH_LOCK_DIR=$WORK/locks
mkdir -p "$XDG_RUNTIME_DIR" "$XPULAUNCH_LOCK_DIR"
LOG=$OUT/resume_check.log
: >"$LOG"
N=${NPROC:-$(nvidia-smi -L | grep -c '^GPU')}
GPUS=${GPUS:-$N}  # on the CPU, to try the script: NPROC=4 GPUS=none
say() { printf '%s\n' "$*" | tee -a "$LOG"; }
weights() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights"])' "$WORK/$1/result.json" 2>/dev/null; }
run() {  # NAME COMMAND...
    local name=$1; shift
    timeout 120 "$@" >"$OUT/$name.out" 2>&1
    say "$name: exit $? weights $(weights "$name") ($(grep -c 'resumed from step 10' "$OUT/$name.out") ranks resumed from step 10)"
}
XL=($PY -m xpulaunch run --gpus "$GPUS" --nproc-per-node "$N")
say "$N GPUs, $($PY -c 'import torch; print("torch", torch.__version__)')"
run A "${XL[@]}" examples/train.py --steps 20 --ckpt-dir "$WORK/A"
timeout 120 "${XL[@]}" examples/train.py --steps 10 --ckpt-dir "$WORK/B" >"$OUT/B10.out" 2>&1
run B "${XL[@]}" examples/train.py --steps 20 --ckpt-dir "$WORK/B"
run C "${XL[@]}" --max-restarts 1 --backoff 0 examples/train.py --steps 20 --ckpt-dir "$WORK/C" --crash-at-step 12
run D $PY -m torch.distributed.run --standalone --nproc-per-node "$N" --max-restarts 1 \
    examples/train.py --steps 20 --ckpt-dir "$WORK/D" --crash-at-step 12
run E "${XL[@]}" docs/hardware/ddp_warm_buckets.py --steps 20 --ckpt-dir "$WORK/E"
run F "${XL[@]}" --max-restarts 1 --backoff 0 docs/hardware/ddp_warm_buckets.py --steps 20 \
    --ckpt-dir "$WORK/F" --crash-at-step 12
same() { [ -n "$(weights "$1")" ] && [ "$(weights "$1")" = "$(weights "$2")" ]; }
verdict() { if same "$2" "$3"; then say "PASS: $1"; else say "FAIL: $1"; fi; }
verdict "xpulaunch's restart ends as a resume by hand (C = B)" C B
verdict "xpulaunch's restart ends as torchrun's (C = D)" C D
verdict "with the buckets laid out first, a crash run ends with the uninterrupted weights (F = E)" F E
if same C A; then say "INFO: the crash run also equals the uninterrupted run (C = A)"; else say "INFO: the crash run differs from the uninterrupted run in its last bits (C != A)"; fi
rm -rf "$WORK"
