#!/usr/bin/env bash
# Multi-node on real NVIDIA GPUs, in one call of at most ~9 minutes, on a lent 4-GPU machine
# (nvidia-h100-x4 / nvidia-h200-x4; a 2-GPU kind runs everything but the 2 + 1 job). "Nodes"
# are separate xpulaunch processes on loopback, each on its own GPUs. From the repo root:
#
#     OUT=/some/dir bash docs/hardware/multinode_check.sh
#
#  1. one node on every GPU (NCCL DDP, examples/train.py): ranks on GPUs in index order
#  2. static, two nodes of half the GPUs: first run; crash on node 1 while node 0's ranks wait
#     in NCCL -> both restart, resume, end with the uninterrupted weights; kill -9 of node 1's
#     xpulaunch -> node 0 fails within seconds naming it, no GPU process left
#  3. static, 2 + 1 workers (4 GPUs): node 1 on --gpus auto with a 30 GiB hog on its second
#     GPU runs 1 worker and says why; world size 3; the weights of one node of 3; and the same
#     under a Slurm allocation (dry run): auto takes the busy GPU too, with a warning
#  4. c10d, two nodes of half the GPUs: first run, crash on node 1, kill -9 of node 1; a node
#     that gives up (no restarts left) while the other's ranks wait in NCCL: both end
#  5. --hang-timeout: a rank stuck before an NCCL all-reduce, one node and two static nodes
#  6. leases: two concurrent jobs get disjoint GPUs, a third is refused naming the holder, a
#     --wait job starts when one ends
#  7. bench/bench_ddp.py on 2 GPUs and on every GPU: bare vs xpulaunch vs torchrun
#
# Every child gets NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1.
# Results in $OUT (few files): summary.md (the table), multinode_check.log (every PASS/FAIL/
# INFO line), bench.log, logs.tar.gz (each step's output).
set -u
cd "$(dirname "$0")/../.." || exit 2
: "${OUT:?set OUT}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 NO_COLOR=1 PYTHONPATH=$PWD/src
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-510}  # the bench is shortened to end by then
WORK=$(mktemp -d)
LOGS=$WORK/logs
mkdir -p "$LOGS"
export XDG_RUNTIME_DIR=$WORK/run XPULAUNCH_LOCK_DIR=$WORK/locks
mkdir -p "$XDG_RUNTIME_DIR" "$XPULAUNCH_LOCK_DIR"
LOG=$OUT/multinode_check.log
SUMMARY=$OUT/summary.md
: >"$LOG"
printf '| step | check | result |\n|---|---|---|\n' >"$SUMMARY"
STEP=0
say() { printf '%s\n' "$*" | tee -a "$LOG"; }
row() { printf '| %s | %s | %s |\n' "$STEP" "$2" "$1" >>"$SUMMARY"; }
pass() { say "PASS: $*"; row PASS "$*"; }
fail() { say "FAIL: $*"; row FAIL "$*"; }
info() { say "INFO: $*"; row INFO "$*"; }
check() { if eval "$1"; then pass "$2"; else fail "$2"; fi; }
section() { STEP=$1; say ""; say "== $1. $2 ($SECONDS s)"; }
# The device call ends at 600 s: a section that needs more than what is left is skipped.
room() { [ $((HARD_STOP_S - SECONDS)) -gt "$1" ] || { info "section $STEP skipped: ${SECONDS} s used"; false; }; }
HARD_STOP_S=${HARD_STOP_S:-560}
port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
weights() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights"])' "$1/result.json" 2>/dev/null; }
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' \n'; }
no_gpu_process() {  # up to 20 s for the driver to list no process of ours
  for _ in $(seq 1 40); do [ -z "$(apps)" ] && return 0; sleep 0.5; done; return 1
}
RC=""
finish() {  # PID TIMEOUT_S: wait for a background node; RC = its status ("hung" after T s)
  local pid=$1 t=$2
  for _ in $(seq 1 $((t * 2))); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; RC=$?; return; fi
    sleep 0.5
  done
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; RC=hung
}
same() { [ -n "$1" ] && [ "$1" = "$2" ]; }  # two weights, both there and equal
exact() {  # CRASH_WEIGHTS FIRST_WEIGHTS WHAT: a crash run against the uninterrupted run. With
  # more than two ranks DDP's first step after a resume sums in another order, so the last bits
  # may differ (resume_check.sh shows that a restart then equals a resume by hand): INFO there.
  if same "$1" "$2"; then pass "$3 ends with the uninterrupted weights ($1)"
  elif [ "$NGPU" -le 2 ]; then fail "$3 ends with the uninterrupted weights ($1, not $2)"
  else info "$3: weights $1, uninterrupted $2 ($NGPU ranks: see resume_check.sh)"; fi
}
until_seen() {  # PATTERN FILES...: up to 2 min for a line, while the first process lives
  local pattern=$1; shift
  for _ in $(seq 1 240); do
    [ "$(cat "$@" 2>/dev/null | grep -c "$pattern")" -gt 3 ] && return 0
    kill -0 "$WATCHED" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

NGPU=$(nvidia-smi -L | grep -c '^GPU')
HALF=$((NGPU / 2))
list() { seq -s, "$1" "$2"; }  # list 0 1 -> 0,1
NODE0_GPUS=$(list 0 $((HALF - 1)))
NODE1_GPUS=$(list "$HALF" $((NGPU - 1)))
[ "$HALF" -eq 1 ] && NODE0_GPUS=device=0 NODE1_GPUS=device=1
TRAIN=(examples/train.py --steps 20)

section 0 "host"
{
  date -u; nvidia-smi -L; nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.used --format=csv
  $PY -V; $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  $PY -c 'import click, psutil, pynvml; print("click", click.__version__, "psutil", psutil.__version__)'
  git log -1 --format='commit %H %s' 2>/dev/null || true
  echo "KUBERNETES_SERVICE_HOST=${KUBERNETES_SERVICE_HOST:-} SLURM_JOB_ID=${SLURM_JOB_ID:-}" \
    "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
} >"$LOGS/host.log" 2>&1
# This box is not a scheduler's allocation for these checks (section 3 asks for one on purpose).
unset KUBERNETES_SERVICE_HOST SLURM_JOB_ID SLURM_STEP_GPUS SLURM_JOB_GPUS CUDA_VISIBLE_DEVICES
cat "$LOGS/host.log" >>"$LOG"
if ! $PY -c 'import click, psutil' 2>/dev/null && [ -f docs/hardware/gpu_env.sh ]; then
  source docs/hardware/gpu_env.sh >>"$LOG" 2>&1
fi
info "$NGPU GPUs; static and c10d nodes get $NODE0_GPUS and $NODE1_GPUS"
mapfile -t UUIDS < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)

