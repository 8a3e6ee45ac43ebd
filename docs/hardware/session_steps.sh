#!/usr/bin/env bash
# Sourced by the sessionNN.sh scripts, after `cd` to the repository root and PHASE and SESSION
# set: the NVLS-off settings, gpu_env.sh's wheels, a work folder $R, the phase's summary file,
# note() and step(). Every log of a phase goes into $R, tarred at the end by finish_phase.
: "${OUT:?set OUT}" "${PHASE:?}" "${SESSION:?}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
R=$(mktemp -d "/tmp/$SESSION-$PHASE.XXXX")
SUMMARY=$OUT/phase_${PHASE}_summary.txt
mkdir -p "$OUT"
: >"$SUMMARY"
note() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
# gpu_env.sh: click, psutil, nvidia-ml-py, pytest... from .whl/ where python3 lacks them
# shellcheck source=/dev/null
source docs/hardware/gpu_env.sh >"$R/gpu_env.log" 2>&1
note "$SESSION $PHASE on $(hostname): $(nvidia-smi -L | wc -l) GPUs, $(nproc) CPUs; $(python3 -V); commit $(git log -1 --format=%h 2>/dev/null)"
nvidia-smi -L >>"$SUMMARY"

step() {  # NAME SECONDS COMMAND...: run with a bound; keep its output; summarise its verdicts
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    note "--- $name (limit $limit s)"
    mkdir -p "$R/$name"
    OUT="$R/$name" timeout -k 10 "$limit" "$@" >"$R/$name/stdout.log" 2>&1
    local rc=$?
    grep -hE '^(PASS|FAIL|UNVERIFIED|INFO)|^\| [0-9]+ \|' "$R/$name"/*.log "$R/$name"/*.md \
        2>/dev/null | sort -u >>"$SUMMARY"
    note "--- $name: exit $rc after $((SECONDS - start)) s"
}

finish_phase() {  # one tarball of every log of the phase (the device returns at most 8 files)
    tar -czf "$OUT/phase_$PHASE.tar.gz" -C "$R" .
    note "phase $PHASE done after $SECONDS s"
}
