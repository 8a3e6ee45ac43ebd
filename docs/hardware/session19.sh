#!/usr/bin/env bash
# The nineteenth session's call on the lent one-GPU machine (nvidia-h200, 16 cores): the
# router's burst p99 with one shared accept queue (the router and its fronts take connections
# from one listening socket, each when it is free) and the servers' health checks reading
# listening sockets by netlink, against the code before (SO_REUSEPORT sockets, the whole of
# /proc/net/tcp at each check). Carry .whl/ (gpu_env.sh's and the router's wheels) and
# .device-carry/ (before.tar: `git archive 58013db src`; netlink.tar: that with this
# session's procfs.py alone). From the repository root:
#
#     bash docs/hardware/session19.sh a    # (now = shared_accept.patch, since dropped)
#                                          # bench_router.py (stamped stand-in, 8 fronts, 4
#                                          # client processes, 4 rounds): before, netlink
#                                          # only, now three times in a row, netlink only,
#                                          # before
#     bash docs/hardware/session19.sh b    # the same with the fronts routing loaded models
#                                          # themselves: before, now three times in a row,
#                                          # before, then now once traced
#     bash docs/hardware/session19.sh t    # the bench twice with trace/sitecustomize.py:
#                                          # where the slowest burst requests spend their time
#                                          # (trace/analyse.py)
#
# Logs go into $OUT/phase_a.tar.gz and the verdict lines into $OUT/phase_a_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?a, b or t}
SESSION=session19
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
router_wheels  # and says their versions
BEFORE=/tmp/before NETLINK=/tmp/netlink
mkdir -p "$BEFORE" "$NETLINK"
tar -xf .device-carry/before.tar -C "$BEFORE" && tar -xf .device-carry/netlink.tar -C "$NETLINK"

bench() {  # NAME SRC: the bench with the router's code from SRC
    step "$1" 100 env PYTHONPATH="$2" python3 bench/bench_router.py --upstream stamped \
        --front-processes 8 --client-processes 4 --rounds 4 --leavers 0
    grep -E 'reaches|one at a time|lost|took' "$R/$1/stdout.log" >>"$SUMMARY"
}

traced() {  # RUN: the bench once, traced (trace/sitecustomize.py), and trace/analyse.py
    local run=$1
    mkdir -p "$R/trace_$run"
    step "traced_$run" 100 env PYTHONPATH="$PWD/docs/hardware/trace:$PWD/src" \
        XPULAUNCH_TRACE_DIR="$R/trace_$run" python3 bench/bench_router.py --upstream stamped \
        --front-processes 8 --client-processes 4 --rounds 4 --leavers 0 \
        --trace "$R/trace_$run/bench.jsonl"
    grep -E 'reaches|took' "$R/traced_$run/stdout.log" >>"$SUMMARY"
    python3 docs/hardware/trace/analyse.py "$R/trace_$run/bench.jsonl" "$R/trace_$run" \
        >>"$SUMMARY" 2>&1
}

case $PHASE in
a)
    bench before_1 "$BEFORE/src"
    bench netlink_1 "$NETLINK/src"
    for run in 1 2 3; do
        bench "now_$run" "$PWD/src"
    done
    bench netlink_2 "$NETLINK/src"
    bench before_2 "$BEFORE/src"
    ;;
b)
    bench before_1 "$BEFORE/src"
    for run in 1 2 3; do
        bench "now_$run" "$PWD/src"
    done
    bench before_2 "$BEFORE/src"
    traced 1
    ;;
t)
    traced 1
    traced 2
    ;;
esac
finish_phase
