"""The model router with the REAL llama-server (CPU build) and tiny models: answers streamed
and not, loads on demand (one load for many waiting requests), ttl, round robin, a crash,
clients that leave, and one clear JSON error for each bad request. Clients: the official
``openai`` package, curl and urllib."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from router_kit import call, chat, models_in, router

from helpers import processes_marked, wait_for
from xpulaunch.llamacpp.router.events import (
    ModelLoaded,
    ModelLoadFailed,
    ModelLoading,
    ModelUnloaded,
)

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.timeout(120)]


def servers(folder: Path) -> list[psutil.Process]:
    """llama-server processes serving a model of this test (their -m is under ``folder``)."""
    return [p for p in processes_marked((f"{folder}/",)) if "llama-server" in p.name()]


def metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_two_models_answer_on_one_port_streamed_and_not(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    from openai import OpenAI

    embeddings = ["-c", "256", "-t", "1", "--embeddings", "--pooling", "mean"]
    config = models_in(tmp_path, tiny_model, qwen={"aliases": ["q"]}, llama={},
                       embed={"args": embeddings})  # fmt: skip
    with router(config, llama_server, tmp_path) as (served, seen):
        assert servers(tmp_path) == []  # nothing loads before it is asked for
        client = OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
        assert sorted(m.id for m in client.models.list()) == ["embed", "llama", "qwen"]
        hello = [{"role": "user", "content": "hi"}]
        answer = client.chat.completions.create(model="q", max_tokens=4, messages=hello)
        assert answer.model == "qwen" and answer.choices[0].message.content is not None
        chunks = list(client.chat.completions.create(
            model="llama", max_tokens=8, stream=True, messages=hello,
        ))  # fmt: skip
        assert len(chunks) >= 2 and chunks[-1].choices[0].finish_reason is not None
        assert {c.model for c in chunks} == {"llama"}
        # curl, streamed: server-sent events end with [DONE].
        done = subprocess.run(
            ["curl", "-sN", "--max-time", "30", served.url + "/v1/completions",
             "-H", "Content-Type: application/json",
             "-d", json.dumps({"model": "qwen", "prompt": "hi", "max_tokens": 4, "stream": True})],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 2, done.stdout
        # Embeddings too; llama-server's own errors pass through as they are.
        vectors = client.embeddings.create(model="embed", input=["hi", "there"])
        assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 64
        status, body, _ = call(served.url, "/v1/embeddings", {"model": "qwen", "input": "hi"})
        assert status == 501 and "--embeddings" in body["error"]["message"], body
        assert len(servers(tmp_path)) == 3
        assert [e.model for e in seen.of(ModelLoaded)] == ["qwen", "llama", "embed"]
        samples = metric_samples(served.url)
        assert samples[("xpulaunch_model_loaded", (("model", "qwen"),))] == 1
        ok = samples[
            ("xpulaunch_requests_total", (("code", "200"), ("model", "qwen"), ("replica", "0")))
        ]
        assert ok >= 2
        # llama-server's own metrics, labelled with model and replica.
        own = {labels for (name, labels) in samples if name == "llamacpp:prompt_tokens_total"}
        assert own == {(("model", m), ("replica", "0")) for m in ("embed", "llama", "qwen")}
    wait_for(lambda: servers(tmp_path) == [], "the servers to stop", timeout_s=20)


def test_concurrent_requests_wait_for_one_load(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, tiny_model, one={})
    with router(config, llama_server, tmp_path) as (served, seen):
        results: list[int] = []

        def ask() -> None:
            results.append(call(served.url, "/v1/chat/completions", chat("one"))[0])

        threads = [threading.Thread(target=ask) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert results == [200] * 16
        assert len(seen.of(ModelLoading)) == 1 and len(seen.of(ModelLoaded)) == 1
        assert len(servers(tmp_path)) == 1


def test_ttl_unloads_an_idle_model_and_a_request_loads_it_again(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, tiny_model, brief={"ttl": 1}, stays={})
    with router(config, llama_server, tmp_path) as (served, seen):
        for model in ("brief", "stays"):
            assert call(served.url, "/v1/chat/completions", chat(model))[0] == 200
        began = time.monotonic()
        wait_for(lambda: seen.of(ModelUnloaded), "the ttl to unload brief", timeout_s=10)
        assert time.monotonic() - began >= 0.5  # not before its ttl
        [unloaded] = seen.of(ModelUnloaded)
        assert (unloaded.model, unloaded.reason) == ("brief", "ttl")
        assert [p.cmdline()[p.cmdline().index("-m") + 1] for p in servers(tmp_path)] == [
            str(tmp_path / "stays.gguf")
        ]
        assert call(served.url, "/v1/chat/completions", chat("brief"))[0] == 200
        assert len(seen.of(ModelLoaded)) == 3


def test_round_robin_across_replicas(llama_server: str, tiny_model: Path, tmp_path: Path) -> None:
    config = models_in(tmp_path, tiny_model, pair={"replicas": 2})
    # reprobe: the host is probed again (in a child) before the load, as the command does.
    with router(config, llama_server, tmp_path, reprobe=True) as (served, _):
        for _ in range(4):
            assert call(served.url, "/v1/chat/completions", chat("pair"))[0] == 200
        samples = metric_samples(served.url)
        per_replica = {
            dict(labels)["replica"]: value for (name, labels), value in samples.items()
            if name == "xpulaunch_requests_total" and dict(labels)["model"] == "pair"
        }  # fmt: skip
        assert per_replica == {"0": 2, "1": 2}
        assert len(servers(tmp_path)) == 2


def test_bad_requests_get_one_json_error_each(
    llama_server: str, tiny_model: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = models_in(tmp_path, tiny_model, m={})
    with router(config, llama_server, tmp_path, max_body_bytes=4096) as (served, seen):
        cases = [
            ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
            ("/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
            ("/v1/chat/completions", b'{"messages": []}', 400, 'needs a "model" field naming'),
            ("/v1/chat/completions", json.dumps(chat("gpt-4")).encode(), 404,
             "model 'gpt-4' is not served here; models: m"),
            ("/v1/chat/completions", json.dumps(chat("g" * 3000)).encode(), 404,
             f"model '{'g' * 100}'… is not served here; models: m"),
            ("/v1/completions", b"{" + b" " * 5000 + b"}", 413, "Maximum request body size"),
            ("/v1/nothing", b"{}", 404, "no route POST /v1/nothing"),
        ]  # fmt: skip
        for path, body, status, message in cases:
            got, answer, headers = call(served.url, path, body)
            assert got == status, (path, answer)
            assert headers["Content-Type"].startswith("application/json")
            assert answer["error"]["code"] == status and message in answer["error"]["message"]
        # What a 404 echoes of the name is capped (a 2 MB name got a 2 MB answer).
        assert len(call(served.url, "/v1/models/" + "g" * 3000)[1]["error"]["message"]) < 200
        status, answer, _ = call(served.url, "/v1/chat/completions")  # GET
        assert status == 405 and "GET is not allowed" in answer["error"]["message"]
        # JSON nested deeper than Python's recursion limit, on a model route and the router's
        # own; a body that is not in the Content-Encoding it names.
        deep = b'{"model": "m", "x": ' + b"[" * 1500 + b"]" * 1500 + b"}"
        unreadable = [
            ("/v1/chat/completions", deep, {}, "nested too deeply"),
            ("/models/load", deep, {}, "nested too deeply"),
            ("/v1/completions", b"{}", {"Content-Encoding": "gzip"},
             "cannot be read: Can not decode content-encoding: gzip"),
        ]  # fmt: skip
        for path, body, headers, message in unreadable:
            got, answer, _ = call(served.url, path, body, headers=headers)
            assert got == 400 and answer["error"]["code"] == 400, (path, answer)
            assert message in answer["error"]["message"], answer
        # Malformed HTTP, which aiohttp answers itself: one line in the router's output each,
        # as the body it could not decode above, and no traceback.
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")  # fmt: skip
            assert sock.recv(4096).startswith(b"HTTP/1.0 400 Bad Request")
        for said in ("Can not decode content-encoding: gzip",
                     "Transfer-Encoding can't be present with Content-Length"):  # fmt: skip
            wait_for(lambda: [m for m in seen.messages if m.endswith(said)], said)  # noqa: B023
        assert "Traceback" not in capfd.readouterr().err
        assert servers(tmp_path) == []  # no bad request loaded anything
        assert call(served.url, "/health")[:2] == (200, {"status": "ok"})


def test_load_and_unload_on_request_and_a_busy_model_is_not_unloaded(
    llama_server: str, long_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, long_model, big={"args": ["-c", "65536", "-t", "1"]})
    with router(config, llama_server, tmp_path) as (served, seen):
        status, body, _ = call(served.url, "/models/load", {"model": "big"})
        assert status == 200 and body["state"] == "ready" and body["replicas"][0]["up"]
        with long_stream(served.url, "big"):
            status, body, _ = call(served.url, "/models/unload", {"model": "big"})
            assert status == 409 and "1 request(s) in flight" in body["error"]["message"]
        wait_for(lambda: call(served.url, "/models/status")[1]["models"][0]["in_flight"] == 0,
                 "the stream to end")  # fmt: skip
        status, body, _ = call(served.url, "/models/unload", {"model": "big"})
        assert (status, body) == (200, {"id": "big", "state": "unloaded"})
        assert [(e.model, e.reason) for e in seen.of(ModelUnloaded)] == [("big", "request")]
        assert servers(tmp_path) == []


class long_stream:
    """A streaming completion that runs for many seconds (20000 tokens of the long model),
    left open in the block once its first token came."""

    def __init__(self, url: str, model: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 20000, "stream": True,
                           "ignore_eos": True}).encode()  # fmt: skip
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        self.sock.sendall(head + body)
        self.head = self.sock.recv(4096)  # the status line and headers, at least
        assert b" 200 " in self.head.split(b"\r\n")[0]
        while b"data: " not in self.head:  # past the notes while it loads: being answered
            more = self.sock.recv(4096)
            assert more, self.head
            self.head += more

    def __enter__(self) -> socket.socket:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def processing(url: str) -> float:
    """llama-server's own gauge of requests it is working on."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r"^llamacpp:requests_processing (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found[1])


