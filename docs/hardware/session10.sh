#!/usr/bin/env bash
# The tenth session's GPU evidence (2026-11-26), on one lent 2-GPU NVIDIA machine
# (nvidia-h100-x2 / nvidia-h200-x2), in two calls of at most ~9.5 minutes each. Carry .whl/
# (gpu_env.sh's wheels) and .device-carry/ (llama_serve_check.sh's sdist and wheels).
#
#     OUT=... bash docs/hardware/session10.sh a   # llama.cpp's CUDA build in the background;
#                                                 # multinode_check.sh; bench_probe.py
#     OUT=... bash docs/hardware/session10.sh c   # the DDP bench on 2 GPUs, the probe bench,
#                                                 # the launch overhead and one-GPU training
#     OUT=... bash docs/hardware/session10.sh d   # the overheads again (--gpus none, 1) and
#                                                 # a longer DDP bench
#     OUT=... bash docs/hardware/session10.sh e   # on one GPU (nvidia-h100-x1): the probe
#                                                 # bench and the launch overhead of --gpus 1
#     OUT=... bash docs/hardware/session10.sh f   # on one GPU: the probe bench, with the code
#                                                 # before "devices: end NVML" as a peer (run
#                                                 # at ba8877c; that change was reverted)
#     OUT=... bash docs/hardware/session10.sh g   # on one GPU: bench/nvml_tick.py
#     OUT=... bash docs/hardware/session10.sh b   # llama_serve_check.sh (build reused);
#                                                 # numa_check.sh; launch overhead and
#                                                 # one-GPU training benches; queue_check.sh
#
# Each script runs under `timeout`, so that a call ends within the device's limit; every log
# goes into one tarball per phase ($OUT/phase_X.tar.gz) and the PASS/FAIL lines into
# $OUT/phase_X_summary.txt (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?a or b}
SESSION=session10
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh

LLAMA_BUILD_DIR=/tmp/llama-cuda  # build_llama (session_steps.sh) builds there

case $PHASE in
a)
    (time timeout 470 bash -c "$(declare -f build_llama); LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR build_llama") \
        >"$R/llama_build.log" 2>&1 &
    BUILD=$!
    step multinode 420 env HARD_STOP_S=400 BUDGET_S=380 bash docs/hardware/multinode_check.sh
    step probe_bench 60 python3 bench/bench_probe.py --runs 15
    cp "$R/probe_bench/stdout.log" "$R/probe_bench/bench_probe.log"
    tail -5 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    wait "$BUILD"
    note "llama.cpp build: exit $? ($(grep real "$R/llama_build.log"))"
    ;;
b)
    if [ ! -x "$LLAMA_BUILD_DIR/build/bin/llama-fit-params" ]; then  # phase a ran out of time
        (time timeout 150 nice -n 10 cmake --build "$LLAMA_BUILD_DIR/build" -j "$(nproc)" \
            --target llama-server llama-fit-params) >"$R/llama_build.log" 2>&1
        note "llama.cpp build finished here: exit $?"
    fi
    step llama_serve 240 env LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR bash docs/hardware/llama_serve_check.sh
    step numa 120 bash docs/hardware/numa_check.sh
    step overhead 45 python3 bench/bench_overhead.py --runs 11
    tail -4 "$R/overhead/stdout.log" >>"$SUMMARY"
    step train 90 env CUDA_VISIBLE_DEVICES=0 python3 bench/bench_train.py --runs 2 --steps 3000
    tail -6 "$R/train/stdout.log" >>"$SUMMARY"
    left=$((575 - SECONDS))
    if [ "$left" -gt 30 ]; then
        step queue "$left" bash docs/hardware/queue_check.sh
    else
        note "--- queue: skipped, $left s left"
    fi
    ;;
c)
    step ddp_bench 200 python3 bench/bench_ddp.py --gpus 2 --runs 3 --steps 500
    tail -8 "$R/ddp_bench/stdout.log" >>"$SUMMARY"
    step overhead 60 python3 bench/bench_overhead.py --runs 11
    tail -4 "$R/overhead/stdout.log" >>"$SUMMARY"
    step train 120 env CUDA_VISIBLE_DEVICES=0 python3 bench/bench_train.py --runs 2 --steps 3000
    tail -6 "$R/train/stdout.log" >>"$SUMMARY"
    step probe_bench 100 python3 bench/bench_probe.py --runs 8
    tail -12 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    ;;
d)  # after the probe was forked before the supervisor's imports: the overheads again
    step overhead_none 60 python3 bench/bench_overhead.py --runs 15
    tail -4 "$R/overhead_none/stdout.log" >>"$SUMMARY"
    step overhead_gpu 60 python3 bench/bench_overhead.py --runs 15 --gpus 1
    tail -4 "$R/overhead_gpu/stdout.log" >>"$SUMMARY"
    step ddp_bench 200 python3 bench/bench_ddp.py --gpus 2 --runs 2 --steps 2000
    tail -8 "$R/ddp_bench/stdout.log" >>"$SUMMARY"
    ;;
e)  # one GPU: the probe's ratio to a bare NVML process, and --gpus 1's overhead
    step probe_bench 90 python3 bench/bench_probe.py --runs 10
    tail -12 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    step overhead_gpu 70 python3 bench/bench_overhead.py --runs 11 --gpus 1
    tail -4 "$R/overhead_gpu/stdout.log" >>"$SUMMARY"
    ;;
f)  # one GPU: the probe with and without ending NVML before exit, in one run
    mkdir -p /tmp/before && cp -r src/xpulaunch /tmp/before/ &&
        patch -R -p2 -d /tmp/before <docs/hardware/2026-11-26-h100x1/nvml_shutdown.patch
    step probe_bench 200 python3 bench/bench_probe.py --runs 16 --compare-src /tmp/before
    tail -14 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    ;;
g)  # one GPU: does something NVML starts round a process's end up to a period of its own?
    step nvml_tick 150 python3 bench/nvml_tick.py --runs 16
    cat "$R/nvml_tick/stdout.log" >>"$SUMMARY"
    ;;
esac
finish_phase
