"""One long-lived sampler for ``xpulaunch top``: a child process that keeps NVML open and
re-reads sysfs and /proc each interval, and streams each sample as a JSON line on its stdout.

Not a probe process per frame (an interpreter start and an NVML start each time), and not NVML
in top's own process: NVML's libraries stay resident where they were loaded (see
:mod:`xpulaunch.probing.isolated`), and a view kept open for days should stay small. The
child leaves when its stdin closes (the view quit or died) or its stdout's reader is gone.

Run as ``python -m xpulaunch.probing.sampler INTERVAL_S``; :class:`Sampler` starts it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xpulaunch.model import Inventory, Problem, Vendor
from xpulaunch.probing.gpu_processes import GpuProcess


@dataclass(frozen=True, slots=True)
class Sample:
    """The devices (with their sensor readings) and the processes on them, at one moment."""

    inventory: Inventory
    processes: tuple[GpuProcess, ...] = ()
    problems: tuple[str, ...] = field(default=())


def sample(env: Mapping[str, str]) -> dict[str, object]:
    """One sample as the JSON document the child writes."""
    from xpulaunch.core.inventory import dumps
    from xpulaunch.probing.gpu_processes import gpu_processes
    from xpulaunch.probing.host import PROCFS_ROOT_ENV, probe_from_env

    inventory = probe_from_env(env)
    problems = [str(p) for p in inventory.problems]
    devices = list(inventory.devices)
    readings, trouble = _nvidia_sensors(devices)
    problems += [str(p) for p in trouble]
    found, trouble = gpu_processes(devices, proc_root=env.get(PROCFS_ROOT_ENV) or "/proc")
    problems += [str(p) for p in trouble]
    document = json.loads(dumps(inventory))
    for device in document.get("devices", []):
        key = device.get("pci_bus_id") or device.get("uuid")
        device.update(readings.get(key, {}))
    return {
        "inventory": document,
        "processes": [dataclasses.asdict(p) for p in found],
        "problems": problems,
    }


def parsed(document: Mapping[str, object]) -> Sample:
    """A sample from its JSON document."""
    from xpulaunch.core.inventory import loads

    inventory = loads(json.dumps(document["inventory"]), source="top's sampler")
    processes = document.get("processes")
    problems = document.get("problems")
    return Sample(
        inventory,
        tuple(GpuProcess(**p) for p in processes) if isinstance(processes, list) else (),
        tuple(str(p) for p in problems) if isinstance(problems, list) else (),
    )


def sample_here(env: Mapping[str, str]) -> Sample:
    """One sample taken in this process (``top --once``, which exits right after)."""
    return parsed(sample(env))


def _nvidia_sensors(devices: Sequence[object]) -> tuple[dict[str, dict[str, float]], list[Problem]]:
    from xpulaunch.model import Device
    from xpulaunch.probing.nvidia import NVML_STATE, load_nvml, nvml_sensors

    nvidia = [d for d in devices if isinstance(d, Device) and d.vendor is Vendor.NVIDIA]
    nvml = load_nvml() if nvidia else None
    if nvml is None:
        return {}, []
    try:
        NVML_STATE.init(nvml)  # once: the probe above started it, and it stays open
    except nvml.NVMLError:
        return {}, []  # the probe recorded why
    return nvml_sensors(nvml, nvidia)


def main(argv: Sequence[str]) -> int:
    interval_s = float(argv[0]) if argv else 1.0
    env = dict(os.environ)
    while True:
        try:
            sys.stdout.write(json.dumps(sample(env)) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            return 0
        ready, _, _ = select.select([sys.stdin], [], [], interval_s)
        if ready and not os.read(sys.stdin.fileno(), 1):
            return 0  # the view closed our stdin: it quit (or died)


class Sampler:
    """The sampler child, and the latest sample it sent (read by a thread of ours)."""

    def __init__(self, env: Mapping[str, str], interval_s: float) -> None:
        argv = [sys.executable, "-m", "xpulaunch.probing.sampler", str(interval_s)]
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
        )
        self._latest: Sample | None = None
        self._arrived = threading.Event()
        self._reader = threading.Thread(target=self._read, name="top-sampler", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def ended(self) -> int | None:
        """The child's exit status once it has ended (it should not, while we run)."""
        return self._process.poll()

    def latest(self, wait_s: float = 0.0) -> Sample | None:
        """The newest sample; waits up to ``wait_s`` for the first one."""
        self._arrived.wait(wait_s)
        return self._latest

    def _read(self) -> None:
        from xpulaunch.errors import InventoryError

        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                self._latest = parsed(json.loads(line))
            except (ValueError, KeyError, TypeError, InventoryError):
                continue  # not a whole sample: the next one will be
            self._arrived.set()
        self._arrived.set()  # the child is gone: nobody waits for it any more

    def close(self) -> None:
        """Close its stdin (it leaves), and make sure it is gone."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)  # it has read to the end: the child is gone
        if self._process.stdout is not None and not self._reader.is_alive():
            self._process.stdout.close()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
