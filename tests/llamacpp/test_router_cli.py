"""``xpulaunch llama serve`` through the installed entry point: one line for every bad
config, the dry run, ``--status`` without a router, a busy port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from router_kit import cuda_shim

from helpers import inventory_path, one_line_error

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


def xpulaunch(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([XPULAUNCH, *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)  # fmt: skip


@pytest.fixture
def model(tmp_path: Path, tiny_model: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.symlink_to(tiny_model)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[models.a\n", "models.toml: not valid TOML: "),
        ('[models.a]\nmodel = "m.gguf"\nreplica = 2\n', "[models.a]: unknown key 'replica'"),
        ('[models.a]\nmodel = "nope.gguf"\n', "[models.a] model {dir}/nope.gguf: no such file"),
        ('[models.a]\nmodel = "m.gguf"\nttl = "10m"\n', "[models.a] ttl: expected seconds"),
        ("[other]\n", "unknown top-level key 'other'; expected [models.ID], [groups.ID]"),
        # The id names its log folder: one that leads out of --log-dir is refused.
        ('[models."../../escaped"]\nmodel = "m.gguf"\n', "{dir}/models.toml: [models.../../e"),
        # The keys of other engines, env, preload, concurrency, and [serve].
        (
            '[models.a]\ncmd = "x --port ${PORT}"\nmax_concurency = 2\n',
            "[models.a]: unknown key 'max_concurency'; did you mean 'max_concurrency'?",
        ),
        (
            '[serve]\napi_key = ["k"]\n[models.a]\nmodel = "m.gguf"\n',
            "[serve]: unknown key 'api_key'; did you mean 'api_keys'?",
        ),
        (
            '[sevre]\n[models.a]\nmodel = "m.gguf"\n',
            "unknown top-level key 'sevre'; did you mean 'serve'?",
        ),
        (
            '[models.a]\ncmd = "no-such-engine-xyz --port ${PORT}"\n',
            "[models.a] cmd: 'no-such-engine-xyz' is not an executable program on PATH (checked "
            "when the router starts)",
        ),
        (
            '[models.a]\ncmd = "python3 e.py"\n',
            "[models.a] cmd: no ${{PORT}}; the router chooses the port",
        ),
        (
            '[models.a]\ncmd = "python3 \'e.py --port ${PORT}"\n',
            "[models.a] cmd: cannot be split into words (No closing quotation)",
        ),
        (
            '[models.a]\ncmd = "python3 --port ${PORT}"\nmodel = "m.gguf"\n',
            "[models.a] model: goes with llama-server; a cmd engine takes its own command line",
        ),
        ('[models.a]\nmodel = "m.gguf"\ncheck = "/ready"\n', "[models.a] check: goes with cmd"),
        (
            '[models.a]\nmodel = "m.gguf"\nmemory = "lots"\n',
            "[models.a] memory: 'lots' is not a size",
        ),
        (
            '[models.a]\nmodel = "m.gguf"\nmax_queue = 3\n',
            "[models.a] max_queue: goes with max_concurrency",
        ),
        (
            '[models.a]\nmodel = "m.gguf"\nmax_concurrency = 0\n',
            "[models.a] max_concurrency: expected a whole number >= 1, got 0",
        ),
        (
            '[models.a]\nmodel = "m.gguf"\nenv = { A = true }\n',
            "[models.a] env A: expected text or a number, got True",
        ),
        ('[models.a]\nmodel = "m.gguf"\npreload = "yes"\n', "[models.a] preload: expected true"),
        (
            '[serve]\napi_keys = ["sk secret"]\n[models.a]\nmodel = "m.gguf"\n',
            "[serve] api_keys: a key must be non-empty printable text without spaces",
        ),
        (
            '[serve]\ncors = ["app.example"]\n[models.a]\nmodel = "m.gguf"\n',
            '[serve] cors: expected origins such as "https://app.example" or "*"',
        ),
    ],
)
def test_a_bad_config_is_one_line(model: Path, tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "models.toml"
    config.write_text(text)
    done = xpulaunch("llama", "serve", "--config", str(config), "--inventory",
                     str(inventory_path("cpu-only.json")))  # fmt: skip
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert message.format(dir=tmp_path) in line, line
    assert "secret" not in done.stderr  # an API key is never shown


def test_config_is_needed_and_json_goes_with_dry_run(model: Path, tmp_path: Path) -> None:
    done = xpulaunch("llama", "serve")
    assert done.returncode == 2 and "--config FILE is needed" in one_line_error(done.stderr)
    config = tmp_path / "models.toml"
    config.write_text(f'[models.a]\nmodel = "{model}"\n')
    done = xpulaunch("llama", "serve", "--config", str(config), "--json", "--inventory",
                     str(inventory_path("cpu-only.json")))  # fmt: skip
    assert done.returncode == 2 and "--json goes with --dry-run" in one_line_error(done.stderr)


def test_status_without_a_router_is_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there
    done = xpulaunch("llama", "serve", "--status", "--port", str(port))
    assert done.returncode == 2
    assert f"no model router answers at http://127.0.0.1:{port}/models/status" in one_line_error(
        done.stderr
    )


@pytest.mark.parametrize("how", ["zero", "fifo", "huge"])
def test_a_config_that_is_no_file_is_refused_at_once(tmp_path: Path, how: str) -> None:
    """A FIFO blocked the open and /dev/zero was read for ever (both hung, the second eating
    memory): the file is read as the inventory and accelerate configs are."""
    config = tmp_path / "models.toml"
    if how == "zero":
        config.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(config)
    else:
        config.write_bytes(b"# " + b"x" * (5 * 2**20) + b"\n")
    done = xpulaunch("llama", "serve", "--config", str(config), "--dry-run", timeout_s=30)
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert f"--config {config}: " in line
    assert ("larger than 4 MiB" if how == "huge" else "not a regular file") in line


def _answering(answer: bytes) -> tuple[int, threading.Thread]:
    """A one-request server on a free port that sends ``answer`` whatever it is asked."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, listener.accept()[0] as connection:
            connection.recv(65536)
            connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


