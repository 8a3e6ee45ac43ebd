"""The click-free parser of ``run`` and ``devices`` gives click's values, or defers to click.

The fast path exists for start-up time only (issue 4), so it must never change what a command
line means: every command line it accepts must give the same values through click, and the
ones people type every day must take it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import click
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from xpulaunch.cli.clickspec import command
from xpulaunch.cli.devices import DEVICES
from xpulaunch.cli.main import command_line, fast_call
from xpulaunch.cli.run import RUN
from xpulaunch.cli.spec import CommandSpec, Opt, parse

HERE = Path(__file__).resolve().parent
A_FILE = str(HERE / "test_spec.py")
A_DIR = str(HERE)
VALUES = [
    "1", "0", "-1", "2", "65535", "65536", "1.5", "-0.5", "nan", "inf", "1e3", " 7 ", "1_0",
    "abc", "", "auto", "none", "all", "0,2", "8GiB", "no", "on-failure", "always", "balanced",
    "sequential", "BALANCED", "1:30:2", "--", "-", "=", A_FILE, A_DIR, "/no/such/path",
]  # fmt: skip
PROGRAM_WORDS = ["train.py", "python", "-c", "pass", "--lr", "0.1", "-", "--", "x=1", "-h"]
STRANGE = ["--gpu", "--help", "-h", "--version", "-x", "--nproc", "--dry-run=1", "--no-isolate"]


def _names(spec: CommandSpec) -> list[str]:
    return [n for opt in spec.options for n in (*opt.names, *opt.off_names)]


def _envvars(spec: CommandSpec) -> list[str]:
    return [opt.envvar for opt in spec.options if opt.envvar]


@st.composite
def command_lines(draw: st.DrawFn, spec: CommandSpec) -> list[str]:
    names = _names(spec)
    token = st.one_of(
        st.sampled_from(names),
        st.builds(lambda n, v: f"{n}={v}", st.sampled_from(names), st.sampled_from(VALUES)),
        st.sampled_from(VALUES),
        st.sampled_from(STRANGE),
        st.sampled_from(PROGRAM_WORDS),
    )
    return draw(st.lists(token, max_size=12))


def click_values(spec: CommandSpec, args: list[str]) -> dict[str, object] | None:
    """What click gives the command function, or None when click rejects the command line."""
    try:
        ctx = command(spec).make_context(spec.name, list(args))
    except (click.ClickException, click.exceptions.Exit):
        return None
    return dict(ctx.params)


def clean_env(spec: CommandSpec, env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _envvars(spec)}
    return {**base, **env}


def check_same(spec: CommandSpec, args: list[str], env: dict[str, str]) -> None:
    environ = clean_env(spec, env)
    with mock.patch.dict(os.environ, environ, clear=True):
        fast = parse(spec, args, os.environ)
        if fast is None:
            return  # deferred to click: whatever click says is the answer
        assert _comparable(click_values(spec, args)) == _comparable(fast), (args, env)


def _comparable(values: dict[str, object] | None) -> dict[str, object] | None:
    """NaN (a valid float for click too) compares unequal to itself: compare its text."""
    if values is None:
        return None
    return {k: "nan" if isinstance(v, float) and v != v else v for k, v in values.items()}


@pytest.mark.parametrize("spec", [RUN, DEVICES], ids=lambda s: s.name)
@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fast_parser_agrees_with_click(spec: CommandSpec, data: st.DataObject) -> None:
    args = data.draw(command_lines(spec))
    env_names = st.sampled_from(_envvars(spec))
    env = data.draw(st.dictionaries(env_names, st.sampled_from(VALUES), max_size=3))
    check_same(spec, args, env)


@pytest.mark.parametrize(
    "args",
    [
        ["train.py", "--gpus", "auto"],
        ["examples/train.py", "--gpus", "auto", "--nproc-per-node", "2"],
        ["--gpus", "2", "--nproc-per-node", "auto", "train.py", "--lr", "0.1"],
        ["train.py", "--gpus=0,2", "--isolate", "--restart", "on-failure", "--max-restarts", "5"],
        ["--dry-run", "--json", "--inventory", A_FILE, "--", "python", "-c", "pass"],
        ["train.py", "--gang", "--no-gang", "--grace", "2.5", "--backoff", "0", "--no-color"],
        ["train.py", "--log-dir", A_DIR, "--ranks", "0,2", "--wait", "--wait-timeout", "30"],
        ["train.py", "--master-port", "29500", "--device-map", "balanced", "--shared"],
        ["train.py", "--min-free-memory", "8GiB", "--max-utilization", "10", "--lock-dir", "/x"],
    ],
)
def test_everyday_run_lines_take_the_fast_path(args: list[str]) -> None:
    check_same(RUN, args, {})
    assert parse(RUN, args, clean_env(RUN, {})) is not None


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--gpu", "2", "train.py"],  # a typo: click suggests --gpus
        ["--gpus"],
        ["train.py", "--gpus"],
        ["--dry-run=1", "train.py"],
        ["--master-port", "0", "train.py"],
        ["--device-map", "Balanced", "train.py"],
        ["--log-dir", A_FILE, "train.py"],  # a file where a directory is wanted
        ["--max-restarts", "1.5", "train.py"],
        ["--dry-run"],  # no PROGRAM
    ],
)
def test_mistakes_and_help_are_left_to_click(args: list[str]) -> None:
    assert parse(RUN, args, clean_env(RUN, {})) is None
    assert click_values(RUN, args) is None


def test_environment_variables_count_as_click_reads_them() -> None:
    env = {"XPULAUNCH_GRACE": "2", "XPULAUNCH_RESTART": "always", "XPULAUNCH_LOG_DIR": ""}
    values = parse(RUN, ["train.py"], clean_env(RUN, env))
    assert values is not None
    assert (values["grace"], values["restart"], values["log_dir"]) == (2.0, "always", None)
    check_same(RUN, ["train.py"], env)
    # An invalid value from the environment is click's to report.
    assert parse(RUN, ["train.py"], clean_env(RUN, {"XPULAUNCH_GRACE": "soon"})) is None


def test_devices_fast_path_and_its_file_check() -> None:
    assert parse(DEVICES, ["--json"], {}) == {
        "as_json": True, "inventory_file": None, "debug": False, "use_torch": False,
    }  # fmt: skip
    assert parse(DEVICES, ["--inventory", A_DIR], {}) is None  # a directory: click explains
    assert parse(DEVICES, ["train.py"], {}) is None  # devices takes no PROGRAM


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (["--version"], None),
        (["-h"], None),
        (["train.py", "--gpus", "1"], ("run", ["train.py", "--gpus", "1"])),
        (["run", "train.py"], ("run", ["train.py"])),
        (["devices", "--json"], ("devices", ["--json"])),
        (["llama", "-m", "x.gguf"], ("llama", ["-m", "x.gguf"])),
    ],
)
def test_command_line(args: list[str], expected: tuple[str, list[str]] | None) -> None:
    assert command_line(args) == expected


def test_llama_and_status_always_go_through_click() -> None:
    assert fast_call(["llama", "-m", "x.gguf"]) is None
    assert fast_call(["status"]) is None
    assert fast_call(["devices", "--json"]) is not None


@pytest.mark.parametrize(
    "opt_kwargs",
    [
        {"kind": "flag", "envvar": "X"},  # click's flag-from-env rules are not mirrored
        {"kind": "switch"},  # a switch needs its --no- names
        {"kind": "text", "off_names": ("--no-x",)},
        {"kind": "bogus"},
    ],
)
def test_declarations_the_fast_parser_cannot_honour_are_refused(
    opt_kwargs: dict[str, object],
) -> None:
    with pytest.raises(ValueError, match="option"):
        Opt("--x", dest="x", **opt_kwargs)  # type: ignore[arg-type]


def test_the_fast_path_does_not_import_click(tmp_path: Path) -> None:
    inventory = tmp_path / "empty.json"
    inventory.write_text('{"schema": "xpulaunch.inventory/1", "devices": []}')
    code = (
        "import sys\n"
        "from xpulaunch.cli.main import main\n"
        "try:\n"
        f"    main(['--dry-run', '--gpus', 'none', '--inventory', {str(inventory)!r}, 'w.py'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'click'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]", done.stdout + done.stderr
    assert "backend: cpu" in done.stdout  # it really planned


@example(args=["train.py", "--grace=-1"])
@given(args=st.lists(st.sampled_from(["--grace", "1", "--grace=2", "train.py"]), max_size=6))
def test_repeated_options_last_one_wins_as_in_click(args: list[str]) -> None:
    check_same(RUN, args, {})


def test_a_reader_that_went_away_is_a_quiet_exit_not_a_traceback() -> None:
    """``xpulaunch devices | head -1``: the pipe's reader is gone before we write."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    inventory = HERE.parents[0] / "fixtures" / "inventories" / "8x-h100.json"
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "xpulaunch"), "devices", "--inventory",
             str(inventory)],
            stdout=write_fd, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_fd)
    assert (done.returncode, done.stderr) == (141, "")