section 1 "one node on every GPU"
timeout 150 $PY -m xpulaunch run --gpus "$NGPU" --nproc-per-node auto "${TRAIN[@]}" --ckpt-dir "$WORK/one" \
  >"$LOGS/1_one_node.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "one node, $NGPU ranks: exit $rc"
check 'grep -q "backend nccl" "$LOGS/1_one_node.out"' "backend nccl"
in_order=yes
for r in $(seq 0 $((NGPU - 1))); do
  grep -q "rank $r/$NGPU local_rank $r .*uuid ${UUIDS[$r]}" "$LOGS/1_one_node.out" || in_order=no
done
check '[ $in_order = yes ]' "rank r on GPU index r (index order, whatever the free memory)"
ONE=$(weights "$WORK/one")
info "one-node weights $ONE"

static_pair() {  # NAME EXTRA_ARGS...: two static nodes (node 1 last), logs NAME.node0/1
  local name=$1; shift
  local p; p=$(port)
  $PY -m xpulaunch run --gpus "$NODE0_GPUS" --nproc-per-node auto --nnodes 2 --node-rank 0 \
    --master-port "$p" "$@" >"$LOGS/$name.node0" 2>&1 &
  N0=$!
  $PY -m xpulaunch run --gpus "$NODE1_GPUS" --nproc-per-node auto --nnodes 2 --node-rank 1 \
    --master-addr 127.0.0.1 --master-port "$p" "$@" >"$LOGS/$name.node1" 2>&1 &
  N1=$!
}

section 2 "static: two nodes of $HALF GPU(s)"
static_pair 2a_static_first "${TRAIN[@]}" --ckpt-dir "$WORK/s_first"
finish $N0 120; r0=$RC; finish $N1 120; r1=$RC
check '[ "$r0 $r1" = "0 0" ]' "static first run: exit $r0 $r1"
S_FIRST=$(weights "$WORK/s_first")
same "$S_FIRST" "$ONE" && info "static two-node weights equal the one-node run's" \
  || info "static two-node weights $S_FIRST, one-node $ONE"
start=$SECONDS
static_pair 2b_static_crash --max-restarts 1 --backoff 0 "${TRAIN[@]}" --ckpt-dir "$WORK/s_crash" \
  --crash-at-step 12
