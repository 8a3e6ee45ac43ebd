"""A tiny launcher for the lease tests: allocate devices through LeaseManager, then act.

It plans with a small pure planner of its own over a fake inventory of N NVIDIA cards (keys
0000:0i:00.0), so the tests exercise the real lock directory, real processes and real signals
at the level of ``LeaseManager``: a slow planner, or a child holding the lease with no
supervisor or guardian around it. What ``xpulaunch run`` itself does under a lease is tested
with the real command in test_cli_leases.py.

    python lease_worker.py --lock-dir D --gpus 1 --wait hold --seconds 0.2 --audit FILE
    python lease_worker.py --lock-dir D --gpus device=KEY spawn     # child inherits the fds

Exit status: 0 on success, else the XpulaunchError's exit code with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping

from xpulaunch.errors import DeviceBusyError, SelectionError, XpulaunchError
from xpulaunch.leases import Lease, LeaseManager
from xpulaunch.model import Backend, Device, Inventory, Plan, Unit, Vendor


def fake_inventory(count: int) -> Inventory:
    return Inventory(
        tuple(
            Device(Vendor.NVIDIA, i, name="fake", pci_bus_id=f"0000:{i + 1:02x}:00.0")
            for i in range(count)
        )
    )


def tiny_plan(inventory: Inventory, gpus: str, unavailable: Mapping[str, str]) -> Plan:
    """``none``, ``N`` (a count of free cards) or ``device=KEY[,KEY]`` (explicit keys)."""
    units = [Unit(d) for d in inventory.devices]
    if gpus == "none":
        return Plan(Backend.CPU, (), (), None)
    if gpus.startswith("device="):
        wanted = gpus.removeprefix("device=").split(",")
        chosen = [u for u in units if u.key in wanted]
        for unit in chosen:
            if unit.key in unavailable:
                raise DeviceBusyError(f"{unit.key} is leased by {unavailable[unit.key]}")
        return Plan(Backend.CUDA, tuple(chosen), (), None)
    count = int(gpus)
    if count > len(units):
        raise SelectionError(f"--gpus {count}: only {len(units)} device(s) exist")
    free = [u for u in units if u.key not in unavailable]
    if len(free) < count:
        held = "; ".join(f"{k}: leased by {who}" for k, who in sorted(unavailable.items()))
        raise SelectionError(f"--gpus {count}: only {len(free)} free ({held})")
    return Plan(Backend.CUDA, tuple(free[:count]), (), None)


def _audit(path: str, lease: Lease, start: float, end: float) -> None:
    line = "".join(f"{key} {start:.6f} {end:.6f} {os.getpid()}\n" for key in lease.keys)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines never interleave
    finally:
        os.close(fd)


def _spawn(lease: Lease) -> None:
    """A worker that inherits the lease; then this process drops its own descriptors."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        pass_fds=lease.fds,
        start_new_session=True,
    )
    lease.release()  # closes only our descriptors: the child keeps the lease alive
    print(json.dumps({"pid": os.getpid(), "child": child.pid, "keys": lease.keys}), flush=True)
    time.sleep(120)  # until the test SIGKILLs us


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lock-dir", required=True)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--gpus", default="1")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--wait-timeout", type=float)
    parser.add_argument("action", choices=["hold", "spawn"])
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--audit")
    parser.add_argument("--plan-delay", type=float, default=0.0, help="a slow planner")
    args = parser.parse_args()
    inventory = fake_inventory(args.devices)
    manager = LeaseManager(args.lock_dir, poll_interval_s=0.1)

    def plan_fn(unavailable: Mapping[str, str]) -> Plan:
        time.sleep(args.plan_delay)  # widens the read-plan-lock window racing launches share
        return tiny_plan(inventory, args.gpus, unavailable)

    try:
        _plan, lease = manager.allocate(
            plan_fn,
            wait=args.wait,
            wait_timeout_s=args.wait_timeout,
            command=["lease_worker", args.action, args.gpus],
        )
    except XpulaunchError as exc:
        print(f"{type(exc).__name__}: {exc.message}", file=sys.stderr)
        return exc.exit_code
    start = time.monotonic()  # CLOCK_MONOTONIC is one clock for every process of the host
    print(f"acquired {','.join(lease.keys)} {start:.6f}", flush=True)
    if args.action == "spawn":
        _spawn(lease)
    time.sleep(args.seconds)
    if args.audit:
        _audit(args.audit, lease, start, time.monotonic())
    lease.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
