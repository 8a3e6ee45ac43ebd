"""``xpulaunch llama`` through the installed entry point.

Dry runs use stand-in binaries that answer ``--list-devices`` like a CUDA, SYCL, ROCm or
Vulkan build (those GPUs cannot exist here) against inventories of such hosts. The other
tests run the real llama-server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import inventory_path
from xpulaunch.llamacpp.health import health_status

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def xpulaunch(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XPULAUNCH, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


@pytest.fixture(autouse=True)
def _model_here(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.gguf`` in the working directory: a dry run reads the model too (its size)."""
    (tmp_path / "model.gguf").symlink_to(tiny_model)
    monkeypatch.chdir(tmp_path)


def dry_plan(binary: str, inventory: str, *extra: str) -> dict[str, Any]:
    done = xpulaunch("llama", "-m", "model.gguf", "--binary", binary, "--inventory",
                     str(inventory_path(inventory)), "--dry-run", "--json", *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def arg(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("xpulaunch: error:")]


@pytest.mark.parametrize(
    ("kind", "inventory", "device_args", "mask"),
    [
        ("cuda", "2x-h200.json", ["CUDA0", "CUDA0"], "CUDA_VISIBLE_DEVICES"),
        ("sycl", "2x-max1550.json", ["SYCL0", "SYCL0"], "ZE_AFFINITY_MASK"),
        ("rocm", "4x-mi300x.json", ["ROCm0", "ROCm0"], "ROCR_VISIBLE_DEVICES"),
        ("vulkan", "2x-h200.json", ["Vulkan0", "Vulkan1"], None),
    ],
)
def test_two_replicas_planned_on_two_devices_per_build(
    fake_build: Callable[[str], str],
    kind: str,
    inventory: str,
    device_args: list[str],
    mask: str | None,
) -> None:
    binary = fake_build(kind)
    plan = dry_plan(binary, inventory, "--gpus", "2", "--replicas", "2", "--", "-c", "4096")
    workers = plan["workers"]
    assert [w["devices"] for w in workers] == [[0], [1]]  # disjoint units
    keys = [(d["pci_bus_id"], d["tile"]) for d in plan["devices"]]
    assert len(set(keys)) == 2
    ports = [arg(w["argv"], "--port") for w in workers]
    assert len(set(ports)) == 2 and all(p and p.isdigit() for p in ports)
    assert [arg(w["argv"], "--device") for w in workers] == device_args
    for worker in workers:
        assert worker["argv"][0] == binary and worker["argv"][-2:] == ["-c", "4096"]
        assert "RANK" not in worker["env"] and "MASTER_PORT" not in worker["env"]
    if mask is not None:
        values = [w["env"][mask] for w in workers]
        assert len(set(values)) == 2 and all(values)
    if kind == "sycl":
        assert all(w["env"]["ONEAPI_DEVICE_SELECTOR"] == "level_zero:gpu" for w in workers)
        assert all(w["env"]["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT" for w in workers)
    name = {"cuda": "CUDA", "sycl": "SYCL", "rocm": "ROCm", "vulkan": "Vulkan"}[kind]
    assert f"llama-server is a {name} build (--list-devices)" in plan["notes"]


def test_text_dry_run_names_each_replica_url(fake_build: Callable[[str], str]) -> None:
    done = xpulaunch("llama", "-m", "model.gguf", "--binary", fake_build("cuda"), "--inventory",
                     str(inventory_path("2x-h200.json")), "--gpus", "2", "--port", "8100",
                     "--replicas", "2", "--dry-run")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "replica 0: http://127.0.0.1:8100 (fixed port)" in done.stdout
    assert "replica 1: http://127.0.0.1:8101 (fixed port)" in done.stdout
    assert "llama-server is a CUDA build (--list-devices)" in done.stdout


def test_cpu_build_refuses_gpus_in_one_line(fake_build: Callable[[str], str]) -> None:
    done = xpulaunch("llama", "-m", "model.gguf", "--binary", fake_build("none"), "--inventory",
                     str(inventory_path("2x-h200.json")), "--gpus", "2", "--dry-run")  # fmt: skip
    assert done.returncode == 2
    assert error_lines(done.stderr) == done.stderr.splitlines()
    assert "this llama-server is a CPU build" in done.stderr
    # how to preview a GPU plan with it (the setup installs a CPU build)
    assert "--dry-run --llama-backend cuda" in done.stderr


def test_a_gpu_plan_previewed_with_a_cpu_build_asks_no_fit_tool(
    llama_server: str, tiny_model: Path
) -> None:
    """``--llama-backend cuda`` with the CPU llama-server: its llama-fit-params used to be
    asked about CUDA0, and the plan said ``llama-fit-params failed ... invalid device``."""
    h200 = str(inventory_path("2x-h200.json"))
    args = ["--binary", llama_server, "--inventory", h200, "--gpus", "2", "--llama-backend", "cuda"]
    done = xpulaunch("llama", "-m", str(tiny_model), *args, "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert not any("failed" in n or "invalid device" in n for n in notes), notes
    skipped = "llama-fit-params not asked: this llama-server lists no cuda device"
    assert any(n.startswith(skipped) for n in notes), notes
    assert any(n.startswith("model needs about") for n in notes), notes


def test_dry_run_for_another_machine_needs_the_build_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-llama-server")
    inventory = str(inventory_path("2x-h200.json"))
    done = xpulaunch("llama", "-m", "model.gguf", "--binary", missing, "--inventory", inventory,
                     "--dry-run")  # fmt: skip
    assert done.returncode == 127 and "give --llama-backend" in done.stderr
    assert len(error_lines(done.stderr)) == 1
    done = xpulaunch("llama", "-m", "model.gguf", "--binary", missing, "--inventory", inventory,
                     "--llama-backend", "cuda", "--gpus", "1", "--dry-run", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["workers"][0]["argv"][0] == missing
    assert any("no such executable file here" in n for n in plan["notes"])
    # The model is read in a dry run too (its size decides the devices): missing is an error.
    done = xpulaunch("llama", "-m", "other.gguf", "--binary", missing, "--inventory", inventory,
                     "--llama-backend", "cuda", "--dry-run")  # fmt: skip
    assert done.returncode == 2
    assert error_lines(done.stderr) == [
        "xpulaunch: error: --model other.gguf: no such file; expected the path of a .gguf file"
    ]


def test_json_needs_dry_run(fake_build: Callable[[str], str], tiny_model: Path) -> None:
    done = xpulaunch("llama", "-m", str(tiny_model), "--binary", fake_build("none"), "--json",
                     "--inventory", str(inventory_path("cpu-only.json")))  # fmt: skip
    assert done.returncode == 2 and error_lines(done.stderr) == done.stderr.splitlines()


def test_a_cpu_dry_run_never_reads_the_lock_directory(
    fake_build: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a real run: a plan that leases nothing does not look at the leases, so a lock
    directory it could not use (here a private one writable by all) does not stop it; a
    plan on this host's probe, not on an --inventory file (whose leases are another host's)."""
    unsafe = tmp_path / "run" / "xpulaunch"
    unsafe.mkdir(parents=True)
    unsafe.chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(unsafe.parent))
    monkeypatch.delenv("XPULAUNCH_LOCK_DIR", raising=False)
    done = xpulaunch("llama", "-m", "model.gguf", "--binary", fake_build("none"), "--dry-run",
                     "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "cpu"


# --- the real llama-server -------------------------------------------------------------


def leftovers(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (a per-test model path)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if any(marker in part for part in cmdline) and proc.info["status"] != "zombie":
            found.append(proc)
    return found


@pytest.fixture
def model_link(tiny_model: Path, tmp_path: Path) -> Path:
    """The tiny model under a path unique to this test, to find its processes by."""
    link = tmp_path / "this-test-model.gguf"
    link.symlink_to(tiny_model)
    return link


@pytest.mark.llama
def test_missing_model_is_one_line_and_starts_nothing(llama_server: str, tmp_path: Path) -> None:
    model = tmp_path / "missing-model.gguf"
    done = xpulaunch("llama", "-m", str(model), "--binary", llama_server)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"xpulaunch: error: --model {model}: no such file; expected the path of a .gguf file"
    ]
    assert not leftovers(str(model))


@pytest.mark.llama
@pytest.mark.slow
def test_explicit_busy_port_is_one_clear_error(llama_server: str, model_link: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = xpulaunch("llama", "-m", str(model_link), "--binary", llama_server,
                         "--port", str(port), "--", "-c", "256")  # fmt: skip
    assert done.returncode == 1
    [line] = error_lines(done.stderr)  # it names who holds the port: this test's process
    assert line.startswith(
        f"xpulaunch: error: port {port} on 127.0.0.1 is already in use by pid {os.getpid()} ("
    ), line
    assert line.endswith(
        ") (llama-server: couldn't bind HTTP server socket); choose another --port, or leave "
        "--port out for free ports"
    ), line
    assert done.stderr.splitlines()[-1].startswith("xpulaunch: error:")
    assert not leftovers(str(model_link))


@pytest.mark.llama
@pytest.mark.slow
def test_broken_model_shows_llama_servers_reason(llama_server: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken-model.gguf"
    broken.write_bytes(b"not a gguf file at all")
    done = xpulaunch("llama", "-m", str(broken), "--binary", llama_server, "--", "-c", "256")
    assert done.returncode == 1
    (line,) = error_lines(done.stderr)
    assert "llama-server 0 exited with code 1 before it was ready" in line
    assert "gguf" in line.lower()
    assert "xpulaunch:   [0]" in done.stderr  # the log's last lines are shown above it
    assert not leftovers(str(broken))


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_serves_two_replicas_restarts_one_and_stops_on_ctrl_c(
    llama_server: str, model_link: Path
) -> None:
    proc = subprocess.Popen(
        [XPULAUNCH, "llama", "-m", str(model_link), "--binary", llama_server, "--replicas", "2",
         "--backoff", "0.1", "--", "-c", "256", "-t", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        urls = read_ready_urls(proc, 2, timeout_s=30)
        for url in urls:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            assert health_status(host, int(port), 2.0) == 200
        servers = [p for p in leftovers(str(model_link)) if p.name() == "llama-server"]
        assert len(servers) == 2
        servers[0].kill()  # restarted by default (--restart always), on its own port
        (again,) = read_ready_urls(proc, 1, timeout_s=30)
        assert again in urls
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not leftovers(str(model_link))


def read_ready_urls(proc: subprocess.Popen[str], count: int, timeout_s: float) -> list[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    urls: list[str] = []
    while len(urls) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if " ready at " in line:
            urls.append(line.split(" ready at ")[1].split()[0])
    assert len(urls) == count, f"only {urls} became ready"
    return urls


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_two_quick_ctrl_cs_while_the_console_is_blocked_exit_at_once(
    llama_server: str, model_link: Path, tmp_path: Path
) -> None:
    """The second SIGINT comes while the first one's message cannot be written (a full
    stderr pipe, as with a paused terminal). A handler that took the console's lock then
    deadlocked on the second signal; handlers now only post, and the loop prints."""
    err_r, err_w = os.pipe()
    proc = subprocess.Popen(
        [XPULAUNCH, "llama", "-m", str(model_link), "--binary", llama_server, "--grace", "30",
         "--", "-c", "256", "-t", "1"],
        stdout=subprocess.PIPE, stderr=err_w, text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)},
    )  # fmt: skip
    os.set_blocking(err_r, False)
    err = bytearray()
    try:
        wait_ready_draining(proc, err_r, err, timeout_s=30)
        err += drain(err_r)
        fill_pipe(err_w)  # every write to stderr blocks from now on
        os.close(err_w)
        err_w = -1
        assert not blocked_writing(proc.pid)
        proc.send_signal(signal.SIGINT)
        # Once its "stopping" line is stuck in write(), the first SIGINT was handled: the
        # second one cannot merge with it (a pending signal is not queued twice).
        deadline = time.monotonic() + 10
        while not blocked_writing(proc.pid):
            assert time.monotonic() < deadline, "the first SIGINT never wrote its line"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)  # handled while the first line is still stuck (where it deadlocked)
        deadline = time.monotonic() + 20  # far below the 30 s grace
        while proc.poll() is None and time.monotonic() < deadline:
            err += drain(err_r)
            time.sleep(0.02)
        assert proc.poll() is not None, "xpulaunch hung after two SIGINTs"
        err += drain(err_r)
    finally:
        if err_w >= 0:
            os.close(err_w)
        os.close(err_r)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    text = err.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGINT, text[-2000:]
    assert "Traceback" not in text
    assert "xpulaunch: SIGINT: stopping llama-server (again to kill at once)" in text
    # No "killing every llama-server now" is required: the loop no longer waits for the
    # console, so the first SIGINT may have stopped the server before the second came.
    assert not leftovers(str(model_link))


def drain(fd: int) -> bytes:
    """Everything a non-blocking pipe holds now."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def blocked_writing(pid: int) -> bool:
    """True while a thread of ``pid`` waits in write() on a full pipe (``/proc`` wchan)."""
    waits = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # it or a thread ended
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                waits.append((task / "wchan").read_text())
    return any("pipe_write" in wait for wait in waits)  # anon_pipe_write on newer kernels


def fill_pipe(fd: int) -> None:
    """Fill the pipe whose write end is ``fd`` until a write would block."""
    # A new open file description of the same pipe: O_NONBLOCK set on ``fd`` itself would
    # also make xpulaunch's inherited stderr non-blocking (the flag is shared).
    filler = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
    try:
        for size in (4096, 1):
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(filler, b"." * size)
    finally:
        os.close(filler)


def wait_ready_draining(
    proc: subprocess.Popen[str], err_fd: int, err: bytearray, timeout_s: float
) -> None:
    """Read stdout until the ready line while keeping the stderr pipe drained."""
    import selectors

    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            for key, _ in selector.select(0.1):
                if key.fileobj is proc.stdout:
                    line = proc.stdout.readline()
                    assert line, f"xpulaunch ended before ready: {err.decode()[-2000:]}"
                    if " ready at " in line:
                        return
                else:
                    err += drain(err_fd)
    pytest.fail(f"not ready after {timeout_s} s: {err.decode()[-2000:]}")


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_metrics_relabel_each_replicas_own_metrics(llama_server: str, model_link: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [XPULAUNCH, "llama", "-m", str(model_link), "--binary", llama_server, "--replicas", "2",
         "--metrics-port", str(port), "--", "-c", "256", "-t", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        read_ready_urls(proc, 2, timeout_s=30)
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        replicas = {s.labels["replica"] for s in samples if s.name.startswith("llamacpp:")}
        assert replicas == {"0", "1"}
        models = {s.labels["model"] for s in samples if s.name.startswith("llamacpp:")}
        assert models == {model_link.name}
        up = {s.labels["worker"]: s.value for s in samples if s.name == "xpulaunch_worker_up"}
        assert up == {"0": 1, "1": 1}
        scraped = [s.value for s in samples if s.name == "xpulaunch_replica_scrape_ok"]
        assert scraped == [1, 1]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_dry_run_skips_a_gpu_leased_here_also_with_an_inventory(
    fake_build: Callable[[str], str],
) -> None:
    """The real run with that --inventory honours this host's leases; so does its dry run."""
    from xpulaunch.core.plan import LaunchRequest, make_plan
    from xpulaunch.launch.plan import load_inventory
    from xpulaunch.leases import LeaseManager

    inventory = load_inventory(inventory_path("2x-h200.json"))
    request = LaunchRequest(argv=("x",), gpus="device=0", master_port=29555)
    manager = LeaseManager(os.environ["XPULAUNCH_LOCK_DIR"])
    _, lease = manager.allocate(lambda held: make_plan(request, inventory, {}, unavailable=held))
    with lease:
        plan = dry_plan(fake_build("cuda"), "2x-h200.json", "--gpus", "1")
    assert [d["index"] for d in plan["devices"]] == [1]
    assert any("leased by pid" in note for note in plan["notes"])
