#!/usr/bin/env bash
# The fourteenth session's GPU evidence (2026-11-27). Carry .whl/ (gpu_env.sh's wheels) and
# .probe-base/ (the src/ of the commit before this session's import trims, f59b59d: made with
# `git archive f59b59d src | tar -x -C .probe-base`), which the probe bench times in the same
# interleaved rounds.
#
#     OUT=... bash docs/hardware/session14.sh p   # any kind: the probe bench, this code and
#                                                 # the code before, then the probe's phases
#     OUT=... bash docs/hardware/session14.sh o   # any kind: p, then the launch overhead on
#                                                 # one GPU against torchrun
#     OUT=... bash docs/hardware/session14.sh q   # 2 GPUs: queue_check.sh and
#                                                 # processes_check.sh after this session's
#                                                 # simplification of leases, slots, the
#                                                 # supervisor and the queue
#     OUT=... bash docs/hardware/session14.sh m   # 2 or 4 GPUs: multinode_check.sh (NCCL,
#                                                 # restarts, kill -9 of a node, leases)
#
# Each script runs under `timeout`; every log goes into $OUT/phase_X.tar.gz and the verdict
# lines into $OUT/phase_X_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?p, o, q or m}
SESSION=session14
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh

case $PHASE in
q)
    step queue_check 330 bash docs/hardware/queue_check.sh
    step processes_check 200 bash docs/hardware/processes_check.sh
    finish_phase
    exit 0
    ;;
m)
    step multinode_check 560 bash docs/hardware/multinode_check.sh
    finish_phase
    exit 0
    ;;
esac
step probe_bench 300 python3 bench/bench_probe.py --runs 40 --no-torch --compare-src .probe-base/src
tail -10 "$R/probe_bench/stdout.log" >>"$SUMMARY"
step probe_phases 120 python3 bench/probe_phases.py --runs 20
cat "$R/probe_phases/stdout.log" >>"$SUMMARY"
if [ "$PHASE" = o ]; then
    step overhead_gpu 200 python3 bench/bench_overhead.py --runs 11 --gpus 1
    tail -6 "$R/overhead_gpu/stdout.log" >>"$SUMMARY"
fi
finish_phase