def test_clients_that_leave_mid_stream_cancel_their_upstream_requests(
    llama_server: str, long_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, long_model, m={"args": ["-c", "65536", "-t", "1", "-np", "4"]})
    with router(config, llama_server, tmp_path) as (served, _):
        streams = [long_stream(served.url, "m") for _ in range(4)]
        upstream = call(served.url, "/models/status")[1]["models"][0]["replicas"][0]["url"]
        assert processing(upstream) == 4
        for stream in streams:
            stream.sock.close()
        wait_for(lambda: processing(upstream) == 0, "llama-server to drop the requests", 10)
        assert call(served.url, "/models/status")[1]["models"][0]["in_flight"] == 0
        samples = metric_samples(served.url)
        left = samples[
            ("xpulaunch_requests_total", (("code", "499"), ("model", "m"), ("replica", "0")))
        ]
        assert left == 4


def test_a_crashed_server_gets_a_clear_error_and_is_restarted(
    llama_server: str, long_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, long_model, m={"args": ["-c", "65536", "-t", "1"]})
    with router(config, llama_server, tmp_path) as (served, _):
        assert call(served.url, "/v1/chat/completions", chat("m"))[0] == 200
        [server] = servers(tmp_path)
        with long_stream(served.url, "m") as stream:
            server.kill()
            received = b""
            while chunk := stream.recv(65536):  # the router ends the answer
                received += chunk
        assert b'"code": 502' in received and b"closed the connection while answering" in received
        # Until the supervisor has it back: 502/503 with the reason, then answers again.
        statuses: list[int] = []

        def answered() -> bool:
            status, body, headers = call(served.url, "/v1/chat/completions", chat("m"))
            statuses.append(status)
            if status == 503:
                assert "no replica answers now" in body["error"]["message"]
                assert headers["Retry-After"] == "1"
            elif status != 200:
                assert status == 502 and "did not answer" in body["error"]["message"], body
            return status == 200

        wait_for(answered, "the restarted server to answer", timeout_s=30)
        assert set(statuses) <= {200, 502, 503}
        restarts = metric_samples(served.url)[
            ("xpulaunch_replica_restarts_total", (("model", "m"), ("replica", "0")))
        ]
        assert restarts == 1 and len(servers(tmp_path)) == 1


