#!/usr/bin/env bash
# The twelfth session's GPU evidence (2026-11-26), the first on a lent 4-GPU NVIDIA machine
# (nvidia-h100-x4 / nvidia-h200-x4), in calls of at most ~9.5 minutes each. Carry .whl/
# (gpu_env.sh's wheels).
#
#     OUT=... bash docs/hardware/session12.sh a   # 4 GPUs: multinode_check.sh, sections 0-6
#                                                 # (the 2 + 1 job needs 4 GPUs); no bench
#     OUT=... bash docs/hardware/session12.sh b   # 4 GPUs: the probe bench with --per-call,
#                                                 # the DDP bench on 4 and 2 GPUs,
#                                                 # numa_check.sh, the launch overheads
#     OUT=... bash docs/hardware/session12.sh d   # 4 GPUs: the probe bench again (b's ran past
#                                                 # its bound), resume_check.sh
#     OUT=... bash docs/hardware/session12.sh e   # any kind: the probe bench, measured with a
#                                                 # blocking wait (bench_probe.wall_time)
#     OUT=... bash docs/hardware/session12.sh f   # any kind: phase c's probe bench alone
#     OUT=... bash docs/hardware/session12.sh c   # one GPU: the launch overhead and the probe
#                                                 # of this tree against a second source tree
#                                                 # carried in .device-carry/src-before
#
# Each script runs under `timeout`, so that a call ends within the device's limit; every log
# goes into one tarball per phase ($OUT/phase_X.tar.gz) and the PASS/FAIL lines into
# $OUT/phase_X_summary.txt (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?a, b, c, d, e or f}
SESSION=session12
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
nvidia-smi topo -m >>"$SUMMARY" 2>&1

case $PHASE in
a)  # the bench (section 7) is phase b's: BUDGET_S=0 skips it
    step multinode 560 env HARD_STOP_S=540 BUDGET_S=0 bash docs/hardware/multinode_check.sh
    ;;
b)
    step probe_bench 130 python3 bench/bench_probe.py --runs 24 --per-call
    tail -22 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    step ddp4 150 python3 bench/bench_ddp.py --gpus 4 --runs 2 --steps 1000
    tail -8 "$R/ddp4/stdout.log" >>"$SUMMARY"
    step ddp2 110 python3 bench/bench_ddp.py --gpus 2 --runs 2 --steps 1000
    tail -8 "$R/ddp2/stdout.log" >>"$SUMMARY"
    left=$((560 - SECONDS))
    if [ "$left" -gt 60 ]; then
        step numa $((left > 110 ? 110 : left)) bash docs/hardware/numa_check.sh
        grep -E '^(node|GPU|nvidia|[0-9])' "$R/numa/layout.txt" 2>/dev/null | head -20 >>"$SUMMARY"
        tail -12 "$R/numa/h2d.csv" >>"$SUMMARY" 2>/dev/null
    else
        note "--- numa: skipped, $left s left"
    fi
    left=$((570 - SECONDS))
    if [ "$left" -gt 30 ]; then
        step overhead_gpu "$left" python3 bench/bench_overhead.py --runs 11 --gpus 1
        tail -4 "$R/overhead_gpu/stdout.log" >>"$SUMMARY"
    else
        note "--- overhead_gpu: skipped, $left s left"
    fi
    ;;
d)
    step resume 240 bash docs/hardware/resume_check.sh
    step probe_bench 200 python3 bench/bench_probe.py --runs 12 --per-call
    tail -26 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    ;;
e)  # any kind: the probe bench with the blocking wait (its figures before were rounded up to
    # Popen.wait's 50 ms polls), and each NVML call's cost
    step probe_bench 200 python3 bench/bench_probe.py --runs 20 --per-call --no-torch
    tail -34 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    ;;
f)  # any kind: the probe bench alone, this tree against .device-carry/src-before
    step probe_bench 150 python3 bench/bench_probe.py --runs 20 --no-torch \
        --compare-src .device-carry/src-before
    tail -14 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    ;;
c)  # one GPU: this tree against .device-carry/src-before (the code before a change)
    step probe_bench 200 python3 bench/bench_probe.py --runs 20 --no-torch \
        --compare-src .device-carry/src-before
    tail -14 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    step overhead_gpu 200 python3 bench/bench_overhead.py --runs 11 --gpus 1 \
        --against-src .device-carry/src-before
    tail -6 "$R/overhead_gpu/stdout.log" >>"$SUMMARY"
    ;;
esac
finish_phase
