#!/usr/bin/env bash
# `xpulaunch devices --processes` against `nvidia-smi --query-compute-apps` on a real NVIDIA
# host (root, torch + nvidia-ml-py in python3). Run from the repository root:
#
#     OUT=/some/dir bash docs/hardware/processes_check.sh
#
# A torch child holds 2 GiB on GPU 0 for about 60 s; meanwhile both tools are asked which
# processes use which GPU, and must agree on pid, PCI address and memory. Prints PASS/FAIL
# lines and a summary; exits 1 when anything FAILed. With OUT set, the log is also written to
# "$OUT/processes_check.log".
set -u
cd "$(dirname "$0")/../.." || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY XPULAUNCH_SYSFS_ROOT XPULAUNCH_PROCFS_ROOT
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/processes_check.log") 2>&1
fi
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
HOLDER=
FAILS=0
verdict() { printf '%s: %s\n' "$1" "${*:2}"; [ "$1" = FAIL ] && FAILS=$((FAILS + 1)); return 0; }
cleanup() { [ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null && wait "$HOLDER" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

date -u; hostname; nvidia-smi --query-gpu=index,pci.bus_id,driver_version --format=csv,noheader

"$PY" - >"$WORK/holder.out" 2>&1 <<'PYEOF' &
import time, torch
held = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(60)
PYEOF
HOLDER=$!
# Wait (up to 60 s) until the holder has its 2 GiB and nvidia-smi lists it: listed as soon as
# its CUDA context exists, it shows 14 MiB to a query made before the allocation, which the
# comparison below would then take for a disagreement (session 15's first run did).
for _ in $(seq 1 60); do
    grep -q holding "$WORK/holder.out" \
        && nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$HOLDER" && break
    sleep 1
done

nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader,nounits \
    | tee "$WORK/smi.csv"
"$PY" -m xpulaunch devices --processes --json >"$WORK/devices.json" || verdict FAIL "devices --processes exited $?"
"$PY" -m xpulaunch devices --processes
grep -qw "$HOLDER" "$WORK/smi.csv" || verdict FAIL "nvidia-smi never listed the holder (pid $HOLDER): $(cat "$WORK/holder.out")"

"$PY" - "$WORK/smi.csv" "$WORK/devices.json" "$HOLDER" <<'PYEOF' || FAILS=$((FAILS + 1))
import json, sys
smi_path, doc_path, holder = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = json.load(open(doc_path)).get("processes", [])
ours = {(r["pid"], r["pci_bus_id"]): r for r in rows}
bad = 0
for line in open(smi_path):
    pid, bus, mib = (f.strip() for f in line.split(","))
    bus = "0000:" + bus.lower().split(":", 1)[1] if bus.count(":") == 2 else bus.lower()
    row = ours.get((int(pid), bus))
    if row is None:
        print(f"FAIL: pid {pid} on {bus} (nvidia-smi) is missing from devices --processes")
        bad += 1
        continue
    smi_bytes = int(mib) * 1024**2
    ok = row["memory_bytes"] is not None and abs(row["memory_bytes"] - smi_bytes) <= 1024**2
    print(f"{'PASS' if ok else 'FAIL'}: pid {pid} on {bus}: nvidia-smi {mib} MiB, "
          f"xpulaunch {row['memory_bytes']} bytes, user {row['user']}, command {row['command']!r}")
    bad += not ok
held = [r for r in rows if r["pid"] == holder]
print(("PASS" if held and held[0]["memory_bytes"] >= 2 * 1024**3 else "FAIL")
      + f": the 2 GiB holder (pid {holder}) is listed with at least 2 GiB: {held}")
bad += not (held and held[0]["memory_bytes"] >= 2 * 1024**3)
smi_pids = {int(line.split(",")[0]) for line in open(smi_path) if line.strip()}
extra = [r for r in rows if r["source"] == "nvml" and r["pid"] not in smi_pids]
print(("PASS" if not extra else "FAIL") + f": no NVML process that nvidia-smi does not list: {extra}")
bad += bool(extra)
sys.exit(1 if bad else 0)
PYEOF

printf '\n%s\n' "$([ "$FAILS" -eq 0 ] && echo "ALL PASS" || echo "$FAILS FAILED")"
[ "$FAILS" -eq 0 ]
