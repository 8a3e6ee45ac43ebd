#!/usr/bin/env bash
# The sixteenth session's GPU evidence (2026-11-27): the code after this session's four bug
# hunts (the supervisor and signals, leases, torchrun/accelerate, what users read), checked
# again by every check script that needs no llama.cpp build. Carry .whl/ (gpu_env.sh's wheels).
#
#     OUT=... bash docs/hardware/session16.sh m   # 4 GPUs: multinode_check.sh (NCCL on one
#                                                 # node, static and c10d "nodes", 2 + 1
#                                                 # workers, kill -9 of a node, --hang-timeout
#                                                 # in NCCL, leases between jobs)
#     OUT=... bash docs/hardware/session16.sh t   # 2 or 4 GPUs, right after m: train_check.sh
#                                                 # (DDP, a gang restart, --isolate, kill -9),
#                                                 # queue_check.sh, processes_check.sh,
#                                                 # probe_check.sh, then the probe bench
#     OUT=... bash docs/hardware/session16.sh q   # 2 GPUs: queue_check.sh and probe_check.sh
#                                                 # again, after t found both scripts stale
#                                                 # (queue_check counted on 2 GPUs and ran on
#                                                 # 4; probe_check imported a function gone
#                                                 # since round 2 of the house)
#     OUT=... bash docs/hardware/session16.sh l   # 2 GPUs: build the CUDA llama-server, then
#                                                 # llama_serve_check.sh (the router on the
#                                                 # final code); carry .device-carry/ too
#     OUT=... bash docs/hardware/session16.sh p   # 1 GPU: the probe bench (40 runs) and its
#                                                 # phases on the final code
#
# Each script runs under `timeout`; every log goes into $OUT/phase_X.tar.gz and the verdict
# lines into $OUT/phase_X_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?m, t, q, l or p}
SESSION=session16
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh

case $PHASE in
m)
    step multinode_check 560 bash docs/hardware/multinode_check.sh
    ;;
t)
    step train_check 200 bash docs/hardware/train_check.sh
    step queue_check 200 bash docs/hardware/queue_check.sh
    step processes_check 60 bash docs/hardware/processes_check.sh
    step probe_check 60 bash docs/hardware/probe_check.sh
    step probe_bench 100 python3 bench/bench_probe.py --runs 30 --no-torch
    tail -10 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    ;;
l)
    router_wheels
    LLAMA_BUILD_DIR=/tmp/llama-cuda
    (time timeout 330 bash -c "$(declare -f build_llama); LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR build_llama") \
        >"$R/llama_build.log" 2>&1
    note "llama.cpp build: exit $? ($(grep real "$R/llama_build.log"))"
    step llama_serve 230 env LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR bash docs/hardware/llama_serve_check.sh
    ;;
p)
    probe_bench_and_phases 200
    ;;
q)
    step queue_check 200 bash docs/hardware/queue_check.sh
    step probe_check 200 bash docs/hardware/probe_check.sh
    ;;
esac
finish_phase
