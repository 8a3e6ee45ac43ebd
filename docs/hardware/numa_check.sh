#!/usr/bin/env bash
# --cpu-bind on a real NVIDIA host: its NUMA layout as sysfs shows it, what xpulaunch records
# and plans, that each worker really runs where its plan says, and a host-to-device copy loop
# (pinned memory) bound near its GPU, bound to the far node, and left unbound.
#
# For a lent GPU machine (any nvidia-* kind; the copy comparison means most on a two-socket
# host such as nvidia-h100-x8). Needs python3 with torch (CUDA) and the repository's deps
# (gpu_env.sh installs them from .whl/ when they are missing). From the repository root:
#
#     OUT=/some/dir bash docs/hardware/numa_check.sh
#
# Writes numa_check.log (everything), layout.txt, inventory.json, plan_*.json, run_*.out and
# h2d.csv (one line per measurement) to $OUT; prints PASS/FAIL lines and exits 1 on any FAIL.
# About 3-6 minutes on 8 GPUs (CUDA start-up of each measuring process dominates).
set -u
cd "$(dirname "$0")/../.." || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY XPULAUNCH_SYSFS_ROOT XPULAUNCH_PROCFS_ROOT \
      XPULAUNCH_CPUS XPULAUNCH_CPU_BIND OMP_NUM_THREADS
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
exec > >(tee "$OUT/numa_check.log") 2>&1
PY=${PYTHON:-python3}
if ! "$PY" -c 'import click, psutil, pynvml' 2>/dev/null && [ -d .whl ]; then
    # shellcheck source=/dev/null
    source docs/hardware/gpu_env.sh
fi
XL=("$PY" -m xpulaunch)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
section() { printf '\n=== %s ===\n' "$*"; }
verdict() { printf '%s: %s\n' "$1" "${*:2}"; [ "$1" = FAIL ] && FAILS=$((FAILS + 1)); return 0; }

section "host"
date -u; hostname; uname -r
git log -1 --format='xpulaunch commit %h %s' 2>/dev/null
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
grep Cpus_allowed_list /proc/self/status