finish $N0 180; r0=$RC; finish $N1 180; r1=$RC
check '[ "$r0 $r1" = "0 0" ]' "static crash on node 1 (NCCL: node 0's ranks wait in an all-reduce): exit $r0 $r1 after $((SECONDS - start)) s (hung = the old deadlock)"
if grep -q "node 1 failed (worker .* exited with code 3): stopping" "$LOGS/2b_static_crash.node0"; then
  pass "node 0 heard of node 1's crash and stopped its own ranks (waiting in NCCL)"
else
  info "node 0's ranks failed on their own before node 1's word came (NCCL noticed this time)"
fi
check '[ "$(cat "$LOGS"/2b_static_crash.node* | grep -c "resumed from step 10")" -eq "$NGPU" ]' \
  "every rank of both nodes resumed from step 10"
exact "$(weights "$WORK/s_crash")" "$S_FIRST" "static crash run"
static_pair 2c_static_kill "${TRAIN[@]}" --steps 100000000 --ckpt-every 100000000 \
  --ckpt-dir "$WORK/s_kill"
WATCHED=$N0 until_seen 'step .* loss' "$LOGS/2c_static_kill.node0"
kill -9 $N1 2>/dev/null; killed_at=$SECONDS; wait $N1 2>/dev/null
finish $N0 60; r0=$RC
check '[ "$r0" = 125 ]' "node 0 ended with status 125 $((SECONDS - killed_at)) s after kill -9 of node 1"
check 'grep -q "node 1 is gone (its connection closed)" "$LOGS/2c_static_kill.node0"' \
  "node 0's line names node 1"
check no_gpu_process "no GPU process left after the kill"

section 3 "static: nodes of different worker counts"
if [ "$NGPU" -ge 4 ] && room 90; then
  CUDA_VISIBLE_DEVICES=3 $PY -c 'import torch, time; x = torch.empty(30 * 2**30, dtype=torch.uint8, device="cuda"); print("hog up", flush=True); time.sleep(600)' \
    >"$LOGS/3_hog.out" 2>&1 &
  HOG=$!
  for _ in $(seq 1 60); do
    grep -q "hog up" "$LOGS/3_hog.out" && break; kill -0 $HOG 2>/dev/null || break; sleep 0.5
  done
  timeout 150 $PY -m xpulaunch run --gpus 0,1,2 --nproc-per-node auto "${TRAIN[@]}" --ckpt-dir "$WORK/three" \
    >"$LOGS/3a_one_node_of_3.out" 2>&1
  p=$(port)
  CUDA_VISIBLE_DEVICES=0,1 $PY -m xpulaunch run --gpus auto --nproc-per-node auto --nnodes 2 --node-rank 0 \
    --master-port "$p" "${TRAIN[@]}" --ckpt-dir "$WORK/two_one" >"$LOGS/3b_counts.node0" 2>&1 &
  N0=$!
  CUDA_VISIBLE_DEVICES=2,3 $PY -m xpulaunch run --gpus auto --nproc-per-node auto --nnodes 2 --node-rank 1 \
    --master-port "$p" "${TRAIN[@]}" --ckpt-dir "$WORK/two_one" >"$LOGS/3b_counts.node1" 2>&1 &
  N1=$!
  finish $N0 120; r0=$RC; finish $N1 120; r1=$RC
  check '[ "$r0 $r1" = "0 0" ]' "2 + 1 workers: exit $r0 $r1"
  check 'grep -qE "node 1 of 2: (cuda|nvidia) on nvidia 2[^;]*; 1 worker \(nvidia 3 busy\)" "$LOGS/3b_counts.node1"' \
    "node 1's first line: 1 worker (nvidia 3 busy)"
  check 'grep -q "3 workers in all (node 0: 2, node 1: 1)" "$LOGS/3b_counts.node0"' \
    "node 0: 3 workers in all (node 0: 2, node 1: 1)"
  check 'grep -q "rank 2/3 local_rank 0" "$LOGS/3b_counts.node1"' "node 1's worker is rank 2 of 3"
  same "$(weights "$WORK/two_one")" "$(weights "$WORK/three")" \
    && pass "2 + 1 nodes end with the weights of one node of 3" \
    || info "2 + 1 weights $(weights "$WORK/two_one"), one node of 3 $(weights "$WORK/three")"
  SLURM_JOB_ID=1 SLURM_STEP_GPUS=2,3 CUDA_VISIBLE_DEVICES=2,3 timeout 60 $PY -m xpulaunch run --dry-run --gpus auto \
    --nproc-per-node auto examples/train.py >"$LOGS/3c_slurm_dry.out" 2>&1
  check 'grep -q "nvidia 3 .*is busy.*used anyway, as Slurm allocated it" "$LOGS/3c_slurm_dry.out" && grep -q "LOCAL_WORLD_SIZE=2" "$LOGS/3c_slurm_dry.out"' \
    "under a Slurm allocation auto takes the busy GPU too, with a warning"
  kill $HOG 2>/dev/null; wait $HOG 2>/dev/null
  no_gpu_process || info "GPU processes still listed after the hog: $(apps)"
