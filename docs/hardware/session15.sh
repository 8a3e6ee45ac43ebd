#!/usr/bin/env bash
# The fifteenth session's GPU-host evidence (2026-11-27). Carry .whl/ (gpu_env.sh's wheels) and
# .probe-base/ (the src/ of the code before this session's change, made with
# `git archive BASE src | tar -x -C .probe-base`), which each bench runs in the same call.
#
#     OUT=... bash docs/hardware/session15.sh r   # any kind, 16 cores: the router bench with
#                                                 # the stamped stand-in and 4 client processes,
#                                                 # 4 and 8 fronts, the code before (fronts ask
#                                                 # the router for every request) and this
#                                                 # code (fronts route loaded models
#                                                 # themselves), alternating
#     OUT=... bash docs/hardware/session15.sh b   # 2 GPUs: build the CUDA llama-server and
#                                                 # llama-fit-params (in the background) while
#                                                 # queue_check.sh and processes_check.sh run
#     OUT=... bash docs/hardware/session15.sh l   # the same machine, right after b:
#                                                 # llama_serve_check.sh on the build (the
#                                                 # router on two GPUs after session 14's
#                                                 # simplification and this session's fixes),
#                                                 # then processes_check.sh again
#     OUT=... bash docs/hardware/session15.sh q   # 2 GPUs: queue_check.sh and
#                                                 # processes_check.sh on the code after this
#                                                 # session's queue fixes (the runner's start,
#                                                 # adoption and cancel paths)
#     OUT=... bash docs/hardware/session15.sh p   # any kind: the probe bench (40 runs, in an
#                                                 # empty folder) and its phases
#
# b and l also carry .device-carry/ (llama_serve_check.sh's sdist and wheels).
#
# Each script runs under `timeout`; every log goes into $OUT/phase_X.tar.gz and the verdict
# lines into $OUT/phase_X_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?r, b, l, q or p}
SESSION=session15
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
router_wheels
python3 -c 'import aiohttp, uvloop; print("aiohttp", aiohttp.__version__, "uvloop", uvloop.__version__)' \
    | tee -a "$SUMMARY"

LLAMA_BUILD_DIR=/tmp/llama-cuda  # build_llama (session_steps.sh) builds there

case $PHASE in
p)
    probe_bench_and_phases 300
    ;;
q)
    step queue_check 330 bash docs/hardware/queue_check.sh
    step processes_check 200 bash docs/hardware/processes_check.sh
    ;;
b)
    (time timeout 560 bash -c "$(declare -f build_llama); LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR build_llama") \
        >"$R/llama_build.log" 2>&1 &
    BUILD=$!
    step queue_check 330 bash docs/hardware/queue_check.sh
    step processes_check 200 bash docs/hardware/processes_check.sh
    wait "$BUILD"
    note "llama.cpp build: exit $? ($(grep real "$R/llama_build.log"))"
    ;;
l)
    if [ ! -x "$LLAMA_BUILD_DIR/build/bin/llama-fit-params" ]; then  # b ran out of time
        (time timeout 200 nice -n 10 cmake --build "$LLAMA_BUILD_DIR/build" -j "$(nproc)" \
            --target llama-server llama-fit-params) >"$R/llama_build.log" 2>&1
        note "llama.cpp build finished here: exit $?"
    fi
    step llama_serve 380 env LLAMA_BUILD_DIR=$LLAMA_BUILD_DIR bash docs/hardware/llama_serve_check.sh
    # again, now waiting for the holder's allocation (b's run compared a 14 MiB snapshot of
    # nvidia-smi, taken before it, with ours taken after)
    step processes_check 200 bash docs/hardware/processes_check.sh
    ;;
r)
    note "base: .probe-base/src ($(ls .probe-base/src/xpulaunch | wc -l) entries)"
    for n in 8 4; do
        for code in before this; do
            src=$PWD/src
            [ "$code" = before ] && src=$PWD/.probe-base/src
            step "router_fronts_${n}_$code" 130 env PYTHONPATH="$src" python3 bench/bench_router.py \
                --upstream stamped --rounds 4 --client-processes 4 --front-processes "$n"
            grep -E "router with|request reaches|event reaches|one at a time|lost:" \
                "$R/router_fronts_${n}_$code/stdout.log" >>"$SUMMARY"
        done
    done
    ;;
esac
finish_phase
