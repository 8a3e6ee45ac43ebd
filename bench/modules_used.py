"""Which of our modules a plain run loads, and which of them run any code of their own.

    .venv/bin/python bench/modules_used.py [--inventory tests/fixtures/inventories/8x-h100.json]

Runs ``xpulaunch --gpus auto [ARGS] -- python -c pass`` in this process with a profile hook
that notes every function of ours that is called (module bodies aside), then lists the modules
of ours loaded by the end and those none of whose functions ran: a module loaded but never
used is one to import where its mode begins. Package ``__init__`` files show there too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from types import FrameType
from typing import Any

CALLED: set[str] = set()


def _note(frame: FrameType, event: str, arg: Any) -> None:
    if event == "call" and frame.f_code.co_name != "<module>":
        name = frame.f_globals.get("__name__", "")
        if name.startswith("xpulaunch"):
            CALLED.add(name)


def main() -> None:
    import threading

    root = tempfile.mkdtemp(prefix="modules-used-")
    os.environ["XDG_RUNTIME_DIR"] = root
    os.environ["XPULAUNCH_LOCK_DIR"] = os.path.join(root, "locks")
    sys.setprofile(_note)
    threading.setprofile(_note)
    from xpulaunch.cli.main import main as xpulaunch

    with contextlib.suppress(SystemExit):
        xpulaunch(["--gpus", "auto", *sys.argv[1:], "--", sys.executable, "-c", "pass"])
    sys.setprofile(None)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "xpulaunch")
    print(f"{len(loaded)} modules of ours loaded")
    print("none of their functions ran:", ", ".join(m for m in loaded if m not in CALLED))


if __name__ == "__main__":
    main()