section "NUMA layout as sysfs shows it (also in layout.txt)"
{
    lscpu | grep -Ei '^(model name|socket|core|thread|numa|cpu\(s\))' || true
    for node in /sys/devices/system/node/node[0-9]*; do
        echo "$(basename "$node") cpulist $(cat "$node/cpulist")"
    done
    for dev in /sys/bus/pci/devices/*; do
        [ "$(cat "$dev/vendor")" = 0x10de ] || continue
        case "$(cat "$dev/class")" in 0x03*) ;; *) continue ;; esac
        echo "gpu $(basename "$dev") numa_node $(cat "$dev/numa_node") local_cpulist $(cat "$dev/local_cpulist")"
    done
    command -v numactl >/dev/null && numactl -H
    nvidia-smi topo -m
} | tee "$OUT/layout.txt"
NODES=$(ls -d /sys/devices/system/node/node[0-9]* | wc -l)
echo "NUMA nodes: $NODES"

section "xpulaunch devices --json (numa_node, local_cpulist, cpu_topology)"
"${XL[@]}" devices --json > "$OUT/inventory.json"; echo "exit $?"
"$PY" - "$OUT/inventory.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
print("cpu_topology:", json.dumps({k: v for k, v in doc.get("cpu_topology", {}).items()
                                   if k != "smt_siblings"}))
print("smt sibling groups:", len(doc.get("cpu_topology", {}).get("smt_siblings", [])))
for d in doc["devices"]:
    print(d["vendor"], d["index"], d["pci_bus_id"], "numa_node", d.get("numa_node"),
          "local_cpulist", d.get("local_cpulist"))
EOF
"$PY" - "$OUT/inventory.json" > "$WORK/agree.txt" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
for d in doc["devices"]:
    raw = open(f"/sys/bus/pci/devices/{d['pci_bus_id']}/numa_node").read().strip()
    want = None if int(raw) < 0 else int(raw)
    ok = d.get("numa_node") == want
    print(("PASS" if ok else "FAIL") + f": {d['pci_bus_id']} numa_node {d.get('numa_node')} (sysfs {raw})")
EOF
cat "$WORK/agree.txt"; FAILS=$((FAILS + $(grep -c '^FAIL' "$WORK/agree.txt")))

# Each worker: its affinity, its planned CPUs, the GPU torch shows at cuda:0 (with --isolate)
# and that GPU's NUMA node from sysfs.
cat > "$WORK/where.py" <<'EOF'
import json, os, torch
p = torch.cuda.get_device_properties(0)
bdf = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
node = int(open(f"/sys/bus/pci/devices/{bdf}/numa_node").read())
print("WHERE", json.dumps({"rank": os.environ["LOCAL_RANK"], "bdf": bdf, "node": node,
      "affinity": sorted(os.sched_getaffinity(0)), "planned": os.environ.get("XPULAUNCH_CPUS"),
      "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
EOF
for mode in numa exclusive; do
    section "--cpu-bind $mode: plan and a real run (one GPU per worker)"
    "${XL[@]}" run --dry-run --gpus all --nproc-per-node auto --isolate --cpu-bind $mode \
        -- "$PY" "$WORK/where.py" | grep -E 'cpu-bind|XPULAUNCH_CPUS|OMP_NUM'
    "${XL[@]}" run --dry-run --json --gpus all --nproc-per-node auto --isolate --cpu-bind $mode \
        -- "$PY" "$WORK/where.py" > "$OUT/plan_$mode.json"
    "${XL[@]}" run --gpus all --nproc-per-node auto --isolate --cpu-bind $mode \
        -- "$PY" "$WORK/where.py" > "$OUT/run_$mode.out" 2>&1
    echo "exit $?"
    "$PY" - "$OUT/run_$mode.out" "$mode" > "$WORK/run_$mode.txt" <<'EOF'
import json, sys
def cpus(text):
    out = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
def node_cpus(n):
    return cpus(open(f"/sys/devices/system/node/node{n}/cpulist").read().strip()) if n >= 0 else None
rows = [json.loads(l.split("WHERE ", 1)[1]) for l in open(sys.argv[1]) if "WHERE " in l]
print(("PASS" if rows else "FAIL") + f": {len(rows)} workers reported")
seen = set()
for r in rows:
    aff, planned = set(r["affinity"]), cpus(r["planned"] or "")
    print(("PASS" if aff == planned else "FAIL") + f": rank {r['rank']} on {r['bdf']} (node {r['node']}) runs on its planned CPUs {r['planned']}")
    near = node_cpus(r["node"])
    if near is not None:
        print(("PASS" if aff <= near else "FAIL") + f": rank {r['rank']}'s CPUs are on its GPU's node {r['node']}")
    if sys.argv[2] == "exclusive":
        print(("PASS" if not aff & seen else "FAIL") + f": rank {r['rank']}'s CPUs are its own")
        seen |= aff
EOF
    cat "$WORK/run_$mode.txt"; FAILS=$((FAILS + $(grep -c '^FAIL' "$WORK/run_$mode.txt")))
done

# The copy loop: pinned host buffer -> GPU, BYTES per copy, REPS copies per trial, median of
# TRIALS. --bind near|far sets the affinity itself before CUDA starts (the GPU's node, or
# another one); "none" keeps what it was started with (xpulaunch's binding, or none).
cat > "$WORK/h2d.py" <<'EOF'
import json, os, statistics, sys, time
bind, tag = sys.argv[1], sys.argv[2]
BYTES, REPS, TRIALS = 256 << 20, 40, 7
def cpus(text):
    out = set()
    for part in filter(None, text.strip().split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
import torch  # CUDA not initialised yet: the affinity below applies to every CUDA thread
p = torch.cuda.get_device_properties(0)
bdf = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
node = int(open(f"/sys/bus/pci/devices/{bdf}/numa_node").read())
nodes = sorted(int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()
               and open(f"/sys/devices/system/node/{n}/cpulist").read().strip())
if bind in ("near", "far"):
    target = node if bind == "near" else next((n for n in nodes if n != node), None)
    if target is None or node < 0:
        print("H2D", json.dumps({"tag": tag, "bind": bind, "skipped": "one NUMA node or unknown"}))
        sys.exit(0)
    os.sched_setaffinity(0, cpus(open(f"/sys/devices/system/node/node{target}/cpulist").read()))
host = torch.empty(BYTES, dtype=torch.uint8).pin_memory()
host.fill_(1)
dev = torch.empty(BYTES, dtype=torch.uint8, device="cuda")
back = torch.empty(BYTES, dtype=torch.uint8).pin_memory()
def rate(fn):
    fn(); torch.cuda.synchronize()
    runs = []
    for _ in range(TRIALS):
        start = time.perf_counter()
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
        runs.append(BYTES * REPS / (time.perf_counter() - start) / 1e9)
    return statistics.median(runs)
h2d = rate(lambda: dev.copy_(host, non_blocking=True))
d2h = rate(lambda: back.copy_(dev, non_blocking=True))
print("H2D", json.dumps({"tag": tag, "bind": bind, "gpu": bdf, "gpu_node": node,
      "cpus": len(os.sched_getaffinity(0)), "h2d_GBps": round(h2d, 2), "d2h_GBps": round(d2h, 2)}),
      flush=True)
EOF

section "copy loop, one GPU at a time (the first GPU of each node): near, far, unbound"
echo "tag,bind,gpu,gpu_node,cpus,h2d_GBps,d2h_GBps" > "$OUT/h2d.csv"
record() {  # record FILE: append its H2D lines to h2d.csv
    "$PY" - "$1" "$OUT/h2d.csv" <<'EOF'
import json, sys
rows = [json.loads(l.split("H2D ", 1)[1]) for l in open(sys.argv[1]) if "H2D " in l]
with open(sys.argv[2], "a") as out:
    for r in rows:
        print(r)
        if "skipped" not in r:
            out.write(",".join(str(r[k]) for k in ("tag", "bind", "gpu", "gpu_node", "cpus",
                                                    "h2d_GBps", "d2h_GBps")) + "\n")
EOF
}
FIRSTS=$("$PY" - "$OUT/inventory.json" <<'EOF'
import json, sys
seen, out = set(), []
for d in json.load(open(sys.argv[1]))["devices"]:
    if d.get("numa_node") not in seen:
        seen.add(d.get("numa_node")); out.append(str(d["index"]))
print(" ".join(out))
EOF
)
for gpu in $FIRSTS; do
    for bind in near far none; do
        CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$gpu "$PY" "$WORK/h2d.py" $bind single \
            > "$WORK/single.out" 2>&1
        record "$WORK/single.out"
    done
    "${XL[@]}" run --gpus device=$gpu --cpu-bind numa -- "$PY" "$WORK/h2d.py" none single-xpulaunch-numa \
        > "$WORK/single.out" 2>&1
    record "$WORK/single.out"
done

section "copy loop on every GPU at once (one worker each): xpulaunch --cpu-bind numa / exclusive / none, and all far"
for mode in numa exclusive none; do
    "${XL[@]}" run --gpus all --nproc-per-node auto --isolate --cpu-bind $mode \
        -- "$PY" "$WORK/h2d.py" none "all-$mode" > "$WORK/all.out" 2>&1
    echo "--cpu-bind $mode: exit $?"
    record "$WORK/all.out"
done
"${XL[@]}" run --gpus all --nproc-per-node auto --isolate -- "$PY" "$WORK/h2d.py" far all-far \
    > "$WORK/all.out" 2>&1
record "$WORK/all.out"

section "copy loop summary (median GB/s over the GPUs of each case)"
"$PY" - "$OUT/h2d.csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cases = {}
for r in rows:
    cases.setdefault((r["tag"], r["bind"]), []).append(r)
for (tag, bind), rs in cases.items():
    h2d = statistics.median(float(r["h2d_GBps"]) for r in rs)
    d2h = statistics.median(float(r["d2h_GBps"]) for r in rs)
    print(f"{tag:<26} {bind:<5} {len(rs)} GPU(s)  H2D {h2d:7.2f} GB/s  D2H {d2h:7.2f} GB/s")
EOF

section "summary"
echo "failures: $FAILS (results in $OUT)"
[ "$FAILS" -eq 0 ]