elif [ "$NGPU" -lt 4 ]; then
  info "2 + 1 workers needs 4 GPUs; skipped on $NGPU"
fi

c10d_pair() {  # NAME EXTRA_ARGS...
  local name=$1; shift
  local p; p=$(port)
  for node in 0 1; do
    gpus=$NODE0_GPUS; [ $node = 1 ] && gpus=$NODE1_GPUS
    $PY -m xpulaunch run --gpus "$gpus" --nproc-per-node auto --rdzv-backend c10d --nnodes 2 \
      --rdzv-endpoint "127.0.0.1:$p" --rdzv-id "$name" --join-timeout 120 "$@" \
      >"$LOGS/$name.node$node" 2>&1 &
    eval "N$node=\$!"
    [ $node = 0 ] && for _ in $(seq 1 60); do
      $PY -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$p" 2>/dev/null && break
      kill -0 $N0 2>/dev/null || break
      sleep 0.5
    done
  done
}

section 4 "c10d: two nodes of $HALF GPU(s)"
if room 150; then
c10d_pair 4a_c10d_first "${TRAIN[@]}" --ckpt-dir "$WORK/c_first"
finish $N0 150; r0=$RC; finish $N1 150; r1=$RC
check '[ "$r0 $r1" = "0 0" ]' "c10d first run: exit $r0 $r1"
C_FIRST=$(weights "$WORK/c_first")
start=$SECONDS
c10d_pair 4b_c10d_crash --max-restarts 1 "${TRAIN[@]}" --ckpt-dir "$WORK/c_crash" --crash-at-step 12
finish $N0 180; r0=$RC; finish $N1 180; r1=$RC
check '[ "$r0 $r1" = "0 0" ]' "c10d crash: exit $r0 $r1 after $((SECONDS - start)) s"
exact "$(weights "$WORK/c_crash")" "$C_FIRST" "c10d crash run"
c10d_pair 4c_c10d_kill "${TRAIN[@]}" --steps 100000000 --ckpt-every 100000000 --ckpt-dir "$WORK/c_kill"
WATCHED=$N0 until_seen 'step .* loss' "$LOGS"/4c_c10d_kill.node*
kill -9 $N1 2>/dev/null; killed_at=$SECONDS; wait $N1 2>/dev/null
finish $N0 60; r0=$RC
# torch's agent decides here (its workers may wait in NCCL): observed, not judged.
info "c10d: node 0 ended with '$r0' $((SECONDS - killed_at)) s after kill -9 of node 1 (hung = still there after 60 s, then killed)"
check no_gpu_process "no GPU process left after the c10d kill"
fi
if room 150; then
# A node gives up (its last rank crashes, no restarts left) while the other node's ranks wait in
# an NCCL all-reduce that never completes: before session 16, they waited for ever (NCCL does
# not fail a collective whose peer died), as under torchrun.
start=$SECONDS
c10d_pair 4d_c10d_gave_up --max-restarts 0 "${TRAIN[@]}" --steps 100000000 --ckpt-every 100000000 \
  --ckpt-dir "$WORK/c_gave_up" --crash-at-step 12
finish $N0 120; r0=$RC; finish $N1 120; r1=$RC
check '[ "$r0" != hung ] && [ "$r1" != hung ] && [ "$r0" != 0 ] && [ "$r1" != 0 ]' \
  "c10d: a node gives up, both end: exit $r0 $r1 after $((SECONDS - start)) s (hung = still waiting after 120 s)"
check 'grep -q "gave up" "$LOGS"/4d_c10d_gave_up.node*' "c10d: the other node names the node that gave up"
check no_gpu_process "no GPU process left after a node gave up"
fi

section 5 "--hang-timeout: a rank stuck before an NCCL all-reduce"
if room 100; then
timeout 150 $PY -m xpulaunch run --gpus "$NGPU" --nproc-per-node auto --hang-timeout 10 --max-restarts 1 --backoff 0 \
  docs/hardware/nccl_stuck.py >"$LOGS/5a_hang_one_node.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "one node: the stuck rank is caught and the restart finishes (exit $rc)"
