"""How long ``xpulaunch devices --json`` takes, next to the other ways of asking the same thing.

Each command runs as a fresh process (what a user or a script pays), ``--runs`` times after one
warm-up; the median wall time is reported, with the ratio of ours to each peer. A peer that is
not available here (no nvidia-smi, no NVML library, no torch with a GPU) is skipped with the
reason printed. Run from the repository root:

    python3 bench/bench_probe.py [--runs 20] [--max-ratio 1.10]

The verdict is a ratio against the peer that does the least a probe can do on an NVIDIA host,
a fresh Python process that imports pynvml and asks NVML (``bare pynvml process``): an absolute
budget in milliseconds would measure the machine's Python start-up more than our code.

Where the time goes with more GPUs: ``pynvml, xpulaunch's calls`` makes exactly the NVML calls
the probe makes (the bare peer's, plus each GPU's name and MIG mode, and the driver version)
and no shutdown, so ours minus it is our Python and sysfs work, and it minus the bare peer is
the NVML calls the inventory needs beyond the bare peer's. ``--per-call`` also times each NVML
call on each GPU in one process (its first call and the median of repeats). The lead runs it
on 1, 2 and 4 GPUs:

    python3 bench/bench_probe.py --runs 30 --per-call     # on nvidia-h100-x1, -x2, -x4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYNVML_PEER = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetPciInfo(h)
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    pynvml.nvmlDeviceGetUtilizationRates(h)
pynvml.nvmlShutdown()
"""
PYNVML_NO_SHUTDOWN_PEER = PYNVML_PEER.replace("pynvml.nvmlShutdown()", "")
# Our probe without the link reads (NVLink, common ancestors): ours / it is what the topology
# read costs (at most 10% is the goal; docs/hardware/topology_check.sh checks it too).
NO_TOPOLOGY_PEER = f"""
import sys
sys.path.insert(0, {str(REPO / "src")!r})
from xpulaunch.core.inventory import dumps
from xpulaunch.probing.host import probe_from_env
print(dumps(probe_from_env(__import__("os").environ, read_topology=False)))
"""
# The NVML calls of xpulaunch's probe (probing/nvidia.py), in its order, without shutdown.
PYNVML_AS_XPULAUNCH_PEER = """
import pynvml
pynvml.nvmlInit()
pynvml.nvmlSystemGetDriverVersion()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetPciInfo(h), pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    pynvml.nvmlDeviceGetUtilizationRates(h)
    try:
        pynvml.nvmlDeviceGetMigMode(h)
    except pynvml.NVMLError:
        pass
"""
# Each NVML call of the probe on each GPU: its first call, then the median of REPEATS.
PER_CALL = """
import statistics, time, pynvml
REPEATS = 20
started = time.perf_counter()
pynvml.nvmlInit()
print(f"nvmlInit {(time.perf_counter() - started) * 1e3:.2f} ms; "
      f"{pynvml.nvmlDeviceGetCount()} GPU(s), driver {pynvml.nvmlSystemGetDriverVersion()}")
CALLS = [
    ("GetUUID", pynvml.nvmlDeviceGetUUID), ("GetPciInfo", pynvml.nvmlDeviceGetPciInfo),
    ("GetName", pynvml.nvmlDeviceGetName),
    ("GetMemoryInfo v2", lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)),
    ("GetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates),
    ("GetMigMode", pynvml.nvmlDeviceGetMigMode),
]
def timed(fn, *args):
    started = time.perf_counter()
    try:
        fn(*args)
    except pynvml.NVMLError as exc:
        return (time.perf_counter() - started) * 1e6, str(exc)
    return (time.perf_counter() - started) * 1e6, ""
print(f"{'gpu':<4} {'call':<20} {'first us':>10} {'median us':>10}")
for i in range(pynvml.nvmlDeviceGetCount()):
    first, _ = timed(pynvml.nvmlDeviceGetHandleByIndex, i)
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    print(f"{i:<4} {'GetHandleByIndex':<20} {first:>10.1f}")
    for name, fn in CALLS:
        first, error = timed(fn, h)
        rest = statistics.median(timed(fn, h)[0] for _ in range(REPEATS))
        print(f"{i:<4} {name:<20} {first:>10.1f} {rest:>10.1f} {error}")
started = time.perf_counter()
pynvml.nvmlShutdown()
print(f"nvmlShutdown {(time.perf_counter() - started) * 1e3:.2f} ms")
"""
# What pip writes as the `xpulaunch` console script (the checkout is not installed on the lent
# GPU machines): `python -m xpulaunch` would add runpy's imports, which users do not pay.
CONSOLE_SCRIPT = """
import re
import sys
from xpulaunch.cli.main import console_main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(console_main())
"""
TORCH_PEER = """
import sys, torch
if torch.cuda.is_available():
    print([torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count())])
elif hasattr(torch, "xpu") and torch.xpu.is_available():
    print([torch.xpu.mem_get_info(i) for i in range(torch.xpu.device_count())])
else:
    sys.exit("torch %s sees no CUDA or XPU device" % torch.__version__)
"""
NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu",
    "--format=csv,noheader,nounits",
]


