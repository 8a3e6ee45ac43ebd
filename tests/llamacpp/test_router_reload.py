"""The model router reads its config file again without a restart (``POST /models/reload``,
SIGHUP, ``xpulaunch llama serve --reload``): a new model is served at once, an unchanged loaded
model keeps its server (the same process), a changed one reloads once idle, a removed one is
unloaded, and a config that does not load leaves the one before serving. Real llama-servers
(the CPU build) on the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from router_kit import SMALL, call, chat, router

from helpers import inventory_path, wait_for
from xpulaunch.llamacpp.router.events import ModelUnloaded

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(120)]

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def write_config(path: Path, tiny_model: Path, **tables: dict[str, Any]) -> Path:
    """``models.toml`` with one table per model, each serving the tiny model."""
    text = ""
    for name, table in tables.items():
        args = table.get("args", SMALL)
        text += f'[models.{name}]\nmodel = "{tiny_model}"\nargs = {json.dumps(args)}\n'
    path.write_text(text)
    return path


def server_pids(model: str) -> set[int]:
    """The llama-servers serving ``model`` (its alias is its id)."""
    found = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        words = proc.info["cmdline"] or []
        alive = proc.info["status"] != psutil.STATUS_ZOMBIE
        if alive and "--alias" in words and words[words.index("--alias") + 1] == model:
            found.add(proc.pid)
    return found


def test_a_reload_adds_keeps_changes_and_removes_models(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "models.toml", tiny_model, keep={}, change={}, drop={})
    with router(config, llama_server, tmp_path) as (served, seen):  # type: ignore[arg-type]
        for model in ("keep", "change", "drop"):
            assert call(served.url, "/v1/chat/completions", chat(model))[0] == 200
        kept, changed = server_pids("keep"), server_pids("change")
        assert len(kept) == 1 and len(changed) == 1

        write_config(config, tiny_model, keep={}, change={"args": ["-c", "512", "-t", "1"]}, new={})
        status, body, _ = call(served.url, "/models/reload", {})
        assert status == 200, body
        assert body["changes"] == [  # in the file's order, then what it no longer has
            "model change changed: it reloads once idle",
            "model new added",
            "model drop removed: unloaded once idle",
        ]
        assert call(served.url, "/v1/chat/completions", chat("new"))[0] == 200
        assert call(served.url, "/v1/chat/completions", chat("drop"))[0] == 404
        wait_for(lambda: server_pids("drop") == set(), "the removed model's server to end")
        assert call(served.url, "/v1/chat/completions", chat("change"))[0] == 200
        now = server_pids("change")
        assert len(now) == 1 and now != changed  # started again with its new args
        assert "-c 512" in " ".join(psutil.Process(now.pop()).cmdline())
        assert server_pids("keep") == kept  # unchanged: the same server answers
        assert call(served.url, "/v1/chat/completions", chat("keep"))[0] == 200
        reasons = sorted((e.model, e.reason) for e in seen.of(ModelUnloaded))
        assert reasons == [("change", "reloaded"), ("drop", "removed")]
        ids = [m["id"] for m in call(served.url, "/v1/models")[1]["data"]]
        assert sorted(ids) == ["change", "keep", "new"]


def test_a_config_that_does_not_load_keeps_the_one_before(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "models.toml", tiny_model, a={})
    with router(config, llama_server, tmp_path) as (served, seen):  # type: ignore[arg-type]
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        before = server_pids("a")
        config.write_text('[models.a]\nmodel = "nowhere.gguf"\nunknown = 1\n')
        status, body, _ = call(served.url, "/models/reload", {})
        assert status == 400 and "unknown key 'unknown'" in body["error"]["message"], body
        assert any("serving the config before it" in m for m in seen.messages), seen.messages
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        assert server_pids("a") == before


def test_sighup_and_the_reload_command(
    llama_server: str, tiny_model: Path, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    config = write_config(tmp_path / "models.toml", tiny_model, a={})
    proc = subprocess.Popen(
        [XPULAUNCH, "llama", "serve", "--config", str(config), "--port", "0",
         "--binary", llama_server, "--inventory", str(inventory_path("cpu-only.json")),
         "--lock-dir", str(tmp_path / "locks")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started.append(proc)
    assert proc.stdout is not None
    url = proc.stdout.readline().split(" at ")[1].split("/v1")[0]
    port = url.rsplit(":", 1)[1]
    assert call(url, "/v1/chat/completions", chat("a"))[0] == 200
    write_config(config, tiny_model, a={}, b={})
    os.kill(proc.pid, signal.SIGHUP)  # read the config again; not a stop
    wait_for(lambda: call(url, "/v1/chat/completions", chat("b"))[0] == 200, "b to be served")
    write_config(config, tiny_model, a={}, b={}, c={})
    done = subprocess.run(
        [XPULAUNCH, "llama", "serve", "--reload", "--port", port],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "xpulaunch: reload: model c added\n", done
    assert proc.poll() is None  # SIGHUP did not stop it
    config.write_text("[models.a]\nunknown = 1\n")  # a file that does not load
    os.kill(proc.pid, signal.SIGHUP)
    done = subprocess.run(
        [XPULAUNCH, "llama", "serve", "--reload", "--port", port],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "kept its config" in done.stderr, done
    assert call(url, "/v1/chat/completions", chat("c"))[0] == 200  # the old config serves
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "reload: model b added" in err and proc.returncode == 128 + signal.SIGTERM, err
    # Said once for the signal and once for --reload; a signal's failed reload is no traceback.
    assert err.count("serving the config before it") == 2, err
    assert "Traceback" not in err and "exception was never retrieved" not in err, err


def test_front_processes_serve_a_model_added_by_a_reload(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    """Requests that the kernel hands to a front process find the new model too."""
    config = write_config(tmp_path / "models.toml", tiny_model, a={})
    with router(config, llama_server, tmp_path, front_processes=2) as (served, _):  # type: ignore[arg-type]
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 200
        write_config(config, tiny_model, a={}, b={})
        assert call(served.url, "/models/reload", {})[0] == 200
        # New connections are spread over the router and its two fronts.
        answers = {call(served.url, "/v1/chat/completions", chat("b"))[0] for _ in range(12)}
        assert answers == {200}


def test_a_reload_keeps_the_api_keys_given_outside_the_file(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "models.toml", tiny_model, a={})
    key = {"Authorization": "Bearer sk-outside-the-file"}
    with router(config, llama_server, tmp_path, api_keys=["sk-outside-the-file"]) as (served, _):  # type: ignore[arg-type]
        assert call(served.url, "/models/reload", {})[0] == 401  # the reload route is guarded
        assert call(served.url, "/models/reload", {}, headers=key)[0] == 200
        assert call(served.url, "/v1/chat/completions", chat("a"))[0] == 401
        assert call(served.url, "/v1/chat/completions", chat("a"), headers=key)[0] == 200
