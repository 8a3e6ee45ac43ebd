#!/usr/bin/env bash
# Evidence for serving round 2 on a real NVIDIA GPU (one is enough): with the CUDA llama-server
# built by session18.sh (or llama_serve_check.sh) in $LLAMA_BUILD_DIR,
#
# 1. packing: two tiny models with gpus = "auto" behind one router are loaded on the one GPU
#    at once (their servers both in nvidia-smi's compute apps of that GPU), and 10 requests
#    alternating between them unload nothing;
# 2. serving yields to training: `xpulaunch run --gpus 1 --wait` (a torch program that really
#    allocates on the GPU) waits while the idle models hold slots of it; the router unloads
#    them, the job starts, runs on the GPU and ends 0; the next request loads the model again;
# 3. a llama-swap config.yaml as it is: two llama-server commands, one pinned by hand with
#    CUDA_VISIBLE_DEVICES=0, served together on the GPU; the dry run says the pin;
# 4. kill -9 of the router leaves no server, no lease and no GPU process of ours.
#
# Needs python3 with click, psutil, nvidia-ml-py, aiohttp, gguf and torch (gpu_env.sh and
# session_steps.sh's router_wheels install the missing ones). Prints PASS/FAIL/INFO lines;
# every log goes to $OUT.
set -u
cd "$(dirname "$0")/../.." || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY XPULAUNCH_LLAMA_SERVER
OUT=${OUT:-/tmp/serve_pack_check}
mkdir -p "$OUT"
BUILD_DIR=${LLAMA_BUILD_DIR:-/tmp/llama-cuda}
SERVER="$BUILD_DIR/build/bin/llama-server"
WORK=$(mktemp -d)
LOCKS="$WORK/locks"
export XDG_RUNTIME_DIR="$WORK/run"
mkdir -p "$XDG_RUNTIME_DIR"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
FAILS=0
verdict() { printf '%s: %s\n' "$1" "${*:2}"; [ "$1" = FAIL ] && FAILS=$((FAILS + 1)); return 0; }
XL() { python3 -m xpulaunch "$@"; }
ours_on_gpus() {  # pid uuid MiB of every GPU app whose command line is under $WORK
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader |
        while IFS=', ' read -r pid uuid mem _; do
            if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$WORK"; then
                echo "$pid $uuid $mem"
            fi
        done
}
start_router() {  # CONFIG NAME: start a router on a free port; sets URL and ROUTER
    python3 -m xpulaunch llama serve --config "$1" --port 0 --binary "$SERVER" \
        --lock-dir "$LOCKS" --events "$OUT/$2-events.jsonl" --log-dir "$OUT/$2-logs" \
        >"$WORK/$2.out" 2>"$OUT/$2.err" &
    ROUTER=$!
    PIDS+=("$ROUTER")
    for _ in $(seq 150); do grep -q ' at http' "$WORK/$2.out" && break; sleep 0.2; done
    URL=$(sed -n 's/.* at \(http:[^ ]*\)\/v1 .*/\1/p' "$WORK/$2.out")
}
ask() {  # MODEL: the HTTP status of a whole chat answer
    curl -s -o "$WORK/answer.json" -w '%{http_code}' "$URL/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"$1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8}"
}
states() {  # id=state@devices for every model
    curl -s "$URL/models/status" | python3 -c 'import json, sys
for m in json.load(sys.stdin)["models"]:
    print(m["id"] + "=" + m["state"] + "@" + (",".join(m["devices"]) or "-"), end=" ")
print()'
}
count_events() {  # FILE EVENT [REASON]
    python3 - "$@" <<'EOF'
import json, sys
path, kind = sys.argv[1], sys.argv[2]
reason = sys.argv[3] if len(sys.argv) > 3 else None
n = 0
for line in open(path):
    e = json.loads(line)
    if e.get("event") == kind and (reason is None or e.get("reason") == reason):
        n += 1
print(n)
EOF
}

