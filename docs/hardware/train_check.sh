#!/usr/bin/env bash
# DDP through xpulaunch on an NVIDIA host (written for 2x H200; offline is fine).
#
#   bash docs/hardware/train_check.sh            # from the repository root, 2 GPUs
#   NGPU=1 bash docs/hardware/train_check.sh     # a one-GPU host (H100, H200)
#
# Checks, each printed as PASS/FAIL/INFO and logged to "$OUT/train_check.log" when OUT is set:
#   1. --gpus $NGPU --nproc-per-node auto runs NCCL DDP; each worker reports its GPU's UUID, the
#      UUIDs differ and are the ones nvidia-smi lists.
#   2. --crash-at-step 12 with --max-restarts 1: one gang restart, both ranks resume from the
#      step-10 checkpoint and finish; same final weights as the uninterrupted run (INFO only:
#      bitwise equality on GPUs depends on the kernels).
#   3. --isolate: each worker sees exactly one GPU (CUDA_VISIBLE_DEVICES has one entry, the
#      entries differ, both use cuda:0) and DDP still finishes.
#   4. kill -9 of xpulaunch during a run: no worker survives and the GPUs hold no process
#      of ours within 20 s (PR_SET_PDEATHSIG + the guardian).
set -u
cd "$(dirname "$0")/../.." || exit 1

export PYTHONPATH=src
# Multicast/NVLS off on this machine (see the device notes of the hardware docs).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
NGPU=${NGPU:-2}
WORK=$(mktemp -d)
LOG=${OUT:+$OUT/train_check.log}
LOG=${LOG:-$WORK/train_check.log}
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
: >"$LOG"
fails=0

say() { printf '%s\n' "$*" | tee -a "$LOG"; }
pass() { say "PASS: $*"; }
fail() { say "FAIL: $*"; fails=$((fails + 1)); }
info() { say "INFO: $*"; }
xpl() { $PY -m xpulaunch "$@"; }

say "== host"
nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,memory.used --format=csv 2>&1 | tee -a "$LOG"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tee -a "$LOG"
mapfile -t SMI_UUIDS < <(nvidia-smi --query-gpu=uuid --format=csv,noheader | sort)

say "== plan"
xpl run --dry-run --gpus $NGPU --nproc-per-node auto examples/train.py 2>&1 | tee -a "$LOG"

uuids_of() { grep -o 'uuid GPU-[0-9a-f-]*' "$1" | awk '{print $2}' | sort -u; }

say "== 1. NCCL DDP on $NGPU GPU(s)"
OUT1=$WORK/ddp.out
xpl run --gpus $NGPU --nproc-per-node auto examples/train.py --ckpt-dir "$WORK/ckpt1" \
  >"$OUT1" 2>&1
