#!/usr/bin/env bash
# The thirteenth session's GPU evidence (2026-11-26/27). Carry .whl/ (gpu_env.sh's wheels, and
# aiohttp's and uvloop's for the router bench).
#
#     OUT=... bash docs/hardware/session13.sh a   # any kind: the router bench against the
#                                                 # stamped stand-in (what the router adds,
#                                                 # without llama-server's batching), the probe
#                                                 # bench, the launch overhead on one GPU
#     OUT=... bash docs/hardware/session13.sh r   # any kind: the router bench alone
#     OUT=... bash docs/hardware/session13.sh f   # any kind: the router bench with 0, 2, 4, 7
#                                                 # front processes (--front-processes)
#     OUT=... bash docs/hardware/session13.sh g   # any kind: f's bench, each burst sent by 4
#                                                 # client processes, with 0, 2, 4, 8 fronts
#     OUT=... bash docs/hardware/session13.sh q   # any kind: the probe's phases alone
#     OUT=... bash docs/hardware/session13.sh p   # any kind: the probe bench, and its phases
#                                                 # (bench/probe_phases.py)
#
# Each script runs under `timeout`; every log goes into $OUT/phase_X.tar.gz and the verdict
# lines into $OUT/phase_X_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?a, r, f, g, q or p}
SESSION=session13
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
# aiohttp and uvloop for the router, installed as users get them (bytecode compiled)
python3 -m pip install -q --no-index --target /tmp/xpulaunch-site --find-links .whl \
    aiohttp uvloop >>"$R/gpu_env.log" 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/xpulaunch-site .whl/gguf-*.whl \
    >>"$R/gpu_env.log" 2>&1  # the tests' tiny GGUF writer (numpy is the image's)
python3 -c 'import aiohttp, uvloop; print("aiohttp", aiohttp.__version__, "uvloop", uvloop.__version__)' \
    | tee -a "$SUMMARY"

case $PHASE in
a)
    step router_stamped 200 python3 bench/bench_router.py --upstream stamped --rounds 5
    tail -12 "$R/router_stamped/stdout.log" >>"$SUMMARY"
    step probe_bench 150 python3 bench/bench_probe.py --runs 40 --no-torch
    tail -10 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    step overhead_gpu 150 python3 bench/bench_overhead.py --runs 11 --gpus 1
    tail -6 "$R/overhead_gpu/stdout.log" >>"$SUMMARY"
    ;;
r)
    step router_stamped 200 python3 bench/bench_router.py --upstream stamped --rounds 5
    tail -12 "$R/router_stamped/stdout.log" >>"$SUMMARY"
    ;;
f)  # the router bench against the stamped stand-in with 0, 2, 4 and 7 front processes
    for n in 0 2 4 7; do
        step "router_fronts_$n" 130 python3 bench/bench_router.py --upstream stamped --rounds 4 \
            --front-processes "$n"
        tail -12 "$R/router_fronts_$n/stdout.log" | head -10 >>"$SUMMARY"
    done
    ;;
g)  # the router bench with 4 client processes sending each burst: 0, 2, 4, 8 fronts
    for n in 0 2 4 8; do
        step "router_clients4_fronts_$n" 130 python3 bench/bench_router.py --upstream stamped \
            --rounds 4 --client-processes 4 --front-processes "$n"
        tail -12 "$R/router_clients4_fronts_$n/stdout.log" | head -10 >>"$SUMMARY"
    done
    ;;
q)  # the probe's phases alone, with and without NVML's thread
    step probe_phases 120 python3 bench/probe_phases.py --runs 30
    cat "$R/probe_phases/stdout.log" >>"$SUMMARY"
    ;;
p)  # the probe bench (now run in an empty folder) and where its time goes, phase by phase
    step probe_phases 120 python3 bench/probe_phases.py --runs 20 --profile
    cat "$R/probe_phases/stdout.log" >>"$SUMMARY"
    python3 -X importtime -c 'import click, xpulaunch.cli.group, xpulaunch.probing.nvml_start, xpulaunch.probing.host' \
        2>"$R/probe_phases/importtime.log"
    sort -t'|' -k1.13n "$R/probe_phases/importtime.log" | tail -25 >>"$SUMMARY"
    step probe_bench 200 python3 bench/bench_probe.py --runs 40 --no-torch
    tail -10 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    # the same with every command run in the checkout (as before), whose pyproject.toml names
    # xpulaunch: what reading it as a possible config file costs
    step probe_bench_checkout 200 python3 bench/bench_probe.py --runs 40 --no-torch --cwd "$PWD"
    tail -10 "$R/probe_bench_checkout/stdout.log" >>"$SUMMARY"
    ;;
esac
finish_phase
