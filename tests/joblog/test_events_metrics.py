"""--events (the exact sequence of a run), --restart always, and --metrics-port."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import inventory_path, wait_for
from run_kit import read_events, xpulaunch
from xpulaunch.events import Event
from xpulaunch.joblog.event_stream import SCHEMA, EventStream, event_name
from xpulaunch.joblog.logs import LogConfig
from xpulaunch.joblog.prometheus import relabel, render, render_relabelled
from xpulaunch.supervisor.restart import RestartPolicy
from xpulaunch.supervisor.supervisor import Supervisor, WorkerSpec


def test_the_events_of_one_crash_and_one_restart(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    stream = tmp_path / "events.jsonl"
    done = xpulaunch("--events", str(stream), "--max-restarts", "1", "--backoff", "0",
                     script("crash_once.py"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = read_events(stream)
    assert [e["event"] for e in events] == [
        "lease_acquired", "started", "ready", "exited", "restarting", "started", "ready",
        "exited", "stopped", "lease_released",
    ]  # fmt: skip
    assert all(e["schema"] == SCHEMA and str(e["time"]).endswith("Z") for e in events)
    crash, finish = [e for e in events if e["event"] == "exited"]
    assert crash["exit_code"] == 1 and crash["signal"] is None and not crash["expected"]
    assert crash["root_cause"]["type"] == "RuntimeError"  # type: ignore[index]
    assert finish["exit_code"] == 0 and finish["root_cause"] is None
    restart = next(e for e in events if e["event"] == "restarting")
    assert restart["names"] == ["0"] and restart["delay_s"] == 0 and restart["restart"] == 1
    assert [e["attempt"] for e in events if e["event"] == "started"] == [0, 1]
    assert events[-2]["exit_code"] == 0


def test_events_on_stdout_leave_the_workers_output_to_stderr(
    script: Callable[[str], str],
) -> None:
    done = xpulaunch("--events", "-", script("crash_once.py"))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines and all(json.loads(line)["schema"] == SCHEMA for line in lines)
    assert "[0] Traceback (most recent call last):" in done.stderr


def test_restart_always_has_no_limit_by_default(
    script: Callable[[str], str], tmp_path: Path, start: Callable[..., object]
) -> None:
    stream = tmp_path / "events.jsonl"
    proc = start("--events", str(stream), "--restart", "always", "--backoff", "0",
                 script("fails.py"))  # fmt: skip

    def restarts() -> int:
        return len([e for e in read_events(stream) if e["event"] == "restarting"])

    wait_for(lambda: restarts() > 4, 60)  # more than the default limit of 3
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    proc.communicate(timeout=60)  # type: ignore[attr-defined]
    assert not [e for e in read_events(stream) if e["event"] == "gave_up"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return str(answer.read().decode())
    except OSError:
        return None


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_endpoint_parses_as_prometheus_text(
    script: Callable[[str], str], start: Callable[..., object], tmp_path: Path
) -> None:
    port = _free_port()
    inventory = str(inventory_path("2x-h200.json"))
    env = {"XPULAUNCH_INVENTORY": inventory}  # the device probe of the metrics reads it too
    proc = start("--gpus", "1", "--metrics-port", str(port), "--metrics-interval", "1",
                 script("sleeps.py"), env=env)  # fmt: skip
    texts: list[str] = []

    def scraped_devices() -> bool:
        text = _scrape(port)
        texts[:] = [text] if text else []
        return bool(text) and "xpulaunch_device_memory_total_bytes" in str(text)

    wait_for(scraped_devices, 60)
    samples = _samples(texts[0])
    assert samples[("xpulaunch_worker_up", (("worker", "0"),))] == 1
    assert samples[("xpulaunch_worker_restarts_total", (("worker", "0"),))] == 0
    assert samples[("xpulaunch_lease_wait_seconds", ())] == 0
    device = (("index", "0"), ("pci_bus_id", "0000:00:06.0"), ("vendor", "nvidia"))
    assert samples[("xpulaunch_device_memory_total_bytes", device)] == 143771 * 1024**2
    assert not [
        k for k in samples if k[0].startswith("xpulaunch_device") and ("index", "1") in k[1]
    ]  # fmt: skip  (the job's device only)
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    _, err = proc.communicate(timeout=60)  # type: ignore[attr-defined]
    assert f"metrics on http://127.0.0.1:{port}/metrics" in err


def test_a_busy_metrics_port_is_a_one_line_error(script: Callable[[str], str]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = xpulaunch("--metrics-port", str(port), script("sleeps.py"))
    assert done.returncode == 2, done.stderr
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_rendered_and_relabelled_text_parses() -> None:
    labels = (("worker", 'a "quoted"\nname'),)
    text = render([("x_up", "gauge", "help text", [(labels, 1.0), ((), 2.5)]),
                   ("x_empty", "counter", "left out", [])])  # fmt: skip
    theirs = (
        "# HELP llamacpp:tokens a\n# TYPE llamacpp:tokens counter\nllamacpp:tokens 7\n"
        '# HELP llamacpp:slots b\n# TYPE llamacpp:slots gauge\nllamacpp:slots{id="1"} 2\n'
    )
    sources = [relabel(theirs, (("model", "m"), ("replica", r))) for r in ("0", "1")]
    text += render_relabelled(sources)
    samples = _samples(text)
    assert samples[("x_up", (("worker", 'a "quoted"\nname'),))] == 1
    assert samples[("x_up", ())] == 2.5
    # prometheus_client names a counter as OpenMetrics does: ..._total.
    assert samples[("llamacpp:tokens_total", (("model", "m"), ("replica", "0")))] == 7
    assert samples[("llamacpp:slots", (("id", "1"), ("model", "m"), ("replica", "1")))] == 2
    assert "x_empty" not in text
    # Each family is declared once for both replicas, with its type and help kept.
    assert text.count("# TYPE llamacpp:slots gauge") == 1
    assert text.count("# HELP llamacpp:tokens_total a") == 1
    assert text.count("# TYPE llamacpp:tokens_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["llamacpp:slots"].type == "gauge"
    assert len(families["llamacpp:slots"].samples) == 2


def test_a_label_from_a_path_that_is_not_utf8_is_scraped() -> None:
    # os.fsdecode(b"model-\xff.gguf"), a model file's name: encoding the scrape used to raise
    model = os.fsdecode(b"model-\xff.gguf")
    text = render([("x_up", "gauge", "h", [((("model", model),), 1.0)])])
    theirs = relabel("# TYPE t gauge\nt 2\n", (("model", model),))
    text += render_relabelled([theirs])
    samples = _samples(text.encode().decode())
    assert samples[("x_up", (("model", "model-?.gguf"),))] == 1
    assert samples[("t", (("model", "model-?.gguf"),))] == 2


def test_a_label_of_ours_that_the_exporter_has_too_is_kept_as_exported() -> None:
    """The old line relabelling wrote model="m",model="x": an invalid scrape."""
    theirs = '# TYPE x gauge\nx{model="their-name",slot="0"} 1\nuntyped_one 5\n'
    text = render_relabelled([relabel(theirs, (("model", "m"),))])
    samples = _samples(text)
    assert samples[("x", (("exported_model", "their-name"), ("model", "m"), ("slot", "0")))] == 1
    assert samples[("untyped_one", (("model", "m"),))] == 5
    for line in text.splitlines():
        if not line.startswith("#"):
            names = [part.split("=")[0] for part in line.split("{")[1].split("}")[0].split(",")]
            assert len(names) == len(set(names)), line
    with pytest.raises(ValueError):
        relabel("this is { not metrics\n", (("model", "m"),))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "-1"], "--metrics-port"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--metrics-port", "0", "--metrics-interval", "0"], "--metrics-interval: '0' is not"),
        (["--events", "/no/such/dir/events.jsonl"], "cannot write it (No such file"),
    ],
)
def test_bad_operations_options(script: Callable[[str], str], args: list[str], message: str):
    done = xpulaunch(*args, script("sleeps.py"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_stream_holds_the_api_objects_field_for_field(
    script: Callable[[str], str], tmp_path: Path
) -> None:
    path = tmp_path / "api.jsonl"
    stream = EventStream(str(path))
    seen: list[Event] = []

    def both(event: Event) -> None:
        seen.append(event)
        stream.write(event)

    spec = WorkerSpec("0", [sys.executable, script("crash_once.py")], dict(os.environ))
    sup = Supervisor([spec], RestartPolicy(max_restarts=1, backoff_initial_s=0.0),
                     logs=LogConfig(console=False), on_event=both,
                     record_dir=tmp_path / "records")  # fmt: skip
    sup.start()
    assert sup.wait(60) == 0
    stream.close()
    written = read_events(path)
    assert [e["event"] for e in written] == [event_name(e) for e in seen]
    for line, event in zip(written, seen, strict=True):
        for field in dataclasses.fields(event):
            value = getattr(event, field.name)
            plain = value.as_dict() if hasattr(value, "as_dict") else value
            expected = list(plain) if isinstance(plain, tuple) else plain
            assert line[field.name] == expected, (event, field.name)
