"""``python driver.py MODE DIR``: forks xpulaunch.proc.prestart's child with fake_agent.py in
place of torch's agent, then does MODE and prints one JSON line (see test_prestart.py)."""

import json
import os
import sys
import time

from xpulaunch.proc import prestart

prestart.AGENT_MODULE = "fake_agent"  # this directory is sys.path[0]
prestart.AGENT_IMPORTS = ("json", "no_such_module_anywhere", "never_reached")
mode, folder = sys.argv[1], sys.argv[2]
prestart.start()
pid = prestart._pending[0].pid
argv = [sys.executable, "-m", "fake_agent", "--nnodes", "2"]
env = {**os.environ, "XPULAUNCH_JOB_ID": "job-1", "CUDA_VISIBLE_DEVICES": ""}
if mode == "adopt":  # an order larger than one send and one socket buffer
    env["XPULAUNCH_BIG"] = "x" * 300_000


def gone() -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


if mode == "adopt":
    lease = open(os.path.join(folder, "lease"), "w")  # noqa: SIM115
    child = prestart.adopt(argv, env, cwd=folder, pass_fds=[lease.fileno()])
    assert child is not None and child.pid == pid
    outputs = []
    for stream in (child.stdout, child.stderr):
        os.set_blocking(stream.fileno(), True)
        outputs.append(stream.read().decode())
    print(json.dumps({"status": child.wait(), "out": outputs[0], "err": outputs[1]}))
elif mode in ("changed", "other_module"):
    if mode == "changed":
        env["LOGLEVEL"] = "INFO"  # read by torch at import: the child imported without it
    else:
        argv[2] = "some.other.module"
    print(json.dumps({"adopted": prestart.adopt(argv, env) is not None, "gone": gone()}))
elif mode == "discard":
    prestart.discard()
    print(json.dumps({"gone": gone(), "adopt_after": prestart.adopt(argv, env) is not None}))
elif mode == "orphan":
    print(json.dumps({"pid": pid}), flush=True)
    time.sleep(120)  # the test SIGKILLs this process
