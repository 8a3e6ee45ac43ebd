#!/usr/bin/env bash
# Session 4 on a lent one-GPU NVIDIA machine (H100 or H200): the redesigned code ("Ordinary
# Python": click, stdlib dataclasses, the new proc/ seams) on a real GPU. From the repo root:
#
#     OUT=/some/dir bash docs/hardware/run4_checks.sh checks   # probe vs nvidia-smi, DDP, restart, kill -9
#     OUT=/some/dir bash docs/hardware/run4_checks.sh bench    # overhead ratio, whole training runs
#
# Installs as users get them: the wheels carried in .device-carry/new (this commit) and
# .device-carry/old (the commit before the redesign, 2059dd8) are pip-installed with bytecode
# compiled, into /tmp/xl-new and /tmp/xl-old, for the benches; the checks run the checkout's
# src/. Logs go to $OUT/run4_$1/, packed into $OUT/run4_$1.tar.gz (the device returns few files).
set -u
cd "$(dirname "$0")/../.." || exit 2
: "${OUT:?set OUT}"
LOGS=$OUT/run4_$1
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
for v in new old; do
    python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/xl-$v .device-carry/$v/xpulaunch-*.whl
done
{
    date -u; nvidia-smi -L; python3 -V; uname -r; setpriv --version
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    python3 -m pip show click psutil nvidia-ml-py 2>/dev/null | grep -E '^(Name|Version)'
    ls /tmp/xl-new/xpulaunch/__pycache__ | head -3
} >"$LOGS/env.log" 2>&1
case $1 in
checks)
    OUT=$LOGS timeout 240 bash docs/hardware/probe_check.sh >/dev/null 2>&1
    echo "probe_check exit $?" >>"$LOGS/summary.log"
    NGPU=1 OUT=$LOGS timeout 300 bash docs/hardware/train_check.sh \
        >/dev/null 2>&1
    echo "train_check exit $?" >>"$LOGS/summary.log"
    ;;
bench)
    export PYTHONPATH=/tmp/xl-new  # the bench modules import xpulaunch; each command picks its own
    timeout 200 python3 bench/bench_overhead.py --runs 20 --src /tmp/xl-new \
        --against-src /tmp/xl-old >"$LOGS/bench_overhead.log" 2>&1
    echo "bench_overhead exit $?" >>"$LOGS/summary.log"
    timeout 420 python3 bench/bench_train.py --runs ${TRAIN_RUNS:-5} --steps ${TRAIN_STEPS:-2000} --src /tmp/xl-new \
        >"$LOGS/bench_train.log" 2>&1
    echo "bench_train exit $?" >>"$LOGS/summary.log"
    ;;
train)  # the training bench alone, longer (TRAIN_RUNS, TRAIN_STEPS), and the probe's speed
    export PYTHONPATH=/tmp/xl-new
    timeout 470 python3 bench/bench_train.py --runs "${TRAIN_RUNS:-7}" --steps "${TRAIN_STEPS:-3000}" \
        --src /tmp/xl-new >"$LOGS/bench_train.log" 2>&1
    echo "bench_train exit $?" >>"$LOGS/summary.log"
    timeout 100 python3 bench/bench_probe.py --runs 15 >"$LOGS/bench_probe.log" 2>&1
    echo "bench_probe exit $?" >>"$LOGS/summary.log"
    ;;
esac
cat "$LOGS/summary.log"
grep -hE '^(PASS|FAIL|INFO|UNVERIFIED)' "$LOGS"/*.log | sort | uniq -c | sort -rn | head -40
tail -n 12 "$LOGS"/bench_*.log 2>/dev/null
tar -C "$OUT" -czf "$OUT/run4_$1.tar.gz" "run4_$1" && rm -rf "$LOGS"
