"""Hostile or broken inputs: each is refused at once with one line, never a traceback, a
hang or unbounded memory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fault_cli import Launch, finish

CUDA = {
    "vendor": "nvidia", "index": 0, "name": "NVIDIA H100", "pci_bus_id": "0000:01:00.0",
    "uuid": "GPU-11111111-2222-3333-4444-555555555555", "memory_total_bytes": 80 * 2**30,
}  # fmt: skip


def document(tmp_path: Path, *devices: dict[str, object]) -> str:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"schema": "xpulaunch.inventory/1", "devices": list(devices)}))
    return str(path)


def one_line_error(
    launch: Launch, *args: str, timeout_s: float = 60, env: dict[str, str] | None = None
) -> str:
    code, out, err = finish(launch(*args, env=env), timeout_s=timeout_s)
    assert code != 0, out
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xpulaunch: error: "), err[-3000:]
    assert len(lines[0]) < 1200
    return lines[0]


def test_an_endless_inventory_is_refused(launch: Launch) -> None:
    line = one_line_error(launch, "run", "--dry-run", "--inventory", "/dev/zero", "true")
    assert "not a regular file" in line


def test_a_fifo_inventory_does_not_block(launch: Launch, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = one_line_error(launch, "devices", "--inventory", str(fifo), timeout_s=30)
    assert "not a regular file" in line


def test_a_huge_inventory_is_refused(launch: Launch, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (5 * 2**20) + b"{}")
    assert "larger than 4 MiB" in one_line_error(launch, "devices", "--inventory", str(big))


@pytest.mark.parametrize(
    ("text", "why"),
    [("[" * 100_000, "nested too deeply"), ('{"a": ' + "9" * 5000 + "}", "not valid JSON")],
)
def test_pathological_json_is_one_line(launch: Launch, tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert why in one_line_error(launch, "run", "--dry-run", "--inventory", str(path), "true")


def test_a_uuid_with_a_comma_is_refused(launch: Launch, tmp_path: Path) -> None:
    bad = {**CUDA, "uuid": "GPU-aaaa,GPU-bbbb"}
    line = one_line_error(
        launch, "run", "--dry-run", "--inventory", document(tmp_path, bad), "true"
    )
    assert "devices[0].uuid" in line and "comma" in line


def test_tiles_have_an_upper_bound(launch: Launch, tmp_path: Path) -> None:
    bad = {**CUDA, "tiles": 10**9}
    line = one_line_error(
        launch, "run", "--dry-run", "--inventory", document(tmp_path, bad), "true"
    )
    assert "tiles" in line and "<= 64" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpus", "9" * 5000], "--gpus"),
        (["--min-free-memory", "9" * 35 + "G"], "larger than any device"),
        (["--min-free-memory", "1" * 40_000], "is not a size"),
        (["--nproc-per-node", "100000000"], "from 1 to 4096"),
        (["--master-addr", "no-such-host.invalid"], "--master-addr"),
        (["--master-addr", "192.0.2.1"], "cannot listen there"),  # TEST-NET-1: not ours
    ],
)
def test_bad_run_options_are_one_line(
    launch: Launch, tmp_path: Path, args: list[str], expected: str
) -> None:
    inventory = document(tmp_path, CUDA)
    for dry in (["--dry-run"], []):
        line = one_line_error(launch, "run", *dry, "--inventory", inventory, *args, "true")
        assert expected in line


def test_an_unresolvable_llama_host_is_one_line(launch: Launch, tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    line = one_line_error(
        launch, "llama", "--dry-run", "-m", str(model), "--host", "no-such-host.invalid",
        "--llama-backend", "cuda", "--inventory", document(tmp_path, CUDA),
    )  # fmt: skip
    assert "--host" in line and "cannot listen there" in line


# Host names Python's socket module cannot hand to the resolver: it encodes a name to IDNA
# first, and raises UnicodeError or TypeError (not socket.gaierror) for a part between dots
# over 63 characters or bytes that are not UTF-8 (argv and the environment are decoded with
# surrogateescape). From the command line, the environment or a cluster's variables, in a
# dry run or a real one: one line naming the host, never the socket module's traceback.
LONG_HOST = "x" * 64
NOT_UTF8 = os.fsdecode(b"node\xff")
BAD_HOSTS = [
    (("run", "--dry-run", "--gpus", "none", "--master-addr", LONG_HOST, "true"), {}),
    (("run", "--gpus", "none", "--master-addr", NOT_UTF8, "true"), {}),
    (("run", "--gpus", "none", "--metrics-port", "0", "--metrics-host", "é" * 70, "true"), {}),
    (("run", "--gpus", "none", "--nnodes", "2", "--node-rank", "1", "--join-timeout", "5",
      "--rdzv-endpoint", f"{LONG_HOST}:29500", "true"), {}),
    (("run", "--gpus", "none", "--nnodes", "2", "--node-rank", "1", "--join-timeout", "5",
      "true"), {"MASTER_ADDR": LONG_HOST}),
    (("torchrun", "--dry-run", "--gpus", "none", "x.py"), {"PET_MASTER_ADDR": NOT_UTF8}),
    (("run", "--dry-run", "--gpus", "none", "true"), {"XPULAUNCH_METRICS_HOST": LONG_HOST}),
]  # fmt: skip


@pytest.mark.parametrize(("args", "env"), BAD_HOSTS, ids=[str(i) for i in range(len(BAD_HOSTS))])
def test_a_host_the_socket_module_cannot_encode_is_one_line(
    launch: Launch, args: tuple[str, ...], env: dict[str, str]
) -> None:
    line = one_line_error(launch, *args, env=env, timeout_s=30)
    assert "not a host name or address" in line


@pytest.mark.parametrize("command", ["llama", "serve"])
def test_a_llama_host_the_socket_module_cannot_encode_is_one_line(
    launch: Launch, tmp_path: Path, command: str
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    config = tmp_path / "models.toml"
    config.write_text(f'[models.a]\nmodel = "{model}"\n')
    what = ["llama", "--dry-run", "-m", str(model)] if command == "llama" else [
        "llama", "serve", "--config", str(config)]  # fmt: skip
    line = one_line_error(
        launch, *what, "--host", LONG_HOST, "--binary", "/bin/true", "--llama-backend", "cpu",
        "--inventory", document(tmp_path), timeout_s=30,
    )  # fmt: skip
    assert "--host" in line and "not a host name or address" in line


# Numbers that str.isdigit() takes but int() refuses ("²" is a digit to Unicode), and signs
# that a check by hand let through: each a one-line error, never int()'s traceback.
NOT_NUMBERS = [
    ["run", "--dry-run", "--max-restarts", "+-3", "true"],
    ["run", "--dry-run", "--nproc-per-node", "²", "true"],
    ["run", "--dry-run", "--nnodes", "2", "--rdzv-endpoint", "h:²", "true"],
    ["torchrun", "--dry-run", "--nproc-per-node", "²", "x.py"],
    ["cancel", "²"],
    ["cancel", "w²"],
    ["hold", "²"],
    ["logs", "²"],
]


@pytest.mark.parametrize("args", NOT_NUMBERS, ids=[" ".join(a[:3]) for a in NOT_NUMBERS])
def test_a_number_int_cannot_read_is_one_line(
    launch: Launch, tmp_path: Path, args: list[str]
) -> None:
    env = {"XPULAUNCH_LOCK_DIR": str(tmp_path / "locks")}
    line = one_line_error(launch, *args, env=env)
    assert args[-1] in line or args[-2] in line


def test_a_40_kb_input_is_not_echoed_in_full(launch: Launch) -> None:
    line = one_line_error(launch, "run", "--dry-run", "--gpus", "x" * 40_000, "true")
    assert "more characters" in line or "..." in line


@pytest.mark.parametrize("how", ["zero", "fifo", "huge"])
def test_an_accelerate_config_that_is_no_file_is_refused_at_once(
    launch: Launch, tmp_path: Path, how: str
) -> None:
    path = tmp_path / "accelerate.yaml"
    if how == "zero":
        path.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b"# " + b"x" * (5 * 2**20) + b"\n")
    for args in (["--dry-run", "--gpus", "none"], ["--gpus", "none"]):
        line = one_line_error(
            launch, "run", *args, "--accelerate-config", str(path), "true", timeout_s=30
        )
        assert "--accelerate-config" in line
        assert ("larger than 4 MiB" if how == "huge" else "not a regular file") in line


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("num_processes: two\n", "num_processes: 'two' is not a whole number"),
        ("num_processes: 2.5\n", "num_processes: 2.5 is not a whole number"),
        ("num_processes: true\n", "num_processes: True is not a whole number"),
        ("num_processes: -3\n", "num_processes: -3 is not a whole number of at least 1"),
        ("num_processes: 2\nnum_machines: 0\n", "num_machines: 0 is not a whole number"),
        ("num_processes: '²'\n", "num_processes: '²' is not a whole number"),
        ("num_processes: '--3'\n", "num_processes: '--3' is not a whole number"),
        ("num_processes: 2\nmain_process_port: 'abc'\n", "main_process_port: 'abc'"),
        ("num_processes: 2\nmain_process_port: 99999\n", "from 0 to 65535"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        # Values a real run cannot use: the dry run printed a plan, and the real run died in
        # Popen ("embedded null byte") or in the socket module (a part of a name over 63).
        (
            'fsdp_config:\n  fsdp_version: "2\\0"\n',
            "fsdp_config.fsdp_version: the value holds a NUL",
        ),
        ("num_processes: 1\nmain_process_ip: " + "x" * 64 + "\n", "not a host name or address"),
    ],
)
def test_bad_accelerate_values_are_one_line_naming_the_key(
    launch: Launch, tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "accelerate.yaml"
    head = "" if text.startswith("a:") else "distributed_type: MULTI_CPU\nuse_cpu: true\n"
    path.write_text(head + text)
    line = one_line_error(launch, "run", "--dry-run", "--accelerate-config", str(path), "true")
    assert why in line


# A path the system cannot even look up (one name over 255 bytes: ENAMETOOLONG, which pathlib's
# is_file() and is_dir() raise rather than answer False): in every option and variable that
# names a file or folder, one line, never a traceback. The same class of error as a folder
# closed to the user, which only a second user can show (tests/cli/test_config_files.py).
TOO_LONG = "/tmp/" + "z" * 300
H200 = "tests/fixtures/inventories/2x-h200.json"
REFUSED = [
    (("--gpus", "none", "--log-dir", TOO_LONG, "true"), {}),
    (("--gpus", "none", "--inventory", TOO_LONG, "true"), {}),
    (("--gpus", "none", "--events", TOO_LONG, "true"), {}),
    (("--gpus", "1", "--inventory", H200, "--lock-dir", TOO_LONG, "true"), {}),
    (("--gpus", "1", "--inventory", H200, "true"), {"XPULAUNCH_LOCK_DIR": TOO_LONG}),
    (("--gpus", "none", TOO_LONG), {}),
    (("--gpus", "none", "--accelerate-config", TOO_LONG, "true"), {}),
    (("--gpus", "none", "--accelerate-config", "default", "true"), {"HF_HOME": TOO_LONG}),
    (("logs", TOO_LONG), {}),
    (("devices", "--inventory", TOO_LONG), {}),
    (("llama", "-m", TOO_LONG, "--dry-run"), {}),
    (("llama", "serve", "--config", TOO_LONG), {}),
    (("submit", "--lock-dir", TOO_LONG, "--inventory", H200, "--", "true"), {}),
    (("queue", "--lock-dir", TOO_LONG), {}),
]


IDS = [f"{i}-{args[0]}" for i, (args, _) in enumerate(REFUSED)]


@pytest.mark.parametrize(("args", "env"), REFUSED, ids=IDS)
def test_a_path_the_system_cannot_look_up_is_one_line(
    launch: Launch, args: tuple[str, ...], env: dict[str, str]
) -> None:
    assert "z" * 300 in one_line_error(launch, *args, env=env).replace("...", "")


def test_a_config_home_the_system_cannot_look_up_is_a_warning(launch: Launch) -> None:
    code, _, err = finish(launch("--gpus", "none", "true", env={"XDG_CONFIG_HOME": TOO_LONG}))
    assert code == 0, err
    assert err.startswith(f"xpulaunch: warning: cannot look for {TOO_LONG}/xpulaunch/config.toml")
    assert "Traceback" not in err
