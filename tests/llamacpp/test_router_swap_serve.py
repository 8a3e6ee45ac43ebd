"""A llama-swap ``config.yaml`` served as it is: llama-server commands (the CUDA build's
stand-in over the real CPU llama-server, ``router_kit.cuda_shim``) and stand-in engines
(``fake_engine.py``) behind one port, with macros, aliases, ttl, an unlisted model, a group
that swaps, a model pinned by hand with ``CUDA_VISIBLE_DEVICES`` and ``startPort``; the
official ``openai`` client asks. Then the CLI: its dry run and its one-line errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from router_kit import FAST, Seen, call, chat, cuda_shim, shim_records

import xpulaunch
from helpers import inventory_path, load_inventory
from xpulaunch.leases import LeaseManager
from xpulaunch.llamacpp.router.events import ModelUnloaded

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(180)]

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
ENGINE = str(Path(__file__).with_name("fake_engine.py"))
TWO = inventory_path("2x-h200.json")
GPU = {d["index"]: d for d in json.loads(TWO.read_text())["devices"]}


def swap_config(tmp_path: Path, shim: str, tiny_model: Path, start_port: int) -> Path:
    """llama-swap's own spelling of four models (a file it would run too, but for the paths)."""
    for name in ("chat", "small"):
        (tmp_path / f"{name}.gguf").symlink_to(tiny_model)
    (tmp_path / "rec").mkdir()
    path = tmp_path / "config.yaml"
    path.write_text(f"""\
healthCheckTimeout: 120
startPort: {start_port}
logLevel: info
macros:
  "llama": "{shim} --port ${{PORT}}"
  "small_args": "-c 256 -t 1"
  "engine": >
    {sys.executable} {ENGINE}
    --port ${{PORT}} --name ${{MODEL_ID}}
models:
  "chat":
    # pinned by hand to the second GPU, as llama-swap users do
    cmd: |
      ${{llama}}
      # the model, relative to the working folder
      -m chat.gguf
      ${{small_args}}
    env:
      - "CUDA_VISIBLE_DEVICES=1"
    aliases:
      - "gpt-4o-mini"
  "small":
    cmd: ${{llama}} -m small.gguf ${{small_args}}
    ttl: 2
  "e1":
    cmd: ${{engine}}
    checkEndpoint: /health
    name: "engine one"
    memory: 1GiB       # xpulaunch's own key: a share of a GPU (else a whole one)
  "e2":
    cmd: ${{engine}} --record {tmp_path / "rec"}
    unlisted: true
    env: ["ENGINE_SETTING=${{small_args}}"]
    gpus: none
groups:
  "engines":
    swap: true
    exclusive: false
    members: ["e1", "e2"]
""")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def leased(tmp_path: Path) -> dict[str, list[str]]:
    """Device -> the commands holding it (whole, or a slot of it)."""
    report = LeaseManager(tmp_path / "locks").status()
    found: dict[str, list[str]] = {}
    for record in (*report.leases, *report.slots):
        found.setdefault(record.key, []).append(" ".join(record.holder.argv))
    return found