check 'grep -q "silent for 10 s" "$LOGS/5a_hang_one_node.out"' "the hang is reported"
check '[ "$(grep -c "done in attempt 1" "$LOGS/5a_hang_one_node.out")" -eq "$NGPU" ]' \
  "every rank finished its second attempt"
static_pair 5b_hang_two_nodes --hang-timeout 10 --max-restarts 1 --backoff 0 docs/hardware/nccl_stuck.py
finish $N0 150; r0=$RC; finish $N1 150; r1=$RC
check '[ "$r0 $r1" = "0 0" ]' "two static nodes, a rank of node 1 stuck in NCCL: both restart and finish (exit $r0 $r1)"
fi

section 6 "leases between concurrent jobs"
if room 70; then
$PY -m xpulaunch run --gpus "$HALF" --nproc-per-node auto "${TRAIN[@]}" --steps 100000000 --ckpt-every 100000000 \
  --ckpt-dir "$WORK/lease_a" >"$LOGS/6a_job_a.out" 2>&1 &
A=$!
WATCHED=$A until_seen 'step .* loss' "$LOGS/6a_job_a.out"
$PY -m xpulaunch run --gpus "$HALF" --nproc-per-node auto "${TRAIN[@]}" --steps 100000000 --ckpt-every 100000000 \
  --ckpt-dir "$WORK/lease_b" >"$LOGS/6b_job_b.out" 2>&1 &
B=$!
WATCHED=$B until_seen 'step .* loss' "$LOGS/6b_job_b.out"
gpus_of() { head -5 "$1" | grep -oE '(cuda|nvidia) on [^;]*' | head -1; }
info "job A: $(gpus_of "$LOGS/6a_job_a.out"); job B: $(gpus_of "$LOGS/6b_job_b.out")"
check '[ -n "$(gpus_of "$LOGS/6a_job_a.out")" ] && [ "$(gpus_of "$LOGS/6a_job_a.out")" != "$(gpus_of "$LOGS/6b_job_b.out")" ]' \
  "two jobs of --gpus $HALF got different GPUs"
timeout 60 $PY -m xpulaunch run --gpus 1 examples/train.py --steps 1 >"$LOGS/6c_job_c.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "leased by" "$LOGS/6c_job_c.out"' "a third job is refused naming the holder (exit $rc)"
$PY -m xpulaunch run --gpus "$HALF" --nproc-per-node auto --wait "${TRAIN[@]}" --ckpt-dir "$WORK/lease_d" \
  >"$LOGS/6d_job_d.out" 2>&1 &
D=$!
sleep 3
kill -TERM $A 2>/dev/null; wait $A 2>/dev/null
finish $D 120; rd=$RC
check '[ "$rd" = 0 ]' "a --wait job started when job A ended, and finished (exit $rd)"
kill -TERM $B 2>/dev/null; wait $B 2>/dev/null
check no_gpu_process "no GPU process left after the lease jobs"
fi

section 7 "bench: bare vs xpulaunch vs torchrun, DDP"
BUDGET_S=$((BUDGET_S < HARD_STOP_S ? BUDGET_S : HARD_STOP_S))
left=$((BUDGET_S - SECONDS))
runs=${BENCH_RUNS:-3}
[ $left -lt 200 ] && runs=2
[ $left -lt 120 ] && runs=1
sizes="2"; [ "$NGPU" -ge 4 ] && sizes="2 $NGPU"
: >"$OUT/bench.log"
for n in $sizes; do
  if [ $((BUDGET_S - SECONDS)) -lt 45 ]; then info "bench on $n GPUs skipped: out of time"; continue; fi
  timeout $((HARD_STOP_S + 20 - SECONDS)) $PY bench/bench_ddp.py --gpus "$n" --runs "$runs" \
    --steps "${BENCH_STEPS:-500}" >>"$OUT/bench.log" 2>&1
  info "bench $n GPUs: $(grep -E '^ +xpulaunch:|^ +torchrun:' "$OUT/bench.log" | tail -2 | tr -s ' ' | tr '\n' ';')"
done
tail -n 12 "$OUT/bench.log" >>"$LOG"

say ""
say "== done in $SECONDS s: $(grep -c '^PASS' "$LOG") PASS, $(grep -c '^FAIL' "$LOG") FAIL"
tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs
rm -rf "$WORK"
