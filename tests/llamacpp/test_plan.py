"""The llama plan against hand-written inventories: disjoint devices, distinct ports and the
right visibility per build (pure; no binary is run)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llama_fakes import LISTINGS

from helpers import load_inventory
from xpulaunch.core import plan as plan_doc
from xpulaunch.errors import SelectionError, UsageError
from xpulaunch.llamacpp.devices import LlamaBackend, parse_list_devices
from xpulaunch.llamacpp.plan import LlamaPlan, LlamaRequest, make_llama_plan, url_host
from xpulaunch.model import Inventory

RANK_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
BASE = LlamaRequest(model="m.gguf", binary="/opt/llama-server")


def make(
    request: LlamaRequest,
    inventory: Inventory,
    build: LlamaBackend,
    env: dict[str, str] | None = None,
    listing: str | None = None,
) -> LlamaPlan:
    ports = [8000 + i for i in range(request.replicas)]
    parsed = parse_list_devices(listing) if listing else None
    return make_llama_plan(request, inventory, env or {}, build=build, listing=parsed, ports=ports)


def arg(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def two_replicas(inventory: str, build: LlamaBackend, listing: str | None = None) -> LlamaPlan:
    request = replace(BASE, replicas=2, gpus="2")
    result = make(request, load_inventory(inventory), build, listing=listing)
    workers = result.plan.workers
    assert len(workers) == 2
    assert set(workers[0].units).isdisjoint(workers[1].units)  # disjoint units
    assert len(result.plan.devices) == 2
    assert [r.port for r in result.replicas] == [8000, 8001]  # distinct ports
    assert [arg(w.argv, "--port") for w in workers] == ["8000", "8001"]
    for worker in workers:
        assert worker.argv[0] == "/opt/llama-server" and arg(worker.argv, "-m") == "m.gguf"
        assert arg(worker.argv, "--host") == "127.0.0.1"
        assert arg(worker.argv, "-ngl") == "999" and arg(worker.argv, "-sm") == "none"
        assert not RANK_VARS & set(worker.env)  # a replica is not a torchrun rank
    return result


def test_cuda_replicas_get_one_gpu_each_by_uuid() -> None:
    result = two_replicas("2x-h200.json", LlamaBackend.CUDA)
    envs = [w.env for w in result.plan.workers]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [
        "GPU-a6026e70-2f8a-387f-486f-d49cebe1fb04",
        "GPU-e436550d-4102-c58c-de2e-988dc6aaa541",
    ]
    assert all(e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for e in envs)
    assert [arg(w.argv, "--device") for w in result.plan.workers] == ["CUDA0", "CUDA0"]
    assert [r.url for r in result.replicas] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]


def test_sycl_replicas_get_a_level_zero_selector_and_an_explicit_hierarchy() -> None:
    result = two_replicas("2x-max1550.json", LlamaBackend.SYCL)
    envs = [w.env for w in result.plan.workers]
    assert all(e["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT" for e in envs)
    # llama.cpp's SYCL backend aborts on a selector without the "level_zero" substring.
    assert all(str(e["ONEAPI_DEVICE_SELECTOR"]).startswith("level_zero:") for e in envs)
    masks = [e["ZE_AFFINITY_MASK"] for e in envs]
    assert len(set(masks)) == 2 and all(m is not None and m.isdigit() for m in masks)
    assert [arg(w.argv, "--device") for w in result.plan.workers] == ["SYCL0", "SYCL0"]


def test_rocm_replicas_get_rocr_visible_devices() -> None:
    result = two_replicas("4x-mi300x.json", LlamaBackend.ROCM)
    masks = [w.env["ROCR_VISIBLE_DEVICES"] for w in result.plan.workers]
    assert len(set(masks)) == 2 and all(masks)
    assert [arg(w.argv, "--device") for w in result.plan.workers] == ["ROCm0", "ROCm0"]


def test_vulkan_replicas_are_pinned_by_device_name() -> None:
    result = two_replicas("2x-h200.json", LlamaBackend.VULKAN, LISTINGS["vulkan"])
    assert [arg(w.argv, "--device") for w in result.plan.workers] == ["Vulkan0", "Vulkan1"]
    assert [r.devices for r in result.replicas] == [("Vulkan0",), ("Vulkan1",)]
    assert any("look alike" in n for n in result.plan.notes)


def test_vulkan_without_a_listing_cannot_be_pinned() -> None:
    request = replace(BASE, gpus="1")
    with pytest.raises(UsageError, match="--list-devices"):
        make(request, load_inventory("2x-h200.json"), LlamaBackend.VULKAN)


def test_one_replica_on_two_gpus_splits_layers() -> None:
    result = make(replace(BASE, gpus="2"), load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    (worker,) = result.plan.workers
    assert arg(worker.argv, "--device") == "CUDA0,CUDA1"
    assert arg(worker.argv, "-sm") == "layer" and arg(worker.argv, "-ts") == "1,1"
    assert "," in str(worker.env["CUDA_VISIBLE_DEVICES"])


def test_sycl_over_two_tiles_enables_sysman_for_free_memory() -> None:
    result = make(replace(BASE, gpus="2"), load_inventory("2x-max1550.json"), LlamaBackend.SYCL)
    (worker,) = result.plan.workers
    assert worker.env["ZES_ENABLE_SYSMAN"] == "1"
    assert arg(worker.argv, "-ts") == "1,1"  # Intel free memory is unknown: equal split
    assert any("equal split" in n for n in result.plan.notes)


def test_a_sycl_child_never_keeps_a_selector_without_level_zero() -> None:
    env = {"ONEAPI_DEVICE_SELECTOR": "opencl:*"}
    request = replace(BASE, gpus="none")
    result = make(request, load_inventory("2x-max1550.json"), LlamaBackend.SYCL, env)
    (worker,) = result.plan.workers
    assert worker.child_env(env)["ONEAPI_DEVICE_SELECTOR"] == "level_zero:gpu"
    assert arg(worker.argv, "--device") == "none"


def test_more_replicas_than_devices_is_a_clear_error() -> None:
    request = replace(BASE, replicas=3, gpus="2")
    with pytest.raises(SelectionError) as raised:
        make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    assert raised.value.message.startswith("replicas=3: each replica needs its own device")
    assert raised.value.cli_message().startswith("--replicas 3: each replica needs its own device")


def test_a_cpu_build_runs_every_replica_on_the_cpu() -> None:
    request = replace(BASE, replicas=2)
    result = make(request, load_inventory("2x-h200.json"), LlamaBackend.CPU)
    assert result.plan.backend.value == "cpu" and result.plan.devices == ()
    assert [arg(w.argv, "--device") for w in result.plan.workers] == ["none", "none"]
    assert all(w.env["CUDA_VISIBLE_DEVICES"] == "" for w in result.plan.workers)
    # gpus auto (the default; a models.toml's gpus = "auto"): it said "--gpus none"
    assert "backend cpu: this llama-server is a CPU build (gpus: auto)" in result.plan.notes
    assert not any("--gpus none" in n for n in result.plan.notes)
    chosen = make(replace(BASE, gpus="none"), load_inventory("2x-h200.json"), LlamaBackend.CPU)
    assert "backend cpu: --gpus none" in chosen.plan.notes


def test_a_cpu_build_refuses_gpus() -> None:
    with pytest.raises(UsageError) as raised:
        make(replace(BASE, gpus="2"), load_inventory("2x-h200.json"), LlamaBackend.CPU)
    assert raised.value.message.startswith("gpus='2': this llama-server is a CPU build")
    assert raised.value.cli_message().startswith("--gpus 2: this llama-server is a CPU build")
    # and how to preview this host's GPU plan with it: the build that runs on its GPUs
    previews = {
        "2x-h200.json": "cuda",
        "2x-max1550.json": "sycl",
        "4x-mi300x.json": "rocm",
        "hybrid-4090-arc.json": "cuda, sycl, rocm or vulkan",
    }
    for fixture, build in previews.items():
        with pytest.raises(UsageError) as raised:
            make(replace(BASE, gpus="2"), load_inventory(fixture), LlamaBackend.CPU)
        assert raised.value.message.endswith(f"--dry-run --llama-backend {build})"), fixture


def test_a_build_refuses_another_vendors_backend() -> None:
    with pytest.raises(UsageError) as raised:
        make(replace(BASE, backend="xpu"), load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    assert raised.value.message.startswith("backend='xpu': this llama-server is a CUDA build")
    assert raised.value.cli_message().startswith("--backend xpu: this llama-server is a CUDA")


def test_a_gpu_build_may_still_run_on_the_cpu() -> None:
    request = replace(BASE, gpus="none")
    result = make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    (worker,) = result.plan.workers
    assert arg(worker.argv, "--device") == "none" and worker.env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(("inventory", "build"), [
    ("2x-h200.json", LlamaBackend.CUDA),
    ("2x-max1550.json", LlamaBackend.SYCL),
    ("2x-h200.json", LlamaBackend.CPU),
])  # fmt: skip
def test_replicas_do_not_get_torchruns_omp_num_threads(inventory: str, build: LlamaBackend) -> None:
    request = replace(BASE, replicas=2, gpus="none" if build is LlamaBackend.CPU else "2")
    result = make(request, load_inventory(inventory), build)
    assert len(result.plan.workers) == 2  # several workers: the planner would set it to 1
    for worker in result.plan.workers:
        assert "OMP_NUM_THREADS" not in worker.env
        assert "OMP_NUM_THREADS" not in worker.child_env({"PATH": "/usr/bin"})
    assert not any("OMP_NUM_THREADS" in n for n in result.plan.notes)


def test_a_parents_omp_num_threads_reaches_every_replica_unchanged() -> None:
    env = {"OMP_NUM_THREADS": "6"}
    request = replace(BASE, replicas=2, gpus="2")
    result = make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA, env)
    for worker in result.plan.workers:
        assert "OMP_NUM_THREADS" not in worker.env  # the diff: not changed, not removed
        assert worker.child_env(env)["OMP_NUM_THREADS"] == "6"


def test_first_port_counts_up_and_is_fixed() -> None:
    request = replace(BASE, replicas=2, gpus="2", port=8000)
    result = make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    assert [(r.port, r.port_fixed) for r in result.replicas] == [(8000, True), (8001, True)]
    free = make(replace(request, port=None), load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    assert not any(r.port_fixed for r in free.replicas)


def test_a_port_after_dashdash_is_the_replicas_fixed_port() -> None:
    request = replace(BASE, passthrough=("--port", "9123", "--host", "0.0.0.0"))
    result = make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    (replica,) = result.replicas
    assert (replica.port, replica.port_fixed, replica.host) == (9123, True, "0.0.0.0")
    assert replica.url == "http://127.0.0.1:9123"
    assert result.plan.workers[0].argv.count("--port") == 1


def test_a_port_after_dashdash_cannot_serve_several_replicas() -> None:
    request = replace(BASE, replicas=2, gpus="2", passthrough=("--port", "9123"))
    with pytest.raises(UsageError, match="xpulaunch's port"):
        make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA)


@pytest.mark.parametrize(
    ("model", "passthrough", "env", "message"),
    [
        (None, (), {}, r"model=None: no model given; expected the path of a \.gguf file"),
        ("a.gguf", ("-m", "b.gguf"), {}, "-m given twice"),
    ],
)
def test_model_errors(
    model: str | None, passthrough: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    request = replace(BASE, model=model, passthrough=passthrough)
    with pytest.raises(UsageError, match=message):
        make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA, env)


def test_a_remote_model_needs_no_path() -> None:
    request = replace(BASE, model=None, passthrough=("-hf", "ggml-org/gemma-3-1b-it-GGUF"))
    result = make(request, load_inventory("2x-h200.json"), LlamaBackend.CUDA)
    assert "-m" not in result.plan.workers[0].argv


def test_hosts() -> None:
    assert url_host("0.0.0.0") == "127.0.0.1" and url_host("::") == "[::1]"
    assert url_host("10.0.0.5,127.0.0.1") == "10.0.0.5"
    with pytest.raises(UsageError, match="UNIX socket"):
        url_host("/tmp/llama.sock")


def test_plan_document_has_the_full_command_line_per_replica() -> None:
    result = two_replicas("2x-h200.json", LlamaBackend.CUDA)
    doc = plan_doc.to_dict(result.plan)
    assert doc["schema"] == "xpulaunch.plan/1" and doc["backend"] == "cuda"
    assert [w["argv"] for w in doc["workers"]] == [list(w.argv) for w in result.plan.workers]
    assert any("replica 1: http://127.0.0.1:8001" in n for n in doc["notes"])


MAX_VULKAN = (
    "Available devices:\n"
    "  Vulkan0: Intel(R) Data Center GPU Max 1550 (131072 MiB, 130000 MiB free)\n"
    "  Vulkan1: Intel(R) Data Center GPU Max 1550 (131072 MiB, 130000 MiB free)\n"
)


def test_vulkan_over_tiles_offloads_to_whole_cards() -> None:
    request = replace(BASE, gpus="all", backend="xpu")
    result = make(request, load_inventory("2x-max1550.json"), LlamaBackend.VULKAN, None, MAX_VULKAN)
    (worker,) = result.plan.workers
    assert len(worker.units) == 4  # four tiles under FLAT ...
    assert arg(worker.argv, "--device") == "Vulkan0,Vulkan1"  # ... are two Vulkan devices
    assert arg(worker.argv, "-ts") == "1,1"


def test_vulkan_replicas_cannot_share_a_card_through_its_tiles() -> None:
    request = replace(BASE, gpus="0.0,0.1", backend="xpu", replicas=2)
    with pytest.raises(SelectionError, match="would share Vulkan0"):
        make(request, load_inventory("2x-max1550.json"), LlamaBackend.VULKAN, None, MAX_VULKAN)


def test_a_llama_plan_speaks_of_replicas_not_ranks_isolation_or_device_maps() -> None:
    result = two_replicas("2x-h200.json", LlamaBackend.CUDA)
    notes = " ".join(result.plan.notes)
    assert "each replica sees only its own devices" in notes
    for word in ("--isolate", "worker", "rank", "device map"):
        assert word not in notes, word
    assert result.plan.device_map is None
    for worker in result.plan.workers:
        assert "XPULAUNCH_DEVICE_MAP" not in worker.env
        assert "XPULAUNCH_MAX_MEMORY" not in worker.env