JSON_LIST = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[1, 2]"


@pytest.mark.parametrize(
    ("answer", "words"),
    [(b"garbage\r\n\r\n", "no model router answers"), (JSON_LIST, "not an xpulaunch model router")],
)
def test_status_of_something_else_on_the_port_is_one_line(answer: bytes, words: str) -> None:
    """Not an HTTP server (http.client.BadStatusLine), or one that answers other JSON: both
    were tracebacks."""
    port, thread = _answering(answer)
    done = xpulaunch("llama", "serve", "--status", "--port", str(port), timeout_s=30)
    thread.join(timeout=10)
    assert done.returncode == 2
    assert words in one_line_error(done.stderr)


def test_status_of_a_host_no_url_can_hold_is_one_line() -> None:
    done = xpulaunch("llama", "serve", "--status", "--host", "a b")  # http.client.InvalidURL
    assert done.returncode == 2
    assert "no model router answers at http://a b:8080" in one_line_error(done.stderr)


@pytest.mark.llama
def test_the_dry_run_plans_each_model_with_its_estimate(
    model: Path, tmp_path: Path, llama_server: str
) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        f'[models.small]\nmodel = "{model}"\nargs = ["-c", "4096"]\n'
        f'[models.pair]\nmodel = "{model}"\nreplicas = 2\ngpus = "2"\n'
    )
    binary = cuda_shim(tmp_path / "bin", llama_server)
    inventory = str(inventory_path("2x-h200.json"))
    done = subprocess.run(
        [XPULAUNCH, "llama", "serve", "--config", str(config), "--binary", binary,
         "--inventory", inventory, "--dry-run", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "FAKE_LLAMA_INVENTORY": inventory},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plans = json.loads(done.stdout)["models"]
    assert len(plans["small"]["devices"]) == 1 and len(plans["pair"]["workers"]) == 2
    small = plans["small"]["workers"][0]["argv"]
    assert small[small.index("--alias") + 1] == "small" and "--metrics" in small
    assert any(
        n.startswith("model needs about ") and "-c 4096" in n for n in plans["small"]["notes"]
    )
    assert any("the fewest free devices that hold the model: 1" in n
               for n in plans["small"]["notes"])  # fmt: skip
    # gpus auto: packed beside other models, a share of the GPU by its estimate; gpus "2"
    # asks for devices, whole.
    assert plans["small"]["share"]["gpu_memory_bytes"] > 2**30
    assert plans["pair"]["share"] is None


@pytest.mark.parametrize(
    ("inventory", "mask"),
    [
        ("2x-h200.json", "CUDA_VISIBLE_DEVICES"),
        ("2x-max1550.json", "ZE_AFFINITY_MASK"),
        ("4x-mi300x.json", "ROCR_VISIBLE_DEVICES"),
    ],
)
def test_the_dry_run_of_a_cmd_engine_writes_the_mask_of_its_vendor(
    tmp_path: Path, inventory: str, mask: str
) -> None:
    config = tmp_path / "models.toml"
    config.write_text('[models.eng]\ncmd = "python3 -m x --port ${PORT}"\nmemory = "6GiB"\n')
    args = ["--inventory", str(inventory_path(inventory)), "--dry-run", "--json"]
    done = xpulaunch("llama", "serve", "--config", str(config), *args)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["models"]["eng"]
    assert len(plan["devices"]) == 1 and mask in plan["workers"][0]["env"]
    assert "python3 needs 6.0 GiB (its memory in models.toml)" in plan["notes"]


def test_a_cmd_engine_without_memory_gets_one_whole_device_per_replica(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text('[models.eng]\ncmd = "python3 -m x --port ${PORT}"\n')
    args = ["--inventory", str(inventory_path("8x-h100.json")), "--dry-run", "--json"]
    done = xpulaunch("llama", "serve", "--config", str(config), *args)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["models"]["eng"]
    assert len(plan["devices"]) == 1, plan["devices"]
    assert any(n.startswith("gpus auto without memory: one whole device") for n in plan["notes"])
    config.write_text('[models.eng]\ncmd = "python3 -m x --port ${PORT}"\ngpus = "none"\n')
    done = xpulaunch("llama", "serve", "--config", str(config), *args)
    assert done.returncode == 0 and not json.loads(done.stdout)["models"]["eng"]["devices"]


def test_the_dry_run_of_a_cmd_engine_shows_its_command_line_and_masks(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        '[models.eng]\ncmd = "python3 -m vllm_like --port ${PORT} --served ${MODEL}"\n'
        'memory = "6GiB"\nenv = { ENGINE_SETTING = "1" }\n[serve]\napi_keys = ["sk-hidden1"]\n'
    )
    inventory = str(inventory_path("2x-h200.json"))
    args = ["--inventory", inventory, "--dry-run", "--json", "--api-key", "sk-hidden2"]
    done = xpulaunch("llama", "serve", "--config", str(config), *args)
    assert done.returncode == 0, done.stderr
    (worker,) = json.loads(done.stdout)["models"]["eng"]["workers"]
    assert worker["argv"][:3] == ["python3", "-m", "vllm_like"]
    assert worker["argv"][-1] == "eng" and worker["argv"][-3].isdigit()
    assert worker["env"]["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert "sk-hidden" not in done.stdout + done.stderr


@pytest.mark.llama
def test_a_busy_port_is_one_line(model: Path, tmp_path: Path, llama_server: str) -> None:
    config = tmp_path / "models.toml"
    config.write_text(f'[models.a]\nmodel = "{model}"\n')
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = xpulaunch("llama", "serve", "--config", str(config), "--port", str(port),
                         "--binary", llama_server, "--inventory",
                         str(inventory_path("cpu-only.json")))  # fmt: skip
    assert done.returncode == 2
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in one_line_error(done.stderr)


def test_llama_still_takes_its_own_arguments_and_names_serve() -> None:
    done = xpulaunch("llama", "--help")
    assert done.returncode == 0 and "xpulaunch llama serve --config models.toml" in done.stdout
    done = xpulaunch("llama", "serve", "--help")
    assert done.returncode == 0 and "Usage: xpulaunch llama serve [OPTIONS]" in done.stdout


@pytest.mark.llama
def test_a_memory_that_fits_nowhere_is_one_line(
    model: Path, tmp_path: Path, llama_server: str
) -> None:
    config = tmp_path / "models.toml"
    config.write_text(f'[models.huge]\nmodel = "{model}"\nmemory = "500GiB"\n')
    binary = cuda_shim(tmp_path / "bin", llama_server)
    inventory = str(inventory_path("2x-h200.json"))
    done = subprocess.run(
        [XPULAUNCH, "llama", "serve", "--config", str(config), "--binary", binary,
         "--inventory", inventory, "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "FAKE_LLAMA_INVENTORY": inventory},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = one_line_error(done.stderr)
    assert "[models.huge] memory 500.0 GiB: more than every GPU here together" in line, line
