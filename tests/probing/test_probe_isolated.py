"""probe_isolated: the same inventory as probing in-process, with the probe's imports and
memory left in a forked child (NVML must not stay resident in a long-lived supervisor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from probe_fakes import FakeMachine, b580_uhd_host

from xpulaunch.core.inventory import dumps
from xpulaunch.probing import isolated
from xpulaunch.probing.host import PROCFS_ROOT_ENV, SYSFS_ROOT_ENV, probe_from_env


def fake_intel_host(tmp_path: Path) -> dict[str, str]:
    """A fake Arc B580 + UHD host: devices and a problem (memory used unknown) to carry."""
    m = FakeMachine(tmp_path)
    b580_uhd_host(m)
    return {SYSFS_ROOT_ENV: str(m.sys), PROCFS_ROOT_ENV: str(m.proc), "PATH": str(tmp_path)}


def run_isolated(code: str, env: dict[str, str]) -> dict[str, object]:
    """Run ``code`` in a fresh, single-threaded interpreter; it prints one JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_forked_probe_gives_the_in_process_inventory(tmp_path: Path) -> None:
    env = fake_intel_host(tmp_path)
    code = (
        "import json, os\n"
        "from xpulaunch.core.inventory import dumps\n"
        "from xpulaunch.probing.isolated import probe_isolated\n"
        "print(json.dumps({'doc': dumps(probe_isolated(dict(os.environ))), 'pid': os.getpid()}))\n"
    )
    result = run_isolated(code, env)
    expected = dumps(probe_from_env({**os.environ, **env}))
    assert result["doc"] == expected
    document = json.loads(expected)
    assert document["devices"] and document["problems"]  # a real comparison


def test_the_childs_imports_and_state_stay_in_the_child(tmp_path: Path) -> None:
    code = (
        "import json, os, sys\n"
        "from xpulaunch.probing import isolated\n"
        "from xpulaunch.model import Inventory, Problem\n"
        "seen = []\n"
        "def probe(env):\n"
        "    import wave  # stands in for pynvml: loaded only where the probe ran\n"
        "    seen.append(os.getpid())\n"
        "    return Inventory(devices=(), problems=(Problem('nvml', f'from {os.getpid()}'),))\n"
        "isolated._probe = probe\n"
        "inv = isolated.probe_isolated({})\n"
        "print(json.dumps({'problems': [str(p) for p in inv.problems], 'me': os.getpid(),\n"
        "                  'wave': 'wave' in sys.modules, 'seen': seen}))\n"
    )
    result = run_isolated(code, {})
    assert result["wave"] is False and result["seen"] == []
    (problem,) = result["problems"]  # type: ignore[misc]
    assert problem.startswith("nvml: from ") and problem != f"nvml: from {result['me']}"


def test_a_failing_child_is_recorded_and_the_probe_runs_here() -> None:
    code = (
        "import json, os\n"
        "from xpulaunch.probing import isolated\n"
        "from xpulaunch.model import Inventory\n"
        "parent = os.getpid()\n"
        "def probe(env):\n"
        "    if os.getpid() != parent:\n"
        "        raise RuntimeError('a bug in the probe')\n"
        "    return Inventory(devices=(), problems=())\n"
        "isolated._probe = probe\n"
        "inv = isolated.probe_isolated({})\n"
        "print(json.dumps({'problems': [str(p) for p in inv.problems]}))\n"
    )
    result = run_isolated(code, {})
    assert result["problems"] == ["probe: the forked probe failed (exit status 1); probed here"]


def test_with_other_threads_it_does_not_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise AssertionError("forked while another thread ran")

    monkeypatch.setattr(isolated.os, "fork", no_fork)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        nowhere = {SYSFS_ROOT_ENV: "/nonexistent", PROCFS_ROOT_ENV: "/nonexistent", "PATH": ""}
        inventory = isolated.probe_isolated(nowhere)
    finally:
        stop.set()
        other.join()
    assert inventory.devices == ()


def test_leaving_without_the_result_kills_and_reaps_the_child() -> None:
    code = (
        "import json, os, time\n"
        "from xpulaunch.probing import isolated\n"
        "def probe(env):\n"
        "    time.sleep(30)\n"
        "isolated._probe = probe\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    with isolated.ForkedProbe({}) as probing:\n"
        "        child = probing._pid\n"
        "        raise ValueError('bad --grace')  # an error before result(), as in run\n"
        "except ValueError:\n"
        "    pass\n"
        "try:\n"
        "    os.kill(child, 0)\n"
        "    alive = True\n"
        "except ProcessLookupError:\n"
        "    alive = False  # killed and reaped: not even a zombie holds its pid\n"
        "print(json.dumps({'alive': alive, 'took_s': time.monotonic() - started}))\n"
    )
    result = run_isolated(code, {})
    assert result["alive"] is False
    assert isinstance(result["took_s"], float) and result["took_s"] < 10


def test_the_child_is_reaped_after_a_result() -> None:
    code = (
        "import json, os, time\n"
        "from xpulaunch.probing import isolated\n"
        "from xpulaunch.model import Inventory\n"
        "isolated._probe = lambda env: Inventory(devices=(), problems=())\n"
        "probing = isolated.ForkedProbe({})\n"
        "child = probing._pid\n"
        "inv = probing.result()\n"
        "deadline = time.monotonic() + 20\n"
        "def state():\n"
        "    try:\n"
        "        return open(f'/proc/{child}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "    except OSError:\n"
        "        return 'gone'\n"
        "while state() != 'gone' and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(json.dumps({'devices': len(inv.devices), 'state': state()}))\n"
    )
    result = run_isolated(code, {})
    assert result == {"devices": 0, "state": "gone"}  # reaped: not even a zombie is left


def test_part_of_a_document_counts_as_a_failed_child() -> None:
    code = (
        "import json, os\n"
        "from xpulaunch.probing import isolated\n"
        "from xpulaunch.core import inventory as document\n"
        "from xpulaunch.model import Inventory\n"
        "parent = os.getpid()\n"
        "real_dumps = document.dumps\n"
        "def torn(inventory):  # the child died while writing\n"
        "    return real_dumps(inventory)[:20]\n"
        "document.dumps = torn\n"
        "isolated._probe = lambda env: Inventory(devices=(), problems=())\n"
        "inv = isolated.probe_isolated({})\n"
        "print(json.dumps({'problems': [str(p) for p in inv.problems]}))\n"
    )
    result = run_isolated(code, {})
    assert result["problems"] == ["probe: the forked probe failed (exit status 0); probed here"]
