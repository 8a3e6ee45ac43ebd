#!/usr/bin/env bash
# Evidence for the NVIDIA probe on a real host (written for 2x H200, also run on one GPU; root,
# torch + nvidia-ml-py in python3). Run from the repository root; nothing is installed:
#
#     bash docs/hardware/probe_check.sh
#
# Prints PASS/FAIL/UNVERIFIED lines and a summary; exits 1 when anything FAILed. With OUT set,
# the whole log is also written to "$OUT/probe_check.log".
set -u
cd "$(dirname "$0")/../.." || exit 2
# NVLink multicast stays off on the shared machines (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY XPULAUNCH_SYSFS_ROOT XPULAUNCH_PROCFS_ROOT
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/probe_check.log") 2>&1
fi
PY=${PYTHON:-python3}
XL=("$PY" -m xpulaunch)
WORK=$(mktemp -d)
ALLOC_PID=
stop_alloc() {
    if [ -n "$ALLOC_PID" ]; then
        kill "$ALLOC_PID" 2>/dev/null
        wait "$ALLOC_PID" 2>/dev/null
        ALLOC_PID=
    fi
}
trap 'stop_alloc; rm -rf "$WORK"' EXIT
FAILS=0
section() { printf '\n=== %s ===\n' "$*"; }
verdict() {  # verdict PASS|FAIL|UNVERIFIED text...
    printf '%s: %s\n' "$1" "${*:2}"
    [ "$1" = FAIL ] && FAILS=$((FAILS + 1))
    return 0
}

section "host"
date -u; hostname; uname -r
nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader | head -1
"$PY" -c 'import sys, pynvml; print("python", sys.version.split()[0], "nvidia-ml-py ok")'
git log -1 --format='xpulaunch commit %h %s' 2>/dev/null; git status --short | head -20

section "nvidia-smi --query-gpu (the reference)"
SMI_FIELDS=index,uuid,pci.bus_id,memory.total,memory.used,memory.reserved
nvidia-smi --query-gpu=$SMI_FIELDS --format=csv
nvidia-smi --query-gpu=$SMI_FIELDS --format=csv,noheader,nounits > "$WORK/smi.csv"

section "xpulaunch devices"
"${XL[@]}" devices; echo "exit $?"
section "xpulaunch devices --debug"
"${XL[@]}" devices --debug; echo "exit $?"
section "xpulaunch devices --json"
"${XL[@]}" devices --json | tee "$WORK/inv.json"; echo "exit ${PIPESTATUS[0]}"

# compare SMI_CSV INVENTORY_JSON [expected-used-MiB per index as i=min:max,...]
compare() {
    "$PY" - "$@" <<'EOF'
import json, sys
smi_path, inv_path = sys.argv[1:3]
used_ranges = dict(kv.split("=") for kv in sys.argv[3].split(",")) if len(sys.argv) > 3 else {}
MIB = 1024 * 1024
def bus(text):  # 00000000:00:06.0 -> 0000:00:06.0, lower case
    dom, rest = text.strip().lower().split(":", 1)
    return f"{int(dom, 16) & 0xFFFF:04x}:{rest}"
smi = {}
for line in open(smi_path):
    cells = [c.strip() for c in line.split(",")]
    if len(cells) == 6:
        smi[int(cells[0])] = cells
doc = json.load(open(inv_path))
ours = {d["index"]: d for d in doc["devices"] if d["vendor"] == "nvidia"}
def check(ok, what):
    print(("PASS" if ok else "FAIL") + ": " + what)
check(sorted(smi) == sorted(ours), f"same NVIDIA indices: nvidia-smi {sorted(smi)}, xpulaunch {sorted(ours)}")
for i in sorted(set(smi) & set(ours)):
    index, uuid, bus_id, total, used, reserved = smi[i]
    d = ours[i]
    check(d["uuid"] == uuid, f"GPU {i} uuid {d['uuid']} == {uuid}")
    check(d["pci_bus_id"] == bus(bus_id), f"GPU {i} pci_bus_id {d['pci_bus_id']} == {bus(bus_id)}")
    t = d["memory_total_bytes"]
    check(t is not None and abs(t / MIB - float(total)) <= 1,
          f"GPU {i} memory_total {t} B = {t / MIB if t else None:.1f} MiB vs nvidia-smi {total} MiB (1 MiB rounding)")
    u = d["memory_used_bytes"]
    lo, hi = (float(x) for x in used_ranges.get(str(i), f"{float(used) - 64}:{float(used) + 64}").split(":"))
    check(u is not None and lo <= u / MIB <= hi,
          f"GPU {i} memory_used {None if u is None else round(u / MIB, 1)} MiB in [{lo:g}, {hi:g}] "
          f"(nvidia-smi used {used} MiB, reserved {reserved} MiB not counted)")
    check(d["utilization_percent"] is not None, f"GPU {i} utilization_percent known ({d['utilization_percent']})")
check(not doc.get("problems"), f"no problems recorded: {doc.get('problems', [])}")
EOF
}

# count_fails FILE: show the compare lines and add their FAILs to the total
count_fails() {
    cat "$1"
    FAILS=$((FAILS + $(grep -c '^FAIL' "$1")))
}

section "compare idle: xpulaunch devices --json vs nvidia-smi"
compare "$WORK/smi.csv" "$WORK/inv.json" > "$WORK/cmp-idle.txt" 2>&1
count_fails "$WORK/cmp-idle.txt"

