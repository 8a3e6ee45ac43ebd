"""The model router places models on GPUs with leases: it evicts its least recently used
idle model when a new one has no room, never takes a training job's lease, and answers 503
with the reason when nothing may be evicted. No GPU can exist here, so the binary is a CUDA
build's stand-in (``router_kit.cuda_shim``): it lists the GPUs of a fixture inventory, and
serves with the real CPU llama-server, so every model placed on a "GPU" really answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from router_kit import call, chat, cuda_shim, models_in, router, shim_records

from helpers import (
    inventory_path,
    load_inventory,
    process_gone,
    processes_marked,
    wait_for,
    write_inventory,
)
from xpulaunch.api import load_inventory as load_inventory_file
from xpulaunch.leases import LeaseManager
from xpulaunch.llamacpp.router.events import ModelLoading, ModelUnloaded

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(120)]

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
TWO = inventory_path("2x-h200.json")
GPU = {d["index"]: d for d in json.loads(TWO.read_text())["devices"]}


@pytest.fixture
def shim(tmp_path: Path, llama_server: str) -> tuple[str, dict[str, str]]:
    """The stand-in binary and the environment it needs (its GPUs, where it records)."""
    (tmp_path / "records").mkdir()
    env = {"FAKE_LLAMA_INVENTORY": str(TWO), "SHIM_RECORD_DIR": str(tmp_path / "records")}
    return cuda_shim(tmp_path / "bin", llama_server), env


def one_gpu(tmp_path: Path) -> Path:
    return write_inventory(tmp_path / "one-gpu.json", [GPU[0]])


def leased(tmp_path: Path) -> dict[str, str]:
    """Device -> the holder's command (the commands of the models sharing it, by slot), from
    ``xpulaunch status``'s own source."""
    report = LeaseManager(tmp_path / "locks").status()
    found = {r.key: " ".join(r.holder.argv) if r.holder else "?" for r in report.leases}
    for record in report.slots:
        who = " ".join(record.holder.argv) if record.holder else "?"
        found[record.key] = f"{found[record.key]}; {who}" if record.key in found else who
    return found


def shared_by(tmp_path: Path) -> dict[str, list[str]]:
    """Device -> the commands of the jobs holding a slot of it, by slot."""
    report = LeaseManager(tmp_path / "locks").status()
    found: dict[str, list[str]] = {}
    for record in report.slots:
        found.setdefault(record.key, []).append(
            " ".join(record.holder.argv) if record.holder else "?"
        )
    return found


