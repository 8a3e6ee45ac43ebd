"""Stands in for torch's agent module in tests/proc/test_prestart.py: reports what it was
started with as one JSON line on stdout, a line on stderr, and exits 3."""

import ctypes
import json
import os
import sys

PR_GET_PDEATHSIG = 2
death_signal = ctypes.c_int()
ctypes.CDLL(None).prctl(PR_GET_PDEATHSIG, ctypes.byref(death_signal), 0, 0, 0)
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
report = {
    "name": __name__,
    "args": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": {k: os.environ.get(k) for k in ("XPULAUNCH_JOB_ID", "CUDA_VISIBLE_DEVICES", "KEPT")},
    "big": len(os.environ.get("XPULAUNCH_BIG", "")),
    "session_leader": os.getsid(0) == os.getpid(),
    "pdeathsig": death_signal.value,
    "stdin": fds.get("0"),
    "open": sorted(fds.values()),
}
print(json.dumps(report))
print("a line on stderr", file=sys.stderr)
sys.exit(3)