def check(argv: list[str], env: dict[str, str]) -> str | None:
    """Why ``argv`` cannot be measured here (None: it runs)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"


def measure(
    commands: dict[str, list[str]], runs: int, env: dict[str, str]
) -> dict[str, list[float]]:
    """Wall seconds of each run of each command, in interleaved rounds (a busy moment of the
    machine slows every command alike)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(wall_time(argv, env))
    return times


def wall_time(argv: list[str], env: dict[str, str], limit_s: float = 120.0) -> float:
    """Seconds from the start of ``argv`` to its exit, read by a blocking wait.

    Not ``subprocess.run(..., timeout=...)``: with a timeout and no pipes, Popen.wait polls with
    sleeps that double up to 50 ms (1, 2, 4 ... 32, then 50 ms), so every time it reports is
    rounded up to the next of about 63, 113, 163, 213 ms. This bench's figures before
    2026-11-26's twelfth session were read that way and are void. The limit is a timer that
    kills the process instead."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    guard = threading.Timer(limit_s, process.kill)
    guard.start()
    try:
        process.wait()  # no timeout: one blocking waitpid
    finally:
        guard.cancel()
    return time.perf_counter() - started


def peers(python: str) -> list[tuple[str, list[str] | str]]:
    """(name, argv) for each peer, or (name, reason) when it is absent."""
    smi = shutil.which("nvidia-smi")
    return [
        ("nvidia-smi --query-gpu", [smi, *NVIDIA_SMI_QUERY] if smi else "nvidia-smi not on PATH"),
        ("bare pynvml process", [python, "-c", PYNVML_PEER]),
        ("bare pynvml, no shutdown", [python, "-c", PYNVML_NO_SHUTDOWN_PEER]),
        ("pynvml, xpulaunch's calls", [python, "-c", PYNVML_AS_XPULAUNCH_PEER]),
        ("torch mem_get_info", [python, "-c", TORCH_PEER]),
        ("xpulaunch probe, no topology read", [python, "-c", NO_TOPOLOGY_PEER]),
    ]


PEER = "bare pynvml process"


def gpu_count(python: str, env: dict[str, str]) -> str:
    """How many GPUs NVML lists here (the ratio depends on it), or why it cannot tell."""
    code = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "unknown (NVML not usable here)"


def wrong_answer(name: str, argv: list[str], env: dict[str, str], gpus: str) -> str | None:
    """What is wrong with the inventory ``argv`` prints (None: every GPU NVML counts is there,
    each with its memory in use, and NVML recorded no problem; other problems are printed)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    document = json.loads(done.stdout)
    devices, problems = document.get("devices", []), document.get("problems", [])
    if gpus.isdigit() and len(devices) != int(gpus):
        return f"lists {len(devices)} devices where NVML counts {gpus}"
    if any(d.get("memory_used_bytes") is None for d in devices):
        return "a device without its memory in use"
    nvml = [p for p in problems if p.get("source") == "nvml"]
    if problems:
        print(f"{name}: problems recorded: {problems}")
    return f"NVML's problems: {nvml}" if nvml else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--python", default=sys.executable, help="interpreter for all Python runs")
    parser.add_argument("--max-ratio", type=float, default=1.10, help="ours / bare pynvml")
    parser.add_argument(
        "--per-call",
        action="store_true",
        help="also time each NVML call of the probe on each GPU (in one process)",
    )
    parser.add_argument(
        "--compare-src",
        metavar="DIR",
        help="also time `devices --json` from another source tree (a folder holding the "
        "xpulaunch package: the code before a change), in the same interleaved rounds",
    )
    parser.add_argument(
        "--no-torch",
        action="store_true",
        help="leave out the torch peer (seconds a run: the bench then fits a short lease)",
    )
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as inherited (every run recompiles every module)",
    )
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        help="the folder every command runs in (default: a new empty one). Not the checkout: "
        "its pyproject.toml names xpulaunch, so every command of ours would parse it as a "
        "possible config file, which a user's folder without one does not cost",
    )
    args = parser.parse_args()
    if args.compare_src:
        args.compare_src = os.path.abspath(args.compare_src)
    os.chdir(args.cwd or tempfile.mkdtemp(prefix="bench-probe-cwd-"))
    print(f"commands run in {os.getcwd()}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    if not args.no_bytecode:
        # An installed package has bytecode (pip compiles at install). Some machines set
        # PYTHONDONTWRITEBYTECODE=1, which makes every run recompile every module it imports:
        # give all Python runs alike (ours and the Python peers) a bytecode cache.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="bench-probe-pyc-")
        print(f"bytecode cached in {env['PYTHONPYCACHEPREFIX']} (as in an installed package)")
    else:
        print(f"PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', 'unset')}")
    script = Path(tempfile.mkdtemp(prefix="bench-probe-")) / "xpulaunch"
    script.write_text(CONSOLE_SCRIPT)
    ours_name = "xpulaunch devices --json"
    commands = {ours_name: [args.python, str(script), "devices", "--json"]}
    if args.compare_src:
        other = script.with_name("xpulaunch-compared")
        other.write_text(f"import sys\nsys.path.insert(0, {args.compare_src!r})\n{CONSOLE_SCRIPT}")
        compared = f"{ours_name} ({args.compare_src})"
        commands[compared] = [args.python, str(other), "devices", "--json"]
    for name, argv in peers(args.python):
        if args.no_torch and name.startswith("torch"):
            continue
        reason = argv if isinstance(argv, str) else check(argv, env)
        if reason is None and not isinstance(argv, str):
            commands[name] = argv
        else:
            print(f"{name:<28} skipped: {reason}")
    reason = check(commands[ours_name], env)
    if reason is not None:
        print(f"{ours_name}: cannot run ({reason})")
        return 1
    count = gpu_count(args.python, env)
    print(f"GPUs: {count}")
    for name in [n for n in commands if n.startswith(ours_name)]:
        wrong = wrong_answer(name, commands[name], env, count)
        if wrong:  # a faster answer that is wrong is not faster
            print(f"{name}: {wrong}")
            return 1
    times = measure(commands, args.runs, env)
    ours_ms = statistics.median(times[ours_name]) * 1000
    width = max(28, *map(len, times))
    print(f"{'command':<{width}} {'median':>10} {'mean':>10} {'min':>10}  ours/peer "
          f"({args.runs} interleaved runs)")  # fmt: skip
    for name, values in times.items():
        peer_ms = statistics.median(values) * 1000
        ratio = "" if name == ours_name else f"  {ours_ms / peer_ms:.2f}x"
        print(f"{name:<{width}} {peer_ms:>8.1f}ms {statistics.mean(values) * 1000:>8.1f}ms "
              f"{min(values) * 1000:>8.1f}ms{ratio}")  # fmt: skip
    if args.per_call:
        done = subprocess.run([args.python, "-c", PER_CALL], capture_output=True, text=True,
                              env=env, timeout=300, check=False)  # fmt: skip
        print(done.stdout + done.stderr, end="")
    if PEER not in times:
        print(f"no verdict: the {PEER!r} peer could not run here")
        return 0
    ratio = ours_ms / (statistics.median(times[PEER]) * 1000)
    verdict = "within" if ratio <= args.max_ratio else "OVER"
    print(f"ratio: ours / {PEER} = {ratio:.2f}x, {verdict} the {args.max_ratio:g}x goal")
    return 0 if ratio <= args.max_ratio else 2


if __name__ == "__main__":
    sys.exit(main())
