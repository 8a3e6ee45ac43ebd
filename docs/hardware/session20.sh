#!/usr/bin/env bash
# The twentieth session's second call on the lent one-GPU machine (nvidia-h200, 16 cores):
# after `session19.sh b` (the fronts route loaded models themselves, p99 goal not met), the
# same bench with 16 fronts in place of 8, twice: does a smaller share of each burst per event
# loop take the p99 down? Carry .whl/ (gpu_env.sh's and the router's wheels). From the
# repository root:
#
#     bash docs/hardware/session20.sh f
#
# Logs go into $OUT/phase_f.tar.gz and the verdict lines into $OUT/phase_f_summary.txt.
set -u
cd "$(dirname "$0")/../.." || exit 2
PHASE=${1:?f}
SESSION=session20
# shellcheck source=docs/hardware/session_steps.sh
source docs/hardware/session_steps.sh
router_wheels  # and says their versions

case $PHASE in
f)
    for run in 1 2; do
        step "fronts16_$run" 100 python3 bench/bench_router.py --upstream stamped \
            --front-processes 16 --client-processes 4 --rounds 4 --leavers 0
        grep -E 'reaches|one at a time|lost|took' "$R/fronts16_$run/stdout.log" >>"$SUMMARY"
    done
    ;;
esac
finish_phase
