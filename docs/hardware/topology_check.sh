#!/usr/bin/env bash
# How xpulaunch reads GPU links, on a real NVIDIA host: nvidia-smi topo -m next to
# `xpulaunch devices --topology` (and --json), each GPU's sysfs path, and the probe timed with
# and without the topology read (NVML's NVLink and common-ancestor queries).
#
# For the lent one-GPU machine (nvidia-h200 or nvidia-h100-x1; on more GPUs the pair cells are
# compared too). Needs python3 with the repository's deps (gpu_env.sh installs them from .whl/
# when they are missing); no torch, no CUDA context. From the repository root:
#
#     OUT=/some/dir bash docs/hardware/topology_check.sh
#
# Writes topology_check.log (everything), nvidia-smi-topo.txt, devices-topology.txt,
# inventory.json and timing.json to $OUT; prints PASS/FAIL lines, exits 1 on any FAIL.
# About a minute (2 x RUNS fresh probe processes, RUNS=20 by default).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.." || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES XPULAUNCH_INVENTORY XPULAUNCH_SYSFS_ROOT XPULAUNCH_PROCFS_ROOT
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
exec > >(tee "$OUT/topology_check.log") 2>&1
PY=${PYTHON:-python3}
if ! "$PY" -c 'import click, psutil, pynvml' 2>/dev/null && [ -d .whl ]; then
    # shellcheck source=/dev/null
    source docs/hardware/gpu_env.sh
fi
RUNS=${RUNS:-20}
FAILS=0
section() { printf '\n=== %s ===\n' "$*"; }
verdict() { printf '%s: %s\n' "$1" "${*:2}"; [ "$1" = FAIL ] && FAILS=$((FAILS + 1)); return 0; }

section "host"
date -u; hostname; uname -r
git log -1 --format='xpulaunch commit %h %s' 2>/dev/null
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader

section "nvidia-smi topo -m (also nvidia-smi-topo.txt)"
nvidia-smi topo -m | tee "$OUT/nvidia-smi-topo.txt"

section "each GPU's sysfs path (the PCIe bridges above it)"
for dev in /sys/bus/pci/devices/*; do
    [ "$(cat "$dev/vendor")" = 0x10de ] || continue
    case "$(cat "$dev/class")" in 0x03*) ;; *) continue ;; esac
    echo "$(basename "$dev") -> $(readlink -f "$dev") numa_node $(cat "$dev/numa_node")"
done

section "xpulaunch devices --topology (also devices-topology.txt)"
"$PY" -m xpulaunch devices --topology | tee "$OUT/devices-topology.txt"
echo "exit ${PIPESTATUS[0]}"

section "xpulaunch devices --topology --json (inventory.json)"
"$PY" -m xpulaunch devices --topology --json > "$OUT/inventory.json"; echo "exit $?"
"$PY" - "$OUT/inventory.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
for d in doc["devices"]:
    keep = ("links", "pci_path", "pcie", "numa_node", "local_cpulist")
    print(d["index"], d["pci_bus_id"], {k: d.get(k) for k in keep})
print("topology:", json.dumps(doc.get("topology")))
print("problems:", doc.get("problems", []))
EOF

section "the matrix against nvidia-smi topo -m"
"$PY" - "$OUT/nvidia-smi-topo.txt" "$OUT/inventory.json" <<'EOF'
import json, sys
from xpulaunch.probing.parsers.topology import parse_nvidia_topo
smi = parse_nvidia_topo(open(sys.argv[1]).read())
doc = json.load(open(sys.argv[2]))
ours = doc["topology"]
indices = [d["index"] for d in doc["devices"]]
bad = []
for r, row in enumerate(ours["cells"]):
    for c, cell in enumerate(row):
        theirs = smi.cells.get((indices[r], indices[c]))
        if theirs is not None and theirs.strip() != cell:
            bad.append(f"GPU{indices[r]}-GPU{indices[c]}: nvidia-smi {theirs!r}, xpulaunch {cell!r}")
for r, index in enumerate(indices):
    if smi.cpu_affinity.get(index) not in (None, ours["cpu_affinity"][r]):
        bad.append(f"GPU{index} CPU affinity: nvidia-smi {smi.cpu_affinity[index]!r}, "
                   f"xpulaunch {ours['cpu_affinity'][r]!r}")
    if smi.numa_affinity.get(index) is not None and smi.numa_affinity[index] != ours["numa_affinity"][r]:
        bad.append(f"GPU{index} NUMA affinity: nvidia-smi {smi.numa_affinity[index]}, "
                   f"xpulaunch {ours['numa_affinity'][r]}")
print("\n".join(bad) or f"{len(indices)} GPU(s): every cell and affinity nvidia-smi shows matches")
sys.exit(1 if bad else 0)
EOF
if [ $? -eq 0 ]; then verdict PASS "the matrix matches nvidia-smi topo -m"
else verdict FAIL "the matrix differs from nvidia-smi topo -m (lines above)"; fi

section "probe time with and without the topology read ($RUNS fresh processes each, alternating)"
"$PY" - "$RUNS" "$OUT/timing.json" <<'EOF'
import json, statistics, subprocess, sys, time
runs, out = int(sys.argv[1]), sys.argv[2]
code = ("from xpulaunch.probing.host import probe_host; "
        "inv = probe_host(read_topology={}); assert inv.devices, inv.problems")
def once(flag):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code.format(flag)], check=True)
    return time.perf_counter() - start
once(True); once(False)  # warm-up: page cache, the driver's persistence
times = {True: [], False: []}
for _ in range(runs):
    for flag in (True, False):
        times[flag].append(once(flag))
# In one process too: the reads alone, NVML already initialised (what a supervisor pays).
from xpulaunch.probing.host import probe_host
probe_host()
inproc = {}
for flag in (True, False):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        probe_host(read_topology=flag)
        samples.append(time.perf_counter() - start)
    inproc[flag] = statistics.median(samples)
result = {
    "process_median_s": {"with": statistics.median(times[True]), "without": statistics.median(times[False])},
    "in_process_median_s": {"with": inproc[True], "without": inproc[False]},
}
result["process_ratio"] = result["process_median_s"]["with"] / result["process_median_s"]["without"]
json.dump(result, open(out, "w"), indent=2)
print(json.dumps(result, indent=2))
sys.exit(0 if result["process_ratio"] <= 1.10 else 1)
EOF
if [ $? -eq 0 ]; then verdict PASS "the topology read costs at most 10% of a probe process (timing.json)"
else verdict FAIL "the topology read costs more than 10% of a probe process (timing.json)"; fi

section "summary"
echo "files in $OUT"; ls "$OUT"
[ "$FAILS" -eq 0 ] && echo "topology_check: all PASS" || echo "topology_check: $FAILS FAIL"
[ "$FAILS" -eq 0 ]
