"""NvmlSettle with a scripted NVML: no NVIDIA GPU exists on this machine.

The fake answers exactly the calls pynvml offers (device-semantics.md 4.4): handles by PCI
bus id or UUID, and ``nvmlDeviceGetMemoryInfo(handle).used`` in bytes.
"""

from __future__ import annotations

from types import SimpleNamespace

from xpulaunch.launch.gpu_settle import SLACK_BYTES, NvmlSettle

GIB = 1024**3


class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, used: dict[str, list[int]]) -> None:
        self.used = used  # device id -> successive answers (the last one repeats)
        self.calls: list[str] = []

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        if bus_id not in self.used:
            raise self.NVMLError("Not Found")
        return bus_id

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return self.nvmlDeviceGetHandleByPciBusId(uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        self.calls.append(handle)
        answers = self.used[handle]
        value = answers.pop(0) if len(answers) > 1 else answers[0]
        return SimpleNamespace(total=80 * GIB, used=value, free=80 * GIB - value)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def settle(nvml: FakeNvml, devices: dict[str, list[str]], clock: Clock) -> NvmlSettle:
    return NvmlSettle(devices, nvml=nvml, clock=clock, sleep=clock.sleep, timeout_s=10, poll_s=0.5)


def test_waits_until_memory_is_back_to_baseline() -> None:
    bus = "0000:00:06.0"
    nvml = FakeNvml({bus: [1 * GIB, 40 * GIB, 30 * GIB, 1 * GIB]})
    clock = Clock()
    helper = settle(nvml, {"0": [bus]}, clock)
    helper.baseline()  # 1 GiB used before the job
    helper(["0"])
    assert clock.now == 1.0  # two polls of 0.5 s until 1 GiB again
    assert helper.notes == []


def test_slack_for_small_other_allocations() -> None:
    bus = "0000:00:06.0"
    nvml = FakeNvml({bus: [GIB, GIB + SLACK_BYTES]})
    clock = Clock()
    helper = settle(nvml, {"0": [bus]}, clock)
    helper.baseline()
    helper(["0"])
    assert clock.now == 0.0


def test_bounded_wait_leaves_a_note() -> None:
    uuid = "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04"
    nvml = FakeNvml({uuid: [0, 70 * GIB]})
    clock = Clock()
    helper = settle(nvml, {"0": [uuid]}, clock)
    helper.baseline()
    helper(["0"])
    assert clock.now == 10.0
    assert helper.notes == [f"GPU memory not released after 10 s: {uuid}"]


def test_only_the_named_workers_devices_are_watched() -> None:
    nvml = FakeNvml({"0000:00:06.0": [0], "0000:00:07.0": [0, 50 * GIB]})
    clock = Clock()
    helper = settle(nvml, {"0": ["0000:00:06.0"], "1": ["0000:00:07.0"]}, clock)
    helper.baseline()
    nvml.calls.clear()
    helper(["0"])
    assert nvml.calls == ["0000:00:06.0"]


def test_nvml_errors_end_the_wait_with_a_note() -> None:
    nvml = FakeNvml({"0000:00:06.0": [0]})
    clock = Clock()
    helper = settle(nvml, {"0": ["0000:00:06.0", "0000:00:99.0"]}, clock)
    helper.baseline()
    assert helper.notes == ["cannot watch GPU memory through NVML: Not Found"]
    helper(["0"])  # still answers for what it could measure, and never raises