def test_a_llama_swap_config_serves_as_it_is(
    tmp_path: Path, llama_server: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim = cuda_shim(tmp_path / "bin", llama_server)
    (tmp_path / "records").mkdir()
    start = free_port()
    path = swap_config(tmp_path, shim, tiny_model, start)
    monkeypatch.chdir(tmp_path)  # llama-swap's relative paths are its working folder's
    seen = Seen()
    env = {"FAKE_LLAMA_INVENTORY": str(TWO), "SHIM_RECORD_DIR": str(tmp_path / "records")}
    router = xpulaunch.serve_models(
        path, inventory=load_inventory("2x-h200.json"), lock_dir=tmp_path / "locks",
        health=FAST, grace_s=5.0, parent_env={**dict(__import__("os").environ), **env},
        on_event=seen.on_event, on_message=seen.messages.append,
    )  # fmt: skip
    with router:
        assert router.setup.health.ready_timeout_s == 120  # healthCheckTimeout
        listed = call(router.url, "/v1/models")[1]
        assert sorted(m["id"] for m in listed["data"]) == ["chat", "e1", "small"]  # e2 unlisted
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
        for name in ("gpt-4o-mini", "small"):  # an alias of chat, and small
            answer = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert answer.choices[0].message.content is not None
        # Both llama-servers are loaded at once (each sized by its GGUF, packed by memory).
        status = {m["id"]: m for m in router.status()}
        assert status["chat"]["state"] == status["small"]["state"] == "ready"
        # Each server's model (its -m) and the mask it saw (a server restarted under load
        # records again, alike).
        seen_by = {args.split()[1]: mask for mask, args in shim_records(tmp_path / "records")}
        assert seen_by[str(tmp_path / "chat.gguf")] == GPU[1]["uuid"]  # its hand pin, kept
        assert seen_by[str(tmp_path / "small.gguf")] in (GPU[0]["uuid"], GPU[1]["uuid"])
        assert "xpulaunch llama serve chat" in leased(tmp_path)[GPU[1]["pci_bus_id"]]
        for replica in (*status["chat"]["replicas"], *status["small"]["replicas"]):
            assert int(replica["url"].rsplit(":", 1)[1]) >= start  # startPort
        # The group swaps: e2 (unlisted, but served) unloads e1; the others stay.
        assert call(router.url, "/v1/chat/completions", chat("e1"))[0] == 200
        stream = client.chat.completions.create(
            model="e2", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (
            "hello from the engine"
        )
        swapped = [(e.model, e.reason, e.by) for e in seen.of(ModelUnloaded)]
        assert ("e1", "swapped", "e2") in swapped
        assert {m["id"]: m["state"] for m in router.status()}["chat"] == "ready"
        (record,) = [json.loads(p.read_text()) for p in (tmp_path / "rec").glob("*.json")]
        assert record["ENGINE_SETTING"] == "-c 256 -t 1"  # a macro in env
        # small's ttl (2 s idle) unloads it; chat, without one, stays.
        deadline = time.monotonic() + 30
        while ("small", "ttl", None) not in [
            (e.model, e.reason, e.by) for e in seen.of(ModelUnloaded)
        ]:
            assert time.monotonic() < deadline, seen.messages
            time.sleep(0.1)
        assert {m["id"]: m["state"] for m in router.status()}["chat"] == "ready"
    assert leased(tmp_path) == {}


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [XPULAUNCH, "llama", "serve", *args], check=False, capture_output=True, text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})}, timeout=120,
    )  # fmt: skip