def test_the_least_recently_used_model_makes_room(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    binary, env = shim
    # Each model's share is most of a GPU: two never fit on one, as with whole GPUs.
    big = {"memory": "100GiB"}
    config = models_in(tmp_path, tiny_model, a=big, b=big, c=big)
    two = load_inventory("2x-h200.json")
    with router(config, binary, tmp_path, inventory=two, env=env) as (served, seen):
        for model in ("a", "b", "a"):  # a and b on one GPU each; a used last
            assert call(served.url, "/v1/chat/completions", chat(model))[0] == 200
        assert sorted(leased(tmp_path).values()) == [
            "xpulaunch llama serve a", "xpulaunch llama serve b"]  # fmt: skip
        b_gpu = next(key for key, who in leased(tmp_path).items() if who.endswith(" b"))
        assert call(served.url, "/v1/chat/completions", chat("c"))[0] == 200
        [unloaded] = seen.of(ModelUnloaded)
        assert (unloaded.model, unloaded.reason, unloaded.by) == ("b", "evicted", "c")
        assert seen.of(ModelLoading)[-1].evicted == ("b",)
        assert leased(tmp_path)[b_gpu] == "xpulaunch llama serve c"  # c took b's GPU
        masks = [mask for mask, _ in shim_records(tmp_path / "records")]
        uuid = {d.pci_bus_id: d.uuid for d in two.devices}
        assert masks[-1] == uuid[b_gpu]  # and its server saw exactly that GPU
        for _, args in shim_records(tmp_path / "records"):  # pinned, sized by llama.cpp's fit
            assert "--device CUDA0 -sm none --fit-target 1024" in args and "-ngl" not in args
        # b comes back when asked, evicting a (now the least recently used).
        assert call(served.url, "/v1/chat/completions", chat("b"))[0] == 200
        assert [(e.model, e.by) for e in seen.of(ModelUnloaded)] == [("b", "c"), ("a", "b")]
    assert leased(tmp_path) == {}


def test_a_training_jobs_lease_is_never_taken(
    shim: tuple[str, dict[str, str]], long_model: Path, tmp_path: Path
) -> None:
    """GPU 1 is held by another job: the two models take turns on GPU 0; while one answers
    a request, the other gets 503 naming the training job and the busy model."""
    binary, env = shim
    training = subprocess.Popen(
        [XPULAUNCH, "run", "--inventory", str(TWO), "--gpus", f"device={GPU[1]['pci_bus_id']}",
         "--lock-dir", str(tmp_path / "locks"), "--", "sleep", "600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(lambda: GPU[1]["pci_bus_id"] in leased(tmp_path), "the training job's lease")
        # Most of a GPU each: the two never fit on one (small models would be packed).
        args = {"args": ["-c", "65536", "-t", "1"], "memory": "100GiB"}
        config = models_in(tmp_path, long_model, a=args, b=args)
        two = load_inventory("2x-h200.json")
        # room_wait_s: b waits that long for a to go idle, then gets its 503.
        with router(config, binary, tmp_path, inventory=two, env=env, room_wait_s=0.5) as (
            served,
            seen,
        ):
            for model in ("a", "b", "a"):
                assert call(served.url, "/v1/chat/completions", chat(model))[0] == 200
                assert leased(tmp_path)[GPU[0]["pci_bus_id"]] == f"xpulaunch llama serve {model}"
                assert leased(tmp_path)[GPU[1]["pci_bus_id"]].endswith("sleep 600")
            with long_stream_of(served.url, "a"):
                status, body, _ = call(served.url, "/v1/chat/completions", chat("b"))
                assert status == 503, body
                message = body["error"]["message"]
                assert message.startswith("model b cannot be placed: gpus='auto': ")
                assert f"leased by pid {training.pid}" in message
                assert message.endswith("(busy: a (1 request(s) in flight))")
            assert [e.model for e in seen.of(ModelUnloaded)] == ["a", "b"]
        assert training.poll() is None  # the training job ran on, undisturbed
    finally:
        training.send_signal(signal.SIGINT)
        training.wait(timeout=30)


def long_stream_of(url: str, model: str) -> Any:
    from test_router import long_stream

    return long_stream(url, model)


def test_a_model_waits_for_a_busy_model_to_make_room(
    shim: tuple[str, dict[str, str]], long_model: Path, tmp_path: Path
) -> None:
    """One GPU, which a holds while it streams: b's request waits for room instead of a 503
    at once, and when a's request ends, a is evicted and b answers."""
    binary, env = shim
    # Most of a GPU each: the two never fit on one (small models would be packed).
    args = {"args": ["-c", "65536", "-t", "1"], "memory": "100GiB"}
    config = models_in(tmp_path, long_model, a=args, b=args)
    inventory = load_inventory_file(one_gpu(tmp_path))
    with router(config, binary, tmp_path, inventory=inventory, env=env, room_wait_s=60) as (
        served,
        seen,
    ):
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        answers: list[tuple[int, Any, dict[str, str]]] = []

        def ask() -> None:
            answers.append(call(served.url, "/v1/chat/completions", chat("b")))

        def model(name: str) -> dict[str, Any]:
            models = call(served.url, "/models/status")[1]["models"]
            return next(m for m in models if m["id"] == name)  # type: ignore[no-any-return]

        asking = threading.Thread(target=ask)
        with long_stream_of(served.url, "a"):
            asking.start()
            wait_for(lambda: model("b")["in_flight"] == 1, "b's request to come")
            assert model("b")["state"] == "loading" and answers == []  # waiting, not refused
        asking.join(timeout=60)  # a's client has left: a is idle and makes room
        [(status, body, _)] = answers
        assert status == 200, body
        assert [(e.model, e.reason, e.by) for e in seen.of(ModelUnloaded)] == [
            ("a", "evicted", "b")
        ]


def test_a_pinned_model_is_never_evicted(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    binary, env = shim
    big = {"memory": "100GiB"}  # two do not fit on one GPU
    config = models_in(tmp_path, tiny_model, keep={"pinned": True, **big}, other=big)
    inventory = load_inventory_file(one_gpu(tmp_path))
    with router(config, binary, tmp_path, inventory=inventory, env=env) as (served, seen):
        assert call(served.url, "/v1/chat/completions", chat("keep"))[0] == 200
        status, body, _ = call(served.url, "/v1/chat/completions", chat("other"))
        assert status == 503 and body["error"]["message"].endswith("(pinned: keep)"), body
        assert seen.of(ModelUnloaded) == []
        status, body, _ = call(served.url, "/models/status")
        other = next(m for m in body["models"] if m["id"] == "other")
        assert other["state"] == "unloaded" and "cannot be placed" in other["last_error"]


def test_small_models_are_packed_on_one_gpu_and_alternate_without_a_swap(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    """Two small models with gpus auto on a one-GPU host are loaded at once, each with the
    GPU's mask and a slot of it sized by its estimate; alternating requests evict nothing."""
    binary, env = shim
    gpu = GPU[0]["pci_bus_id"]
    config = models_in(tmp_path, tiny_model, a={}, b={})
    inventory = load_inventory_file(one_gpu(tmp_path))
    with router(config, binary, tmp_path, inventory=inventory, env=env) as (served, seen):
        for model in ("a", "b", "a", "b", "a"):
            assert call(served.url, "/v1/chat/completions", chat(model))[0] == 200
        assert seen.of(ModelUnloaded) == []
        assert sorted(shared_by(tmp_path)[gpu]) == [
            "xpulaunch llama serve a",
            "xpulaunch llama serve b",
        ]
        masks = [mask for mask, _ in shim_records(tmp_path / "records")]
        assert masks == [GPU[0]["uuid"]] * 2  # two servers started, both on the GPU
        status = call(served.url, "/models/status")[1]["models"]
        assert {m["id"]: m["state"] for m in status} == {"a": "ready", "b": "ready"}
    assert leased(tmp_path) == {}


def test_a_model_that_does_not_fit_beside_the_others_evicts_only_what_it_must(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    """Shares of 20 + 20 GiB on a 140 GiB GPU leave no room for 110 GiB more: the least
    recently used model goes, and only it (the other's share fits beside the new one)."""
    binary, env = shim
    gpu = GPU[0]["pci_bus_id"]
    small, big = {"memory": "20GiB"}, {"memory": "110GiB"}
    config = models_in(tmp_path, tiny_model, a=small, b=small, big=big)
    inventory = load_inventory_file(one_gpu(tmp_path))
    with router(config, binary, tmp_path, inventory=inventory, env=env) as (served, seen):
        for model in ("b", "a", "big"):  # b is the least recently used when big comes
            assert call(served.url, "/v1/chat/completions", chat(model))[0] == 200
        assert [(e.model, e.reason, e.by) for e in seen.of(ModelUnloaded)] == [
            ("b", "evicted", "big")
        ]
        assert sorted(shared_by(tmp_path)[gpu]) == [
            "xpulaunch llama serve a",
            "xpulaunch llama serve big",
        ]
    assert leased(tmp_path) == {}


def test_a_model_never_joins_a_gpu_a_job_holds_whole_and_a_job_waits_for_a_shared_one(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    """A model's slot of a GPU keeps a job that wants the whole GPU out (it is refused, naming
    the model), and a GPU a job holds whole is no room for a model."""
    binary, env = shim
    gpu = GPU[0]["pci_bus_id"]
    config = models_in(tmp_path, tiny_model, a={})
    inventory = one_gpu(tmp_path)
    with router(config, binary, tmp_path, inventory=load_inventory_file(inventory), env=env) as (
        served,
        _,
    ):
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        job = subprocess.run(
            [XPULAUNCH, "run", "--inventory", str(inventory), "--gpus", "1",
             "--lock-dir", str(tmp_path / "locks"), "--", "true"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert job.returncode != 0 and "xpulaunch llama serve a" in job.stderr, job.stderr
    assert leased(tmp_path) == {}
    training = subprocess.Popen(
        [XPULAUNCH, "run", "--inventory", str(inventory), "--gpus", "1",
         "--lock-dir", str(tmp_path / "locks"), "--", "sleep", "600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(lambda: gpu in leased(tmp_path), "the training job's lease")
        with router(config, binary, tmp_path, inventory=load_inventory_file(inventory), env=env,
                    room_wait_s=0.2) as (served, _):  # fmt: skip
            status, body, _ = call(served.url, "/v1/chat/completions", chat("a"))
            assert status == 503 and f"leased by pid {training.pid}" in str(body), body
    finally:
        training.send_signal(signal.SIGINT)
        training.wait(timeout=30)


def job_waiting_for_the_gpu(inventory: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    """``xpulaunch run --gpus 1 --wait`` of a job that says it ran (a training job in line)."""
    return subprocess.Popen(
        [XPULAUNCH, "run", "--inventory", str(inventory), "--gpus", "1", "--wait", *extra,
         "--lock-dir", str(tmp_path / "locks"), "--", sys.executable, "-c", "print('trained')"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_serving_yields_the_gpu_to_a_job_waiting_in_line(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    """An idle model on the only GPU is unloaded for a job that waits for the whole GPU; the
    job runs; the model's next request loads it again."""
    binary, env = shim
    config = models_in(tmp_path, tiny_model, a={})
    inventory = one_gpu(tmp_path)
    with router(config, binary, tmp_path, inventory=load_inventory_file(inventory), env=env) as (
        served,
        seen,
    ):
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        job = job_waiting_for_the_gpu(inventory, tmp_path)
        out, err = job.communicate(timeout=60)
        assert job.returncode == 0 and "trained" in out, err
        [unloaded] = seen.of(ModelUnloaded)
        assert (unloaded.model, unloaded.reason) == ("a", "yielded")
        assert f"pid {job.pid}" in (unloaded.by or "")
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200  # loaded again
        assert len(seen.of(ModelLoading)) == 2
    assert leased(tmp_path) == {}


def test_a_busy_model_or_yield_off_keeps_the_gpu(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path
) -> None:
    """With yield_to_jobs off, the waiting job gives up at its --wait-timeout while the model
    stays loaded."""
    binary, env = shim
    config = models_in(tmp_path, tiny_model, a={})
    inventory = one_gpu(tmp_path)
    with router(config, binary, tmp_path, inventory=load_inventory_file(inventory), env=env,
                yield_to_jobs=False) as (served, seen):  # fmt: skip
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        job = job_waiting_for_the_gpu(inventory, tmp_path, "--wait-timeout", "3")
        out, err = job.communicate(timeout=60)
        assert job.returncode != 0 and "gave up after waiting" in err and "trained" not in out
        assert seen.of(ModelUnloaded) == []
    assert leased(tmp_path) == {}


# -- the command -----------------------------------------------------------------------------
def test_kill_9_of_the_router_leaves_no_server_and_no_lease(
    shim: tuple[str, dict[str, str]], tiny_model: Path, tmp_path: Path,
    started: list[subprocess.Popen[str]],
) -> None:  # fmt: skip
    binary, env = shim
    config = tmp_path / "models.toml"
    models = models_in(tmp_path, tiny_model, a={}, b={})["models"]
    config.write_text("".join(
        f'[models.{name}]\nmodel = "{table["model"]}"\nargs = {json.dumps(table["args"])}\n'
        for name, table in models.items()
    ))  # fmt: skip
    router_proc = subprocess.Popen(
        [XPULAUNCH, "llama", "serve", "--config", str(config), "--port", "0", "--binary", binary,
         "--inventory", str(TWO), "--lock-dir", str(tmp_path / "locks"),
         "--events", str(tmp_path / "events.jsonl")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    started.append(router_proc)
    assert router_proc.stdout is not None
    line = router_proc.stdout.readline()
    assert line.startswith("xpulaunch: serving a, b at http://127.0.0.1:"), line
    url = line.split(" at ")[1].split("/v1")[0]
    for model in ("a", "b"):
        assert call(url, "/v1/chat/completions", chat(model))[0] == 200
    assert sorted(who for models in shared_by(tmp_path).values() for who in models) == [
        "xpulaunch llama serve a",
        "xpulaunch llama serve b",
    ]  # packed on one GPU, a slot each
    servers = [p for p in processes_marked((f"{tmp_path}/",)) if "llama-server" in p.name()]
    assert len(servers) == 2
    port = url.rsplit(":")[-1]
    status = subprocess.run([XPULAUNCH, "llama", "serve", "--status", "--port", port],
                            capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    rows = status.stdout.splitlines()
    assert rows[0].split()[:3] == ["MODEL", "STATE", "IN"] and len(rows) == 3, status.stdout
    assert all(" ready " in row and "nvidia" in row for row in rows[1:]), status.stdout

    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    loaded = [e for e in events if e["event"] == "model_loaded"]
    assert sorted(e["model"] for e in loaded) == ["a", "b"], events
    ready = [e for e in events if e["event"] == "ready"]  # each replica's, with its model
    assert sorted((e["model"], e["name"]) for e in ready) == [("a", "0"), ("b", "0")]

    router_proc.kill()
    router_proc.wait(timeout=10)
    wait_for(lambda: all(process_gone(p) for p in servers), "the guardians to kill the servers",
             timeout_s=20)  # fmt: skip
    wait_for(lambda: leased(tmp_path) == {}, "the leases to end", timeout_s=20)


def test_serve_yield_to_jobs_false_in_the_config_turns_it_off(tiny_model: Path) -> None:
    from xpulaunch.errors import UsageError
    from xpulaunch.llamacpp.router.serve import make_router

    def setup_of(serve: dict[str, Any]) -> Any:
        document = {"serve": serve, "models": {"a": {"model": str(tiny_model)}}}
        return make_router(document, inventory=load_inventory("cpu-only.json")).setup

    assert setup_of({}).yield_to_jobs is True
    assert setup_of({"yield_to_jobs": False}).yield_to_jobs is False
    with pytest.raises(UsageError, match=r"\[serve\] yield_to_jobs: expected true or false"):
        setup_of({"yield_to_jobs": "no"})
