#!/usr/bin/env bash
# The twentieth session's second call on the lent one-GPU machine (nvidia-h200, 16 cores):
# after `session19.sh b` (the fronts route loaded models themselves, p99 goal not met), the
# same bench with 16 fronts in place of 8, twice: does a smaller share of each burst per event
# loop take the p99 down? Carry .whl/ (gpu_env.sh's and the router's wheels). From the
# repository root:
#
#     bash docs/hardware/session20.sh f    # 16 fronts, twice (run in session 20)
#     bash docs/hardware/session20.sh s    # 8 fronts, then 16, three times each, alternating
#                                          # on one machine (owed: about 6.5 min)
#
# Logs go into $OUT/phase_PHASE.tar.gz and the verdict lines into $OUT/phase_PHASE_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?f or s}
SESSION=session20
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
router_wheels  # and says their versions

bench() {  # NAME FRONTS: the bench with that many front processes
    step "$1" 100 python3 bench/bench_router.py --upstream stamped \
        --front-processes "$2" --client-processes 4 --rounds 4 --leavers 0
    grep -E 'reaches|one at a time|lost|took' "$R/$1/stdout.log" >>"$SUMMARY"
}

case $PHASE in
f)
    for run in 1 2; do
        bench "fronts16_$run" 16
    done
    ;;
s)
    for run in 1 2 3; do
        bench "fronts8_$run" 8
        bench "fronts16_$run" 16
    done
    ;;
esac
finish_phase