rc=$?
tee -a "$LOG" <"$OUT1" | grep -E 'rank [0-9]+/|done at|error' || true
[ $rc -eq 0 ] && pass "ddp exit status 0" || fail "ddp exit status $rc"
grep -q 'backend nccl' "$OUT1" && pass "backend nccl" || fail "backend is not nccl"
known() { printf '%s\n' "${SMI_UUIDS[@]}" | grep -qx "$1"; }
mapfile -t GOT < <(uuids_of "$OUT1")
all_known() { for u in "$@"; do known "$u" || return 1; done; }
if [ ${#GOT[@]} -eq "$NGPU" ] && all_known "${GOT[@]}"; then
  pass "$NGPU worker(s) on $NGPU different GPU(s): ${GOT[*]}"
else
  fail "worker GPU UUIDs ${GOT[*]:-none} (nvidia-smi: ${SMI_UUIDS[*]})"
fi
[ "$(grep -c 'done at step 20' "$OUT1")" -eq "$NGPU" ] && pass "every rank finished" \
  || fail "not every rank finished"

say "== 2. crash at step 12, gang restart, resume"
OUT2=$WORK/crash.out
xpl run --gpus $NGPU --nproc-per-node auto --max-restarts 1 --backoff 0 examples/train.py \
  --ckpt-dir "$WORK/ckpt2" --crash-at-step 12 >"$OUT2" 2>&1
rc=$?
tee -a "$LOG" <"$OUT2" | grep -E 'crash|restart|resumed|done at|error|GPU memory' || true
[ $rc -eq 0 ] && pass "crash run exit status 0" || fail "crash run exit status $rc"
grep -q 'simulated crash at step 12' "$OUT2" && pass "crashed at step 12" || fail "no crash seen"
grep -qE 'restarting (all workers|worker 0)' "$OUT2" && pass "gang restart" || fail "no gang restart"
[ "$(grep -c 'resumed from step 10' "$OUT2")" -eq "$NGPU" ] && pass "every rank resumed at 10" \
  || fail "not every rank resumed from step 10"
[ "$(grep -c 'done at step 20' "$OUT2")" -eq "$NGPU" ] && pass "every rank finished after restart" \
  || fail "not every rank finished after the restart"
w1=$(cat "$WORK/ckpt1/result.json" 2>/dev/null)
w2=$(cat "$WORK/ckpt2/result.json" 2>/dev/null)
[ "$w1" = "$w2" ] && info "final weights equal the uninterrupted run: $w2" \
  || info "final weights differ from the uninterrupted run: $w1 vs $w2"

say "== 3. --isolate: one GPU per worker"
OUT3=$WORK/isolate.out
xpl run --gpus $NGPU --nproc-per-node auto --isolate examples/train.py --ckpt-dir "$WORK/ckpt3" \
  >"$OUT3" 2>&1
rc=$?
tee -a "$LOG" <"$OUT3" | grep -E 'rank [0-9]+/|done at|error' || true
mapfile -t CVDS < <(grep -o 'CUDA_VISIBLE_DEVICES=[^ ]*' "$OUT3" | sort -u)
if [ ${#CVDS[@]} -eq "$NGPU" ] && ! printf '%s\n' "${CVDS[@]}" | grep -q ','; then
  pass "each worker sees one GPU: ${CVDS[*]}"
else
  fail "isolate visibility: ${CVDS[*]:-none}"
fi
[ "$(grep -c 'device cuda:0' "$OUT3")" -eq "$NGPU" ] && pass "every worker uses cuda:0" || fail "not every worker on cuda:0"
mapfile -t GOT3 < <(uuids_of "$OUT3")
[ ${#GOT3[@]} -eq "$NGPU" ] && pass "isolated workers on different GPUs: ${GOT3[*]}" \
  || fail "isolated worker UUIDs: ${GOT3[*]:-none}"
[ $rc -eq 0 ] && pass "isolated NCCL DDP finished" || fail "isolated DDP exit status $rc"

say "== 4. kill -9 of xpulaunch leaves no GPU process"
# Started directly (not through the xpl function) so that $! is xpulaunch's own pid.
$PY -m xpulaunch run --gpus $NGPU --nproc-per-node auto examples/train.py \
  --ckpt-dir "$WORK/ckpt4" --steps 100000000 --ckpt-every 100000000 >"$WORK/kill.out" 2>&1 &
sup=$!
for _ in $(seq 1 120); do
  [ "$(grep -c 'step .* loss' "$WORK/kill.out")" -gt 5 ] && break
  sleep 0.5
done
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr '\n' ' '; }
workers() { pgrep -f "ckpt-dir $WORK/ckpt4" | tr '\n' ' '; }
info "while training: workers $(workers), GPU processes $(apps)"
[ -n "$(workers)" ] || fail "no training workers found before the kill"
kill -9 "$sup"
wait "$sup" 2>/dev/null
gone=no
for _ in $(seq 1 40); do
  if [ -z "$(apps | tr -d ' ')" ] && [ -z "$(workers)" ]; then gone=yes; break; fi
  sleep 0.5
done
[ $gone = yes ] && pass "after kill -9: no worker and no GPU process left" \
  || fail "after kill -9: GPU processes $(apps), workers $(workers)"

say "== summary: $fails failed (log: $LOG)"
[ -n "${OUT:-}" ] && cp "$WORK"/*.out "$OUT"/ 2>/dev/null
exit $((fails > 0))