def test_requests_right_after_a_stream_are_answered(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    """llama-server closes its connection after a streamed answer (cpp-httplib), though it
    says keep-alive: the router must not send the next request down that connection."""
    import asyncio

    import aiohttp

    config = models_in(tmp_path, tiny_model, m={})

    async def alternate(url: str) -> list[int]:
        statuses = []
        async with aiohttp.ClientSession() as session:
            for i in range(20):
                body = chat("m", stream=i % 2 == 0)
                async with session.post(url + "/v1/chat/completions", json=body) as answer:
                    await answer.read()
                    statuses.append(answer.status)
        return statuses

    with router(config, llama_server, tmp_path) as (served, _):
        assert asyncio.run(alternate(served.url)) == [200] * 20


def test_a_server_that_cannot_start_is_a_clear_502_and_is_tried_again(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    config = models_in(tmp_path, tiny_model, broken={"args": ["--no-such-option"]}, fine={})
    with router(config, llama_server, tmp_path) as (served, seen):
        for _ in range(2):  # each request tries again: the file may have been fixed
            status, body, _ = call(served.url, "/v1/chat/completions", chat("broken"))
            assert status == 502, body
            message = body["error"]["message"]
            assert message.startswith("model broken could not be loaded: llama-server 0 exited")
            assert "--no-such-option" in message
        assert call(served.url, "/v1/chat/completions", chat("fine"))[0] == 200
        broken = next(m for m in call(served.url, "/models/status")[1]["models"]
                      if m["id"] == "broken")  # fmt: skip
        assert broken["state"] == "unloaded" and broken["last_error"] == message
        failed = seen.of(ModelLoadFailed)
        assert [(e.model, e.reason) for e in failed] == [("broken", message)] * 2
        assert len(servers(tmp_path)) == 1


def test_a_compressed_request_body_is_answered(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    """aiohttp decodes a body sent with ``Content-Encoding: gzip``; what goes on to
    llama-server is the decoded body, so the header must not go with it."""
    config = models_in(tmp_path, tiny_model, m={})
    with router(config, llama_server, tmp_path) as (served, _):
        body = gzip.compress(json.dumps(chat("m")).encode())
        status, answer, _ = call(served.url, "/v1/chat/completions", body,
                                 headers={"Content-Encoding": "gzip"})  # fmt: skip
        assert status == 200 and answer["model"] == "m", answer


def test_a_client_that_leaves_while_its_model_loads_is_counted_and_the_load_kept(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    slow = tmp_path / "slow-llama-server"  # starts serving 2 s late; answers questions at once
    slow.write_text(
        "#!/bin/sh\n"
        'case "$1" in --list-devices|--help|--version) ;; *) sleep 2 ;; esac\n'
        f'exec {shlex.quote(llama_server)} "$@"\n'
    )
    slow.chmod(0o755)
    config = models_in(tmp_path, tiny_model, m={})

    def model() -> dict[str, object]:
        return call(served.url, "/models/status")[1]["models"][0]  # type: ignore[no-any-return]

    with router(config, str(slow), tmp_path) as (served, seen):
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps(chat("m")).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
            wait_for(lambda: model()["in_flight"] == 1, "the request to wait for the load")
            assert model()["state"] == "loading"
        wait_for(lambda: model()["in_flight"] == 0, "the request to be released")
        wait_for(lambda: model()["state"] == "ready", "the load to go on")
        assert len(seen.of(ModelLoaded)) == 1
        left = metric_samples(served.url)[
            ("xpulaunch_requests_total", (("code", "499"), ("model", "m"), ("replica", "")))
        ]
        assert left == 1


def test_a_model_id_with_a_slash_is_one_model(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    """Ids such as Hugging Face's ``org/name``: ``GET /v1/models/org/name`` as curl sends it,
    and ``org%2Fname`` as the openai client does."""
    config = models_in(tmp_path, tiny_model, m={})
    config["models"]["org/m"] = config["models"].pop("m")
    with router(config, llama_server, tmp_path) as (served, _):
        for path in ("/v1/models/org/m", "/v1/models/org%2Fm"):
            status, body, _ = call(served.url, path)
            assert status == 200 and body["id"] == "org/m", (path, body)
        status, body, _ = call(served.url, "/v1/models/org/other")
        assert status == 404 and body["error"]["type"] == "model_not_found", body


def test_another_program_on_a_crashed_servers_port_gets_no_request(
    llama_server: str, tiny_model: Path, tmp_path: Path
) -> None:
    """kill -9 of a model's llama-server, whose port another program takes at once: while
    the server (behind a wrapper that starts it late) is restarted, requests get 503, and
    then its answers, never the other program's."""
    from router_kit import Impostor, slow_binder

    binary = slow_binder(tmp_path / "bin", llama_server, delay_s=1.0)
    config = models_in(tmp_path, tiny_model, m={})
    with router(config, binary, tmp_path) as (served, seen):
        assert call(served.url, "/v1/chat/completions", chat("m"))[0] == 200
        [server] = servers(tmp_path)
        port = call(served.url, "/models/status")[1]["models"][0]["replicas"][0]["url"]
        with Impostor(int(port.rsplit(":", 1)[1])) as other:
            server.kill()
            other.listening()
            answers: list[tuple[int, object]] = []

            def answered() -> bool:
                status, body, _ = call(served.url, "/v1/chat/completions", chat("m"))
                answers.append((status, body))
                return status == 200

            wait_for(answered, "the restarted server to answer", timeout_s=30)
            assert all("IMPOSTOR" not in json.dumps(body) for _, body in answers), answers
            assert {status for status, _ in answers} <= {200, 502, 503}, answers
            [replica] = call(served.url, "/models/status")[1]["models"][0]["replicas"]
            assert replica["url"] != port and replica["up"]
            assert any(f"was taken by pid {other.pid}" in m for m in seen.messages)
