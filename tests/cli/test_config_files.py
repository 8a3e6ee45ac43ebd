"""Config files through the installed command: discovery, precedence CLI > env > project >
user, profiles, ``config show`` provenance and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

XPULAUNCH = str(Path(sys.executable).parent / "xpulaunch")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory with a subdirectory to run from; the user config dir is empty."""
    (tmp_path / "proj" / "src").mkdir(parents=True)
    return tmp_path / "proj"


def user_file(text: str) -> Path:
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "xpulaunch" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def xpulaunch(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XPULAUNCH, *args],
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def planned(cwd: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """What a dry run would start: worker count, restart limit and isolation."""
    done = xpulaunch(cwd, *args, "--gpus", "none", "--dry-run", "--json", "/bin/true", env=env)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    return {
        "workers": len(plan["workers"]),
        "restarts": plan["workers"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"],
    }


def show(cwd: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, tuple[object, str]]:
    done = xpulaunch(cwd, *args, "config", "show", "--json", env=env)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return {row["key"]: (row["value"], row["source"]) for row in rows}


@pytest.mark.parametrize(
    ("user", "project_text", "env", "cli", "expected"),
    [
        ("", "", {}, [], {"workers": 1, "restarts": "0"}),
        ("nproc-per-node = 2\n", "", {}, [], {"workers": 2, "restarts": "0"}),
        ("nproc-per-node = 2\n", "nproc-per-node = 3\n", {}, [], {"workers": 3, "restarts": "0"}),
        (
            "max-restarts = 1\n",
            "max-restarts = 2\n",
            {"XPULAUNCH_MAX_RESTARTS": "4"},
            [],
            {"workers": 1, "restarts": "4"},
        ),
        (
            "",
            "max-restarts = 2\n",
            {"XPULAUNCH_MAX_RESTARTS": "4"},
            ["--max-restarts", "5"],
            {"workers": 1, "restarts": "5"},
        ),
    ],
)
def test_precedence_cli_env_project_user(
    project: Path,
    user: str,
    project_text: str,
    env: dict[str, str],
    cli: list[str],
    expected: dict[str, object],
) -> None:
    if user:
        user_file(user)
    if project_text:
        (project / "xpulaunch.toml").write_text(project_text)
    assert planned(project / "src", *cli, env=env) == expected


def test_pyproject_tool_table_and_profiles(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[project]\nname = "p"\n\n[tool.xpulaunch]\nnproc-per-node = 2\n\n'
        "[tool.xpulaunch.profiles.big]\nnproc_per_node = 4\nmax-restarts = 1\n"
    )
    assert planned(project / "src") == {"workers": 2, "restarts": "0"}
    assert planned(project / "src", "-p", "big") == {"workers": 4, "restarts": "1"}
    assert planned(project / "src", env={"XPULAUNCH_PROFILE": "big"})["workers"] == 4


def test_a_pyproject_without_the_table_is_not_the_project_file(project: Path) -> None:
    (project / "xpulaunch.toml").write_text("nproc-per-node = 2\n")
    (project / "src" / "pyproject.toml").write_text('[project]\nname = "xpulaunch-user"\n')
    assert planned(project / "src")["workers"] == 2


def test_config_show_says_where_each_value_came_from(project: Path) -> None:
    user = user_file('grace = 3.0\nbackend = "cpu"\n')
    (project / "xpulaunch.toml").write_text(
        'backend = "auto"\n[profiles.big]\nnproc-per-node = 8\n'
    )
    rows = show(project / "src", "-p", "big", env={"XPULAUNCH_BACKOFF": "0"})
    project_file = str(project / "xpulaunch.toml")
    assert rows["grace"] == (3.0, str(user))
    assert rows["backend"] == ("auto", project_file)
    assert rows["nproc-per-node"] == (8, f"{project_file} [profiles.big]")
    assert rows["backoff"] == ("0", "env XPULAUNCH_BACKOFF")
    assert rows["isolate"] == (False, "default")
    assert "local-ranks-filter" not in rows  # one row per option, under its first name


def test_config_show_text(project: Path) -> None:
    (project / "xpulaunch.toml").write_text("max-restarts = 2\n")
    done = xpulaunch(project, "config", "show")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"files: {project / 'xpulaunch.toml'}"
    assert any(
        line.split() == ["max-restarts", "=", "2", str(project / "xpulaunch.toml")]
        for line in lines
    )
    assert any(line.split() == ["gpus", "=", '"auto"', "default"] for line in lines)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nproc-per-nod = 2\n", "unknown key 'nproc-per-nod'; did you mean 'nproc-per-node'?"),
        ("max-restarts = 'x'\n", "max-restarts: 'x' is not a whole number"),
        ("restart = 'sometimes'\n", "restart: 'sometimes' is not one of"),
        ("gpus = \n", "Invalid value (at line 1, column 8)"),
        ("[profiles.big]\nisolat = true\n", "[profiles.big]: unknown key 'isolat'"),
        # TOML's types are not taken loosely: a fraction, a boolean or an empty text is refused.
        ("isolate = 1\n", "isolate: expected true or false, not 1"),
        ("log-dir = 5\n", "log-dir: expected a string, not 5"),
        ("max-restarts = 2.9\n", "max-restarts: '2.9' is not a whole number"),
        ("max-restarts = true\n", "max-restarts: expected a value, not True"),
        ("grace = true\n", "grace: expected a value, not True"),
        ("lock-dir = ''\n", "lock-dir: expected a value, not ''"),
        ("events = ''\n", "events: expected a value, not ''"),
        ("a = " + "[" * 100_000 + "\n", "nested too deeply"),
        (b"gpus = '\xff'\n", "not UTF-8 text"),
        # TOML's \u0000: no command line or variable can hold one, and os.stat() or a socket
        # raised ValueError or TypeError on it (a traceback).
        ('log-dir = "a\\u0000b"\n', "log-dir: 'a\\x00b' holds a NUL character"),
        ('master-addr = "a\\u0000b"\n', "master-addr: 'a\\x00b' holds a NUL character"),
        ("master-addr = '" + "x" * 64 + "'\n", "is not a host name or address"),
    ],
)
def test_a_bad_file_is_one_line_with_file_and_key(
    project: Path, text: str | bytes, message: str
) -> None:
    path = project / "xpulaunch.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for args in (["--dry-run", "/bin/true"], ["config", "show"]):
        done = xpulaunch(project, *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"xpulaunch: error: {project / 'xpulaunch.toml'}")
        assert message in done.stderr
        assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"tool = 5\n# tool.xpulaunch\n", None),  # not a table: not the project file
        (b"[tool.xpulaunch]\ngpus = 'none'\n\xff\n", "not UTF-8 text"),
        (b"[tool.xpulaunch]\nisolate = 1\n", "isolate: expected true or false"),
    ],
)
def test_a_pyproject_table_is_read_strictly(
    project: Path, text: bytes, message: str | None
) -> None:
    (project / "pyproject.toml").write_bytes(text)
    done = xpulaunch(project, "--gpus", "none", "--dry-run", "/bin/true")
    if message is None:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_profile_names_the_ones_defined(project: Path) -> None:
    (project / "xpulaunch.toml").write_text("[profiles.big]\ngpus = '2'\n[profiles.small]\n")
    done = xpulaunch(project, "-p", "bog", "--dry-run", "/bin/true")
    assert done.returncode == 2
    assert done.stderr == (
        "xpulaunch: error: --profile bog: no such profile; did you mean 'big'? "
        "(defined: big, small)\n"
    )


def test_an_empty_profile_is_a_profile(project: Path) -> None:
    """``[profiles.x]`` with no keys yet: -p x changes nothing (it was "no such profile; did
    you mean 'x'? (defined: x)")."""
    (project / "xpulaunch.toml").write_text("nproc-per-node = 2\n[profiles.x]\n")
    assert planned(project, "-p", "x")["workers"] == 2


def test_keys_for_another_command_are_valid(project: Path) -> None:
    """A project file may hold llama's options too; run ignores what it does not have."""
    (project / "xpulaunch.toml").write_text("replicas = 2\nnproc-per-node = 2\n")
    assert planned(project)["workers"] == 2
    assert show(
        project,
    )["nproc-per-node"] == (2, str(project / "xpulaunch.toml"))


def test_config_alone_shows_its_help(project: Path) -> None:
    done = xpulaunch(project, "config")
    assert done.returncode == 0, done.stderr
    assert "show  Print each option's effective value" in done.stdout
