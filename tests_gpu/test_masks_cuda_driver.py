"""The CUDA driver itself against parse_cuda_visible_devices (needs >= 2 NVIDIA GPUs).

Each case runs a fresh child with CUDA_VISIBLE_DEVICES set; the child asks libcuda (ctypes,
no torch) which GPUs it enumerates, by PCI address, and the test compares that with the
parser's answer for the same value on the same host. Skipped where there is no NVIDIA driver
or fewer than two GPUs (this development machine has none; run it on the GPU host).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from xpulaunch.core.device_ids import normalize_bus_id
from xpulaunch.core.masks.cuda import parse_cuda_visible_devices
from xpulaunch.errors import MaskError
from xpulaunch.model import Device, Vendor

pytestmark = pytest.mark.slow

_CHILD = r"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
rc = cuda.cuInit(0)
buses = []
if rc == 0:
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    for ordinal in range(count.value):
        dev = ctypes.c_int(0)
        cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
        name = ctypes.create_string_buffer(64)
        cuda.cuDeviceGetPCIBusId(name, 64, dev)
        buses.append(name.value.decode())
print(json.dumps({"rc": rc, "buses": buses}))
"""


def _host_gpus() -> tuple[Device, ...]:
    if shutil.which("nvidia-smi") is None or ctypes.util.find_library("cuda") is None:
        return ()
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if out.returncode != 0:
        return ()
    rows = [line.split(", ") for line in out.stdout.strip().splitlines()]
    return tuple(Device(Vendor.NVIDIA, int(i), None, normalize_bus_id(b), u) for i, u, b in rows)


GPUS = _host_gpus()
needs_two = pytest.mark.skipif(len(GPUS) < 2, reason="needs an NVIDIA driver and >= 2 GPUs")


def _driver_sees(value: str) -> tuple[int, list[str | None]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env.update(CUDA_VISIBLE_DEVICES=value, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    return result["rc"], [normalize_bus_id(b) for b in result["buses"]]


def _cases() -> list[str]:
    if len(GPUS) < 2:
        return []
    u0, u1 = GPUS[0].uuid or "", GPUS[1].uuid or ""
    return [
        *("", "-1", "0", "1", "1,0", "0,-1,1", "0,7,1", "7", "foo", "0,foo,1", " 1", "1 "),
        u1[:12],
        u1,
        f"{u0},{u1[:10]}",
        "GPU-",
        "MIG-GPU-bogus",
        "1,GPU-zzz",
        "1gpu",
        "+1",
        "0,0",
        f"1,{u1[:12]}",
    ]


@needs_two
@pytest.mark.parametrize("value", _cases())
def test_parser_matches_the_cuda_driver(value: str) -> None:
    rc, buses = _driver_sees(value)
    try:
        parsed = parse_cuda_visible_devices(value, GPUS)
    except MaskError:
        assert rc != 0 or buses == [], f"driver accepted {value!r}: {buses}"
        return
    assert rc in (0, 100), f"cuInit failed with {rc} for {value!r}"  # 100: no device
    assert buses == [e.device.pci_bus_id for e in parsed.entries]
