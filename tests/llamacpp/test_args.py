"""llama-server command lines: offload options, passthrough that wins, tensor split (pure)."""

from __future__ import annotations

import pytest

from xpulaunch.llamacpp.args import (
    Offload,
    passthrough_value,
    server_argv,
    tensor_split,
    user_options,
    with_port,
)
from xpulaunch.model import Device, Unit, Vendor

GIB = 1024**3


def unit(index: int, total_gib: int | None = 80, used_gib: int | None = 0) -> Unit:
    total = None if total_gib is None else total_gib * GIB
    used = None if used_gib is None else used_gib * GIB
    return Unit(Device(Vendor.NVIDIA, index, "NVIDIA H100", f"0000:0{index}:00.0", None,
                       memory_total_bytes=total, memory_used_bytes=used))  # fmt: skip


def argv(names: tuple[str, ...], units: tuple[Unit, ...], passthrough: tuple[str, ...] = (),
         env: dict[str, str] | None = None) -> tuple[str, ...]:  # fmt: skip
    line, _ = server_argv(
        "llama-server", model="m.gguf", host="127.0.0.1", port=8080,
        offload=Offload(names, units), passthrough=passthrough, parent_env=env or {},
    )  # fmt: skip
    return line


def option(line: tuple[str, ...], *names: str) -> list[str]:
    """Every value given to any of ``names`` in ``line``."""
    return [line[i + 1] for i, a in enumerate(line[:-1]) if a in names]


def test_one_device_offloads_everything_without_splitting() -> None:
    line = argv(("CUDA0",), (unit(0),))
    assert line == ("llama-server", "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8080",
                    "--device", "CUDA0", "-ngl", "999", "-sm", "none")  # fmt: skip


def test_several_devices_split_layers_by_free_memory() -> None:
    line = argv(("CUDA0", "CUDA1"), (unit(0, 80, 20), unit(1, 80, 50)))
    assert option(line, "--device") == ["CUDA0,CUDA1"]
    assert option(line, "-sm") == ["layer"]
    assert option(line, "-ts") == ["2,1"]  # 60 GiB and 30 GiB free


def test_the_cpu_offloads_nothing() -> None:
    line = argv((), ())
    assert option(line, "--device") == ["none"]
    assert not option(line, "-ngl", "-sm", "-ts")


@pytest.mark.parametrize(
    ("user", "dropped"),
    [
        (("-ngl", "20"), ("-ngl", "--gpu-layers", "--n-gpu-layers")),
        (("--n-gpu-layers", "20"), ("-ngl", "--gpu-layers", "--n-gpu-layers")),
        (("--gpu-layers", "auto"), ("-ngl", "--gpu-layers", "--n-gpu-layers")),
        (("-sm", "row"), ("-sm", "--split-mode")),
        (("--split-mode", "row"), ("-sm", "--split-mode")),
        (("-ts", "3,1"), ("-ts", "--tensor-split")),
        (("--tensor-split", "3,1"), ("-ts", "--tensor-split")),
        (("-dev", "CUDA1"), ("-dev", "--device")),
        (("--device", "CUDA1"), ("-dev", "--device")),
    ],
)
def test_user_options_after_dashdash_win_by_any_alias(
    user: tuple[str, ...], dropped: tuple[str, ...]
) -> None:
    line = argv(("CUDA0", "CUDA1"), (unit(0), unit(1)), passthrough=user)
    assert option(line, *dropped) == [user[1]], line  # only the user's value is left
    assert line[-2:] == user  # and it comes last, as given


def test_user_split_mode_keeps_our_layers_and_split() -> None:
    line = argv(("CUDA0", "CUDA1"), (unit(0), unit(1)), passthrough=("-sm", "row"))
    assert option(line, "-ngl") == ["999"] and option(line, "-ts") == ["1,1"]


def test_user_devices_drop_our_tensor_split_too() -> None:
    # Our proportions belong to our device list, not to the user's.
    line = argv(("CUDA0", "CUDA1"), (unit(0), unit(1)), passthrough=("--device", "CUDA1"))
    assert not option(line, "-ts", "--tensor-split")


def test_llama_arg_environment_counts_as_the_users_choice() -> None:
    env = {"LLAMA_ARG_N_GPU_LAYERS": "10", "LLAMA_ARG_SPLIT_MODE": "row"}
    line = argv(("CUDA0", "CUDA1"), (unit(0), unit(1)), env=env)
    assert not option(line, "-ngl", "-sm")
    assert option(line, "--device") == ["CUDA0,CUDA1"]


def test_port_and_host_variables_do_not_stop_xpulaunch_from_passing_them() -> None:
    line = argv(("CUDA0",), (unit(0),), env={"LLAMA_ARG_PORT": "9", "LLAMA_ARG_HOST": "0.0.0.0"})
    assert option(line, "--port") == ["8080"] and option(line, "--host") == ["127.0.0.1"]
    assert user_options((), {"LLAMA_ARG_PORT": "9"}) == frozenset()


def test_users_model_host_and_port_replace_ours() -> None:
    user = ("-m", "other.gguf", "--host", "0.0.0.0", "--port", "9000", "-c", "512")
    line = argv(("CUDA0",), (unit(0),), passthrough=user)
    assert option(line, "-m", "--model") == ["other.gguf"]
    assert option(line, "--host") == ["0.0.0.0"] and option(line, "--port") == ["9000"]
    assert passthrough_value(user, "port") == "9000"
    assert passthrough_value(user, "model") == "other.gguf"


def test_passthrough_value_takes_the_last_and_ignores_a_dangling_flag() -> None:
    assert passthrough_value(("--port", "1", "--port", "2"), "port") == "2"
    assert passthrough_value(("-c", "5", "--port"), "port") is None


@pytest.mark.parametrize(
    ("free_gib", "expected"),
    [((60, 30), "2,1"), ((40, 40, 40), "1,1,1"), ((10, 25), "2,5"), ((79, 80), "79,80")],
)
def test_tensor_split_is_proportional_to_free_memory(
    free_gib: tuple[int, ...], expected: str
) -> None:
    units = tuple(unit(i, 80, 80 - f) for i, f in enumerate(free_gib))
    split, note = tensor_split(units)
    assert split == expected and note is None


def test_tensor_split_is_equal_and_says_so_when_memory_is_unknown() -> None:
    split, note = tensor_split((unit(0), unit(1, used_gib=None)))
    assert split == "1,1"
    assert note is not None and "unknown" in note and "nvidia 1" in note


def test_with_port_replaces_the_first_port_only() -> None:
    line = ("llama-server", "--port", "1", "-c", "2")
    assert with_port(line, 5) == ("llama-server", "--port", "5", "-c", "2")