section "allocate ~40 GiB on GPU 0 (CUDA_VISIBLE_DEVICES=0) and probe again"
CUDA_VISIBLE_DEVICES=0 "$PY" - "$WORK/alloc.ready" <<'EOF' &
import sys, time, torch
x = torch.empty(40 * 1024**3, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
open(sys.argv[1], "w").write("ready")
time.sleep(600)
EOF
ALLOC_PID=$!
for _ in $(seq 1 120); do
    [ -f "$WORK/alloc.ready" ] && break
    kill -0 "$ALLOC_PID" 2>/dev/null || break  # the allocator died (its error is above)
    sleep 1
done
if [ ! -f "$WORK/alloc.ready" ]; then
    verdict FAIL "the 40 GiB allocator did not get ready (died or took over 120 s)"
else
    nvidia-smi --query-gpu=$SMI_FIELDS --format=csv
    nvidia-smi --query-gpu=$SMI_FIELDS --format=csv,noheader,nounits > "$WORK/smi-load.csv"
    "${XL[@]}" devices
    "${XL[@]}" devices --json > "$WORK/inv-load.json"
    # GPU 0 holds >= 40 GiB (40960 MiB) plus the context; GPU 1 stays near idle.
    compare "$WORK/smi-load.csv" "$WORK/inv-load.json" "0=40960:43000,1=0:600" \
        > "$WORK/cmp-load.txt" 2>&1
    count_fails "$WORK/cmp-load.txt"

    if [ "$(wc -l < "$WORK/smi.csv")" -ge 2 ]; then
        section "xpulaunch run --dry-run --gpus 1 picks the free GPU (GPU 1)"
        want="[1]"; flags=(--gpus 1)
    else
        # One GPU, ~40 GiB of it held: a filter it cannot pass, then one it passes.
        section "one GPU: --min-free-memory 200GiB refuses it, --min-free-memory 20GiB takes it"
        if "${XL[@]}" run --dry-run --gpus 1 --min-free-memory 200GiB -- python3 -c pass 2> "$WORK/refused.err"; then
            verdict FAIL "a plan needing 200 GiB free was made on a GPU with 40 GiB held"
        else
            verdict PASS "refused: $(tail -1 "$WORK/refused.err")"
        fi
        want="[0]"; flags=(--gpus 1 --min-free-memory 20GiB)
    fi
    "${XL[@]}" run --dry-run "${flags[@]}" -- python3 -c pass; rc=$?
    echo "exit $rc"
    if "${XL[@]}" run --dry-run --json "${flags[@]}" -- python3 -c pass > "$WORK/plan.json" 2> "$WORK/plan.err"; then
        picked=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print([x["index"] for x in d["devices"]])' "$WORK/plan.json")
        if [ "$picked" = "$want" ]; then verdict PASS "plan picked GPU $picked"; else verdict FAIL "plan picked $picked, expected $want"; fi
    else
        verdict FAIL "run --dry-run --json ${flags[*]} failed: $(tail -1 "$WORK/plan.err")"
    fi
fi
stop_alloc
sleep 2

section "probing creates no CUDA context (no compute app of ours)"
"$PY" - "$WORK/prober.pid" <<'EOF' &
import os, sys, time
from xpulaunch import probe
inventory = probe()
print(f"prober pid {os.getpid()} probed {len(inventory.devices)} devices; holding 5 s", flush=True)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(5)
assert "torch" not in sys.modules
EOF
PROBER=$!
for _ in $(seq 1 30); do [ -f "$WORK/prober.pid" ] && break; sleep 0.2; done
PROBER_PID=$(cat "$WORK/prober.pid" 2>/dev/null || echo "$PROBER")
nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv | tee "$WORK/apps.csv"
if grep -q "^$PROBER_PID," "$WORK/apps.csv"; then
    verdict FAIL "the probing process $PROBER_PID holds a CUDA context"
else
    verdict PASS "no compute app with the probing process's pid $PROBER_PID (it is still alive)"
fi
if wait "$PROBER"; then
    verdict PASS "the probing process never imported torch"
else
    verdict FAIL "the probing process failed or imported torch"
fi
"${XL[@]}" devices --json > /dev/null
if APPS=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader); then
    OURS=""
    for pid in $APPS; do
        tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q xpulaunch && OURS="$OURS $pid"
    done
    if [ -z "$OURS" ]; then
        verdict PASS "no compute app of ours after probing (all compute apps: ${APPS:-none})"
    else
        verdict FAIL "xpulaunch processes hold CUDA contexts:$OURS"
    fi
else
    verdict FAIL "nvidia-smi --query-compute-apps failed"
fi

section "speed: median of 20 fresh processes each"
"$PY" bench/bench_probe.py --runs 20 --python "$PY" --no-bytecode --no-torch
"$PY" bench/bench_probe.py --runs 20 --python "$PY" --per-call --no-torch; rc=$?
case $rc in
    0) verdict PASS "devices --json median within 1.10x of a bare pynvml process" ;;
    2) verdict FAIL "devices --json median over 1.10x a bare pynvml process" ;;
    *) verdict FAIL "bench_probe.py failed (exit $rc)" ;;
esac

section "summary"
echo "failures: $FAILS"
[ "$FAILS" -eq 0 ]