def test_the_dry_run_says_the_hand_pin_and_each_key_not_taken(
    tmp_path: Path, llama_server: str, tiny_model: Path
) -> None:
    shim = cuda_shim(tmp_path / "bin", llama_server)
    path = swap_config(tmp_path, shim, tiny_model, 10001)
    done = run_cli(
        "--config", str(path), "--inventory", str(TWO), "--lock-dir", str(tmp_path / "locks"),
        "--dry-run", cwd=tmp_path, env={"FAKE_LLAMA_INVENTORY": str(TWO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"xpulaunch: warning: {path}: logLevel: not taken (the router logs to stderr; "
        "--events writes every event as JSON)",
        f"xpulaunch: warning: {path}: models.e1.name: not taken (GET /v1/models shows the id)",
    ]
    chat_part = done.stdout.split("model chat:")[1].split("model small:")[0]
    assert "pinned by hand: its env sets CUDA_VISIBLE_DEVICES=1" in chat_part
    assert GPU[1]["uuid"] in chat_part and GPU[0]["uuid"] not in chat_part


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  a:\n    cmd: /no/such/engine --port ${PORT}\n",
         "cmd: '/no/such/engine' is not an executable program"),
        ("models:\n  a:\n    cmd: /no/llama-server --port ${PORT} -m config.yaml\n",
         "binary: '/no/llama-server' is not an executable program"),
        ("models:\n  a:\n    cmd: x --port ${PORT} ${env.XPULAUNCH_TEST_UNSET}\n",
         "XPULAUNCH_TEST_UNSET is not set"),
        ('models:\n  a:\n    cmd: true --port ${PORT}\n    env: ["CUDA_VISIBLE_DEVICES=7"]\n',
         "CUDA_VISIBLE_DEVICES=7: names no nvidia device here"),
        ("models:\n  a:\n    cmd: true --port ${PORT}\n    memory: 900GiB\n",
         "more than every GPU here together"),
        ("models:\n  a: {cmd: [unclosed\n", "not valid YAML|line"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_starts_nothing(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    done = run_cli(
        "--config", str(path), "--inventory", str(TWO), "--lock-dir", str(tmp_path / "locks"),
        "--port", "0", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    assert not LeaseManager(tmp_path / "locks").status().leases


def test_a_group_member_waits_for_the_busy_one_it_would_swap_out(tmp_path: Path) -> None:
    """[groups.ID] in models.toml: b may not load while a, in the same swapping group, has a
    stream under way: b's request waits (up to --room-wait) and gets 503 naming a; once a's
    stream ends, b's next request unloads a ("swapped") and loads. The group is exclusive (the
    default): loading a unloaded c, in no group."""
    import threading
    import urllib.request

    hold = tmp_path / "go"

    def engine(*extra: str) -> dict[str, object]:
        cmd = [sys.executable, ENGINE, "--port", "${PORT}", "--name", "${MODEL}", *extra]
        return {"cmd": cmd, "gpus": "none"}

    config = {
        "models": {"a": engine("--hold", str(hold)), "b": engine(), "c": engine()},
        "groups": {"pair": {"members": ["a", "b"]}},
    }
    seen = Seen()
    router = xpulaunch.serve_models(
        config, inventory=load_inventory("cpu-only.json"), lock_dir=tmp_path / "locks",
        health=FAST, grace_s=5.0, room_wait_s=0.5, on_event=seen.on_event,
        on_message=seen.messages.append,
    )  # fmt: skip
    with router:
        for model in ("c", "a"):
            assert call(router.url, "/v1/chat/completions", chat(model))[0] == 200
        body = json.dumps(chat("a", stream=True)).encode()
        request = urllib.request.Request(
            router.url + "/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        out: list[str] = []
        streaming = threading.Thread(
            target=lambda: out.append(urllib.request.urlopen(request, timeout=60).read().decode()),
            daemon=True,
        )
        streaming.start()
        deadline = time.monotonic() + 20
        while {m["id"]: m for m in router.status()}["a"]["in_flight"] != 1:
            assert time.monotonic() < deadline, "a's stream never began"
            time.sleep(0.02)
        status, answer, _ = call(router.url, "/v1/chat/completions", chat("b"))
        assert status == 503, answer
        assert "waits for a to finish its requests" in answer["error"]["message"]
        hold.touch()
        streaming.join(30)
        assert "data: [DONE]" in out[0]
        assert call(router.url, "/v1/chat/completions", chat("b"))[0] == 200
        states = {m["id"]: m["state"] for m in router.status()}
        assert states == {"a": "unloaded", "b": "ready", "c": "unloaded"}
        unloaded = [(e.model, e.reason, e.by) for e in seen.of(ModelUnloaded)]
        assert unloaded == [("c", "swapped", "a"), ("a", "swapped", "b")]


def test_a_llama_swap_config_reloads_and_keeps_a_loaded_models_server(tmp_path: Path) -> None:
    """POST /models/reload reads the YAML again: a new model is served, the loaded one keeps
    its server (the same pid), and the new file's key not taken is said again."""
    engine = f"{sys.executable} {ENGINE} --port ${{PORT}} --name ${{MODEL_ID}}"
    path = tmp_path / "config.yaml"
    path.write_text(f"models:\n  a:\n    cmd: {engine}\n    gpus: none\n")
    seen = Seen()
    router = xpulaunch.serve_models(
        path, inventory=load_inventory("cpu-only.json"), lock_dir=tmp_path / "locks",
        health=FAST, grace_s=5.0, on_event=seen.on_event, on_message=seen.messages.append,
    )  # fmt: skip
    with router:
        assert call(router.url, "/v1/chat/completions", chat("a"))[0] == 200
        path.write_text(
            f"models:\n  a:\n    cmd: {engine}\n    gpus: none\n"
            f"  b:\n    cmd: {engine}\n    gpus: none\n    name: B\n"
        )
        status, body, _ = call(router.url, "/models/reload", {})
        assert status == 200, body
        assert call(router.url, "/v1/chat/completions", chat("b"))[0] == 200
        assert any("models.b.name: not taken" in line for line in seen.messages), seen.messages
        assert not seen.of(ModelUnloaded)  # a kept its server: started once
        started = [model for e, model in seen.events if type(e).__name__ == "Started"]
        assert started == ["a", "b"]
