"""The router's per-model and router-wide options beyond placement: ``preload``,
``max_concurrency``/``max_queue``, ``[serve] api_keys`` and ``cors``, ``/upstream/MODEL/``,
and SSE comment lines while a streamed request waits for its model's load. With the stand-in
engine (``fake_engine.py``), the real CPU llama-server and the official ``openai`` client;
the checks made before routing are tested with front processes too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from router_kit import FAST, Seen, call, chat, models_in

import xpulaunch
from helpers import load_inventory
from xpulaunch.llamacpp.router.events import ModelLoaded

pytestmark = [pytest.mark.timeout(120)]

ENGINE = str(Path(__file__).with_name("fake_engine.py"))
KEY = "sk-test-9f8e7d6c5b4a"


def engine(*extra: str, **table: Any) -> dict[str, Any]:
    cmd = [sys.executable, ENGINE, "--port", "${PORT}", "--name", "${MODEL}", *extra]
    return {"cmd": cmd, "gpus": "none", **table}


def serve(config: dict[str, Any], tmp_path: Path, **options: Any) -> tuple[Any, Seen]:
    seen = Seen()
    router = xpulaunch.serve_models(
        config,
        inventory=load_inventory("cpu-only.json"),
        lock_dir=tmp_path / "locks",
        health=FAST,
        grace_s=5.0,
        on_event=seen.on_event,
        on_message=seen.messages.append,
        **options,
    )
    return router, seen


def until(check: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(target()), daemon=True)
    thread.start()
    return thread, out


def raw_stream(url: str, model: str, headers: dict[str, str] | None = None) -> list[str]:
    """The lines of a streamed chat answer, as sent."""
    body = json.dumps(chat(model, stream=True)).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url + "/v1/chat/completions", data=body, headers=sent)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode().splitlines()


@pytest.mark.parametrize("fronts", [0, 1])
def test_api_keys_and_cors_are_checked_before_any_model_is_touched(
    tmp_path: Path, fronts: int
) -> None:
    config = {
        "serve": {"api_keys": [KEY], "cors": ["https://app.example"]},
        "models": {"eng": engine()},
    }
    router, seen = serve(config, tmp_path, front_processes=fronts, api_keys=["sk-other-key"])
    with router:
        status, body, headers = call(router.url, "/v1/chat/completions", chat("eng"))
        assert status == 401 and body["error"]["type"] == "authentication_error", body
        assert headers["WWW-Authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer sk-wrong"}
        status, body, _ = call(router.url, "/v1/models", headers=wrong)
        assert status == 401 and "a wrong API key" in body["error"]["message"]
        assert call(router.url, "/health")[0] == 200  # open without a key
        assert not router.status()[0]["loads"]  # nothing was loaded for them
        client = openai.OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=0)
        answer = client.chat.completions.create(
            model="eng", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "hello from the engine"
        other = openai.OpenAI(base_url=router.url + "/v1", api_key="sk-other-key", max_retries=0)
        assert [m.id for m in other.models.list()] == ["eng"]  # --api-key's key too
        assert call(router.url, "/v1/models", headers={"x-api-key": KEY})[0] == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=router.url + "/v1", api_key="nope", max_retries=0).models.list()
        # The key is the router's: the model's server never sees it.
        status, body, _ = call(
            router.url, "/upstream/eng/echo", headers={"Authorization": f"Bearer {KEY}"}
        )
        assert status == 200 and body["auth"] is None, body
        # CORS: a preflight is answered, and answers carry the origin (a 401 too).
        preflight = urllib.request.Request(
            router.url + "/v1/chat/completions",
            method="OPTIONS",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        with urllib.request.urlopen(preflight, timeout=30) as answer:
            assert answer.status == 204
            assert answer.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "POST" in answer.headers["Access-Control-Allow-Methods"]
            assert answer.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        origin = {"Origin": "https://app.example"}
        status, _, headers = call(router.url, "/v1/models", headers=origin)
        assert status == 401 and headers["Access-Control-Allow-Origin"] == "https://app.example"
        lines = raw_stream(router.url, "eng", {**origin, "Authorization": f"Bearer {KEY}"})
        assert "data: [DONE]" in lines
        status, _, headers = call(router.url, "/health", headers={"Origin": "https://evil.example"})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
        if fronts:  # each connection lands on the router or its front: both check
            vias = set()
            for _ in range(30):
                assert call(router.url, "/v1/chat/completions", chat("eng"))[0] == 401
                status, _, headers = call(
                    router.url,
                    "/v1/chat/completions",
                    chat("eng"),
                    headers={"Authorization": f"Bearer {KEY}"},
                )
                assert status == 200
                vias.add(headers.get("Via"))
            assert vias == {"1.1 xpulaunch", "1.1 xpulaunch-front1"}, vias
    said = "\n".join(seen.messages) + repr(seen.events)
    assert KEY not in said and "sk-other-key" not in said and "sk-wrong" not in said


@pytest.mark.parametrize("fronts", [0, 1])
def test_max_concurrency_queues_up_to_max_queue_then_429_with_retry_after(
    tmp_path: Path, fronts: int
) -> None:
    hold = tmp_path / "go"
    config = {"models": {"eng": engine("--hold", str(hold), max_concurrency=1, max_queue=1)}}
    router, _ = serve(config, tmp_path, front_processes=fronts)
    with router:
        assert call(router.url, "/v1/chat/completions", chat("eng"))[0] == 200  # loaded
        first, first_out = in_thread(lambda: raw_stream(router.url, "eng"))
        until(lambda: router.status()[0]["in_flight"] == 1, "the first stream never began")
        second, second_out = in_thread(lambda: raw_stream(router.url, "eng"))
        until(lambda: router.status()[0]["queued"] == 1, "the second never waited")
        status, body, headers = call(router.url, "/v1/chat/completions", chat("eng"))
        assert status == 429 and body["error"]["type"] == "rate_limit_error", body
        assert "max_concurrency" in body["error"]["message"]
        assert headers["Retry-After"] == "1"
        hold.touch()
        first.join(60)
        second.join(60)
        assert "data: [DONE]" in first_out[0] and "data: [DONE]" in second_out[0]
        assert router.status()[0]["queued"] == 0
        assert call(router.url, "/v1/chat/completions", chat("eng"))[0] == 200


def test_a_streamed_request_during_a_slow_load_gets_comment_lines_then_its_answer(
    tmp_path: Path,
) -> None:
    config = {"models": {"slow": engine("--start-after", "2.5")}}
    router, _ = serve(config, tmp_path)
    with router:
        stream, out = in_thread(lambda: raw_stream(router.url, "slow"))
        until(lambda: router.status()[0]["state"] == "loading", "it never loaded")
        status = router.status()[0]
        assert status["loading_since"].endswith("Z") and status["loading_s"] >= 0
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "xpulaunch",
                "llama",
                "serve",
                "--status",
                "--port",
                str(router.port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert re.search(r"slow +loading \(\d+ s\)", shown), shown
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        words = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        assert words == "hello from the engine"  # the client skipped the comments
        stream.join(60)
        lines = out[0]
        notes = [line for line in lines if line.startswith(": loading slow, ")]
        assert len(notes) >= 2, lines  # about one a second over a load of 2.5 s
        first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
        assert all(lines.index(n) < first_data for n in notes)
        assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines
        assert router.status()[0]["loading_since"] is None


def test_a_load_that_fails_during_a_stream_ends_it_with_an_error_event(tmp_path: Path) -> None:
    crash = [sys.executable, "-c", "import time, sys; time.sleep(1.5); sys.exit(3)", "${PORT}"]
    router, _ = serve({"models": {"bad": {"cmd": crash, "gpus": "none"}}}, tmp_path)
    with router:
        lines = raw_stream(router.url, "bad")
        assert lines[0].startswith(": loading bad, "), lines
        event = json.loads(next(line for line in lines if line.startswith("data:"))[5:])
        assert event["error"]["code"] == 502
        assert "exited with code 3 before it was ready" in event["error"]["message"]
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIError, match="could not be loaded"):
            list(
                client.chat.completions.create(
                    model="bad", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            )


def test_preload_loads_at_start_and_upstream_reaches_llama_servers_web_ui(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    # This build of llama-server embeds no web UI: its own --path serves the page instead.
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "index.html").write_text("<html><title>llama.cpp UI</title></html>")
    config = models_in(tmp_path, tiny_model, chat={"preload": True}, other={})
    config["models"]["chat"]["args"] += ["--path", str(tmp_path / "ui")]
    config["models"]["eng"] = engine()
    router, seen = serve(config, tmp_path, binary=llama_server)
    with router:
        until(lambda: seen.of(ModelLoaded), "the preloaded model never loaded")
        assert [e.model for e in seen.of(ModelLoaded)] == ["chat"]
        status, text, headers = call(router.url, "/upstream/chat/")
        assert status == 200 and headers["Content-Type"].startswith("text/html"), text
        assert "llama.cpp UI" in text
        status, body, _ = call(router.url, "/upstream/chat/health")
        assert status == 200 and body["status"] == "ok"
        # Without the slash, a redirect to it (the page's relative links need it).
        request = urllib.request.Request(router.url + "/upstream/other")
        with urllib.request.urlopen(request, timeout=60) as answer:  # follows it
            assert answer.url.endswith("/upstream/other/")
        assert {m["id"] for m in router.status() if m["state"] == "ready"} == {"chat", "other"}
        status, body, _ = call(router.url, "/upstream/eng/echo/a?b=1")
        assert status == 200 and body["path"] == "/echo/a?b=1"
        status, body, _ = call(router.url, "/upstream/nope/x")
        assert status == 404 and "not served here" in body["error"]["message"]


def test_a_preloaded_model_that_fails_is_one_line_and_the_router_serves_on(tmp_path: Path) -> None:
    crash = [sys.executable, "-c", "import sys; sys.exit(4)", "${PORT}"]
    config = {"models": {"bad": {"cmd": crash, "gpus": "none", "preload": True}, "good": engine()}}
    router, seen = serve(config, tmp_path)
    with router:
        until(lambda: any("could not be loaded" in m for m in seen.messages), "no line")
        (line,) = [m for m in seen.messages if "could not be loaded" in m]
        assert line.startswith("model bad could not be loaded: ") and "code 4" in line, line
        assert call(router.url, "/v1/chat/completions", chat("good"))[0] == 200
        assert {m["id"]: m["state"] for m in router.status()} == {
            "bad": "unloaded",
            "good": "ready",
        }
