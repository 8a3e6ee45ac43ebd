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
#
# Each script runs under `timeout`; every log goes into $OUT/phase_X.tar.gz and the verdict
# lines into $OUT/phase_X_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?r}
SESSION=session15
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
# aiohttp and uvloop for the router, installed as users get them (bytecode compiled), and the
# tests' tiny GGUF writer (numpy is the image's)
python3 -m pip install -q --no-index --target /tmp/xpulaunch-site --find-links .whl \
    aiohttp uvloop >>"$R/gpu_env.log" 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/xpulaunch-site .whl/gguf-*.whl \
    >>"$R/gpu_env.log" 2>&1
python3 -c 'import aiohttp, uvloop; print("aiohttp", aiohttp.__version__, "uvloop", uvloop.__version__)' \
    | tee -a "$SUMMARY"

case $PHASE in
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
