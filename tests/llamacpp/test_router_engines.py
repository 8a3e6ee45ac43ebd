"""The router's ``cmd`` engines (any OpenAI-compatible server behind the same port), with a
stand-in engine (``fake_engine.py``) and the official ``openai`` client: placed, pinned and
leased like llama-server, supervised and restarted, with the model's ``env``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from router_kit import FAST, Seen, call, chat

import xpulaunch
from helpers import inventory_path, load_inventory, processes_marked, write_inventory
from xpulaunch.api import load_inventory as load_inventory_file
from xpulaunch.errors import UsageError
from xpulaunch.leases import LeaseManager
from xpulaunch.llamacpp.router.events import ModelLoaded, ModelUnloaded

pytestmark = [pytest.mark.timeout(120)]

ENGINE = str(Path(__file__).with_name("fake_engine.py"))
TWO = inventory_path("2x-h200.json")
GPU_UUIDS = [d["uuid"] for d in json.loads(TWO.read_text())["devices"]]


def engine(*extra: str, **table: Any) -> dict[str, Any]:
    cmd = [sys.executable, ENGINE, "--port", "${PORT}", "--name", "${MODEL}", *extra]
    return {"cmd": cmd, **table}


def serve(config: dict[str, Any], tmp_path: Path, **options: Any) -> tuple[Any, Seen]:
    seen = Seen()
    router = xpulaunch.serve_models(
        config,
        inventory=options.pop("inventory", load_inventory("cpu-only.json")),
        lock_dir=tmp_path / "locks",
        health=FAST,
        grace_s=5.0,
        on_event=seen.on_event,
        on_message=seen.messages.append,
        **options,
    )
    return router, seen


def records(folder: Path) -> list[dict[str, str]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def leases_of(tmp_path: Path) -> list[Any]:
    """Every lease of the test's lock directory: whole GPUs, and slots of shared ones (an
    engine with a memory is packed: it holds a slot)."""
    report = LeaseManager(tmp_path / "locks").status()
    return [*report.leases, *report.slots]


def test_a_cmd_engine_with_env_and_memory_answers_streamed_and_not_on_its_gpu(
    tmp_path: Path,
) -> None:
    (tmp_path / "rec").mkdir()
    table = engine(
        "--record",
        str(tmp_path / "rec"),
        memory="6GiB",
        gpus="auto",
        env={"ENGINE_SETTING": "on", "CUDA_VISIBLE_DEVICES": "1"},  # pinned by hand
    )
    router, _ = serve(
        {"models": {"eng": table}}, tmp_path, inventory=load_inventory("2x-h200.json")
    )
    with router:
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model="eng", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "hello from the engine"
        assert answer.model == "eng"  # ${MODEL}: the model's id
        stream = client.chat.completions.create(
            model="eng", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        words = [c.choices[0].delta.content for c in stream if c.choices]
        assert "".join(w or "" for w in words) == "hello from the engine"
        status = {m["id"]: m for m in router.status()}["eng"]
        assert status["state"] == "ready" and status["estimate_bytes"] == 6 * 2**30
        held = leases_of(tmp_path)
        assert len(held) == 1  # a share of one GPU leased (its memory), as for a gguf model
    (env,) = records(tmp_path / "rec")
    assert env["ENGINE_SETTING"] == "on"
    # The mask its env pins keeps it on GPU 1, written (as every mask the router writes) by
    # the GPU's UUID: what CUDA numbers 1 depends on CUDA_DEVICE_ORDER.
    assert env["CUDA_VISIBLE_DEVICES"] == GPU_UUIDS[1]
    assert not leases_of(tmp_path)


def test_an_engine_without_health_is_ready_by_v1_models_and_restarted_when_killed(
    tmp_path: Path,
) -> None:
    config = {"models": {"eng": engine("--no-health", gpus="none")}}
    router, seen = serve(config, tmp_path)
    with router:
        status, body, _ = call(router.url, "/v1/chat/completions", chat("eng"))
        assert status == 200, body
        pid = next(e.pid for e, _ in seen.events if type(e).__name__ == "Started")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len([e for e, _ in seen.events if type(e).__name__ == "Ready"]) < 2:
            assert time.monotonic() < deadline, seen.messages
            time.sleep(0.05)
        status, body, _ = call(router.url, "/v1/chat/completions", chat("eng"))
        assert status == 200, body
    assert len(seen.of(ModelLoaded)) == 1  # restarted under its supervisor, not reloaded


def test_a_cmd_that_is_not_executable_is_one_line_at_start(tmp_path: Path) -> None:
    config = {"models": {"eng": {"cmd": "no-such-engine-xyz --port ${PORT}"}}}
    with pytest.raises(
        UsageError,
        match=r"\[models.eng\] cmd: 'no-such-engine-xyz' is not an "
        "executable program on PATH",
    ):
        xpulaunch.serve_models(
            config, inventory=load_inventory("cpu-only.json"), lock_dir=tmp_path / "locks"
        )
    text = tmp_path / "engine.txt"
    text.write_text("not a program")
    config = {"models": {"eng": {"cmd": [str(text), "--port", "${PORT}"]}}}
    with pytest.raises(UsageError, match="is not an executable program \\("):
        xpulaunch.serve_models(
            config, inventory=load_inventory("cpu-only.json"), lock_dir=tmp_path / "locks"
        )


def test_cmd_engines_that_do_not_fit_together_evict_each_other_like_gguf_models(
    tmp_path: Path,
) -> None:
    # 100 GiB each on a 141 GiB GPU: never both at once, however models are packed.
    one = write_inventory(tmp_path / "one.json", [json.loads(TWO.read_text())["devices"][0]])
    config = {"models": {n: engine(memory="100GiB") for n in ("a", "b")}}
    router, seen = serve(config, tmp_path, inventory=load_inventory_file(one))
    with router:
        for model in ("a", "b", "a"):
            status, body, _ = call(router.url, "/v1/chat/completions", chat(model))
            assert status == 200 and body["model"] == model, body
        unloads = [(e.model, e.reason, e.by) for e in seen.of(ModelUnloaded)]
        assert unloads == [("a", "evicted", "b"), ("b", "evicted", "a")]
        (lease,) = leases_of(tmp_path)
        assert lease.holder is not None
        assert "xpulaunch llama serve a" in " ".join(lease.holder.argv)


def test_cmd_engines_with_small_memories_share_one_gpu(tmp_path: Path) -> None:
    """6 GiB each on a 141 GiB GPU: both run at once, each with a slot of it, and taking
    turns evicts neither."""
    one = write_inventory(tmp_path / "one.json", [json.loads(TWO.read_text())["devices"][0]])
    config = {"models": {n: engine(memory="6GiB") for n in ("a", "b")}}
    router, seen = serve(config, tmp_path, inventory=load_inventory_file(one))
    with router:
        for model in ("a", "b", "a", "b"):
            status, body, _ = call(router.url, "/v1/chat/completions", chat(model))
            assert status == 200 and body["model"] == model, body
        assert seen.of(ModelUnloaded) == []
        held = LeaseManager(tmp_path / "locks").status().slots
        assert len(held) == 2 and len({s.key for s in held}) == 1


def test_an_engine_whose_port_is_taken_after_a_crash_moves_with_port_filled_in_again(
    tmp_path: Path,
) -> None:
    """kill -9 of an engine whose port another program takes at once: no request reaches the
    other program (the socket-owner check), and the restarted engine gets a new ${PORT}."""
    from router_kit import Impostor

    # ${PORT} inside a word: what llama-server's --port rewriting would not find.
    cmd = [sys.executable, ENGINE, "--listen", "127.0.0.1:${PORT}", "--start-after", "0.5"]
    config = {"models": {"eng": {"cmd": cmd, "gpus": "none"}}}
    router, seen = serve(config, tmp_path)
    with router:
        assert call(router.url, "/v1/chat/completions", chat("eng"))[0] == 200
        (first,) = router.status()[0]["replicas"]
        port = int(first["url"].rsplit(":", 1)[1])
        pid = next(e.pid for e, _ in seen.events if type(e).__name__ == "Started")
        with Impostor(port) as other:
            os.kill(pid, signal.SIGKILL)
            other.listening()
            answers: list[tuple[int, Any]] = []
            deadline = time.monotonic() + 30
            while not answers or answers[-1][0] != 200:
                assert time.monotonic() < deadline, (answers, seen.messages)
                status, body, _ = call(router.url, "/v1/chat/completions", chat("eng"))
                answers.append((status, body))
            assert all("IMPOSTOR" not in json.dumps(body) for _, body in answers), answers
            (now,) = router.status()[0]["replicas"]
            assert now["url"] != first["url"] and now["up"]
            assert any(f"was taken by pid {other.pid}" in m for m in seen.messages)


def test_kill_9_of_the_router_ends_its_engines_and_frees_their_gpu(tmp_path: Path) -> None:
    marker = f"engine-marker-{os.getpid()}-{time.monotonic_ns()}"
    config = tmp_path / "models.toml"
    cmd = [sys.executable, ENGINE, "--port", "${PORT}", "--name", marker]
    config.write_text(f'[models.eng]\ncmd = {json.dumps(cmd)}\nmemory = "6GiB"\n')
    xpulaunch_cli = str(Path(sys.executable).parent / "xpulaunch")
    args = ["--config", str(config), "--port", "0", "--inventory", str(TWO)]
    router = subprocess.Popen(
        [xpulaunch_cli, "llama", "serve", *args, "--lock-dir", str(tmp_path / "locks")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert router.stdout is not None
        line = router.stdout.readline()
        url = line.split(" at ")[1].split("/v1")[0]
        status, body, _ = call(url, "/v1/chat/completions", chat("eng"))
        assert status == 200 and body["model"] == marker
        assert processes_marked((marker,)) and leases_of(tmp_path)
        router.kill()
        router.wait(30)
        until_gone = time.monotonic() + 30
        while processes_marked((marker,)) or leases_of(tmp_path):
            assert time.monotonic() < until_gone, processes_marked((marker,))
            time.sleep(0.05)
    finally:
        router.kill()
        router.wait(30)
        for proc in processes_marked((marker,)):
            proc.kill()