echo "=== host ($(date -u +%T))"
nvidia-smi -L
[ -x "$SERVER" ] || { verdict FAIL "no CUDA llama-server at $SERVER"; exit 1; }
python3 tests/llamacpp/tiny_model.py "$WORK/tiny.gguf" || { verdict FAIL "tiny model"; exit 1; }
for m in a b; do ln -s "$WORK/tiny.gguf" "$WORK/$m.gguf"; done
GPU_UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)

echo "=== 1. two models packed on one GPU ($(date -u +%T))"
cat >"$WORK/models.toml" <<EOF
[models.a]
model = "a.gguf"
args = ["-c", "256"]
[models.b]
model = "b.gguf"
args = ["-c", "256"]
EOF
XL llama serve --config "$WORK/models.toml" --binary "$SERVER" --lock-dir "$LOCKS" --dry-run \
    >"$OUT/pack-dry-run.txt" 2>&1
grep -E 'needs about|share|slot' "$OUT/pack-dry-run.txt" | head -6
start_router "$WORK/models.toml" pack
[ -n "$URL" ] && verdict PASS "router at $URL" || { cat "$OUT/pack.err"; verdict FAIL "router did not start"; exit 1; }
codes=""
for m in a b a b a b a b a b; do codes="$codes $(ask $m)"; done
echo "10 alternating requests:$codes"
echo "states: $(states)"
ours_on_gpus | tee "$OUT/pack-gpu-apps.txt" | sed 's/^/  gpu app: /'
[ "$(echo "$codes" | tr ' ' '\n' | grep -c '^200$')" = 10 ] && verdict PASS "10 of 10 answered" \
    || verdict FAIL "answers:$codes"
unloads=$(count_events "$OUT/pack-events.jsonl" model_unloaded)
[ "$unloads" = 0 ] && verdict PASS "alternating a and b unloaded nothing (0 swaps)" \
    || verdict FAIL "$unloads unloads while alternating"
case "$(states)" in
    *a=ready@*" b=ready@"*) verdict PASS "a and b loaded at once: $(states)" ;;
    *) verdict FAIL "not both loaded: $(states)" ;;
esac
apps=$(awk -v u="$GPU_UUID" '$2 == u' "$OUT/pack-gpu-apps.txt" | wc -l)
if [ "$apps" -eq 2 ]; then
    verdict PASS "nvidia-smi: both servers on $GPU_UUID ($(awk '{print $3}' "$OUT/pack-gpu-apps.txt" | tr '\n' ' ')MiB)"
elif [ ! -s "$OUT/pack-gpu-apps.txt" ]; then
    verdict INFO "nvidia-smi lists no pid of ours (a container hides them)"
else
    verdict FAIL "nvidia-smi shows $apps of our servers on the GPU"
fi
XL status --lock-dir "$LOCKS" | tee "$OUT/pack-status.txt"

echo "=== 2. a training job takes the GPU from the idle models ($(date -u +%T))"
cat >"$WORK/train.py" <<'EOF'
import time, torch
x = torch.randn(4096, 4096, device="cuda")
for _ in range(20):
    x = (x @ x).tanh()
torch.cuda.synchronize()
print("trained on", torch.cuda.get_device_name(0), "free MiB", torch.cuda.mem_get_info()[0] >> 20, flush=True)
EOF
began=$(date +%s.%N)
XL run --gpus 1 --wait --wait-timeout 120 --lock-dir "$LOCKS" -- python3 "$WORK/train.py" \
    >"$OUT/train.out" 2>"$OUT/train.err"
rc=$?
took=$(python3 -c "import time; print(f'{time.time() - $began:.1f}')")
cat "$OUT/train.out"; tail -3 "$OUT/train.err"
[ "$rc" = 0 ] && grep -q "trained on" "$OUT/train.out" \
    && verdict PASS "the job --gpus 1 --wait ran on the GPU and ended 0 after $took s" \
    || verdict FAIL "the job: exit $rc after $took s"
yielded=$(count_events "$OUT/pack-events.jsonl" model_unloaded yielded)
[ "$yielded" = 2 ] && verdict PASS "the router unloaded both idle models for the job (yielded)" \
    || verdict FAIL "$yielded model(s) yielded"
echo "states after the job: $(states)"
[ "$(ask a)" = 200 ] && verdict PASS "a answers again after the job: $(states)" \
    || verdict FAIL "a after the job: $(states)"
loads=$(count_events "$OUT/pack-events.jsonl" model_loaded)
[ "$loads" = 3 ] && verdict PASS "a was loaded again (3 loads in all)" || verdict FAIL "$loads loads"

echo "=== 4a. kill -9 of the router ($(date -u +%T))"
kill -KILL "$ROUTER"; sleep 3
left=$(pgrep -f "$WORK/" | wc -l)
[ "$left" -eq 0 ] && verdict PASS "no server left" || { pgrep -af "$WORK/"; verdict FAIL "$left left"; }

echo "=== 3. a llama-swap config.yaml ($(date -u +%T))"
cat >"$WORK/config.yaml" <<EOF
healthCheckTimeout: 120
logLevel: info
macros:
  "server": "$SERVER --port \${PORT}"
models:
  "chat":
    cmd: |
      \${server}
      -m $WORK/a.gguf -c 256
    env:
      - "CUDA_VISIBLE_DEVICES=0"
    aliases: ["gpt-4o-mini"]
  "code":
    cmd: \${server} -m $WORK/b.gguf -c 256
    ttl: 600
EOF
XL llama serve --config "$WORK/config.yaml" --lock-dir "$LOCKS" --dry-run \
    >"$OUT/swap-dry-run.txt" 2>&1
grep -E 'warning|pinned by hand' "$OUT/swap-dry-run.txt"
grep -q "pinned by hand: its env sets CUDA_VISIBLE_DEVICES=0" "$OUT/swap-dry-run.txt" \
    && verdict PASS "the dry run says chat's hand pin" || verdict FAIL "no pin in the dry run"
grep -q "logLevel: not taken" "$OUT/swap-dry-run.txt" \
    && verdict PASS "logLevel: one warning line" || verdict FAIL "no warning for logLevel"
start_router "$WORK/config.yaml" swap
[ -n "$URL" ] || { cat "$OUT/swap.err"; verdict FAIL "the llama-swap router did not start"; }
c1=$(ask gpt-4o-mini); c2=$(ask code)
echo "chat (as gpt-4o-mini): $c1, code: $c2; $(states)"
ours_on_gpus | tee "$OUT/swap-gpu-apps.txt" | sed 's/^/  gpu app: /'
[ "$c1" = 200 ] && [ "$c2" = 200 ] && verdict PASS "both llama-swap models answer" \
    || verdict FAIL "answers $c1 $c2"
case "$(states)" in
    *chat=ready@*" code=ready@"*) verdict PASS "both loaded on the GPU at once: $(states)" ;;
    *) verdict FAIL "not both loaded: $(states)" ;;
esac

echo "=== 4b. kill -9 of the router ($(date -u +%T))"
kill -KILL "$ROUTER"; sleep 3
left=$(pgrep -f "$WORK/" | wc -l)
[ "$left" -eq 0 ] && verdict PASS "no server left" || { pgrep -af "$WORK/"; verdict FAIL "$left left"; }
leases=$(XL status --lock-dir "$LOCKS" --json | python3 -c 'import json, sys; d = json.load(sys.stdin); print(len(d["leases"]) + len(d.get("slots", [])))')
[ "$leases" = 0 ] && verdict PASS "no lease left" || verdict FAIL "$leases lease(s) left"
[ "$(ours_on_gpus | wc -l)" -eq 0 ] && verdict PASS "no GPU process of ours" || verdict FAIL "GPU apps left"
echo "$FAILS FAIL(s)"
[ "$FAILS" -eq 0 ]
