"""Run as another user (nobody, through ``setpriv``) whose environment names folders closed
to it, as ``setpriv`` or ``su`` without ``-l`` leave HOME and the XDG folders of the user
before: every command says one line, and a config home it cannot look into is a warning, not
the end of the run. (A name too long to look up is the same error for every user:
``test_bad_inputs.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queue_kit import NOBODY, QueueBox


@pytest.fixture
def closed(box: QueueBox) -> Path:
    """A folder of root's, mode 0700, holding what a user's files would be."""
    folder = box.root / "closed"
    (folder / "xpulaunch").mkdir(parents=True)
    (folder / "xpulaunch" / "config.toml").write_text("nproc-per-node = 2\n")
    (folder / "accelerate").mkdir()
    (folder / "accelerate" / "default_config.yaml").write_text("num_processes: 2\n")
    (folder / "logs" / "attempt_0").mkdir(parents=True)
    (folder / "model.gguf").write_bytes(b"GGUF")
    folder.chmod(0o700)
    return folder


def test_a_config_home_closed_to_the_user_is_a_warning(box: QueueBox, closed: Path) -> None:
    """The file cannot even be looked for: the run goes on without it and says so in one
    line. A file that is seen but cannot be read stops the run with a one-line error."""
    config = closed / "xpulaunch" / "config.toml"
    args = ("--gpus", "none", "--dry-run", "--json", "/bin/true")
    done = box.cli(*args, uid=NOBODY, check=False, XDG_CONFIG_HOME=str(closed))
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["workers"]) == 1  # not the file's 2
    assert done.stderr == (
        f"xpulaunch: warning: cannot look for {config} (Permission denied); going on without it\n"
    )
    closed.chmod(0o755)
    config.chmod(0o600)
    done = box.cli(*args, uid=NOBODY, check=False, XDG_CONFIG_HOME=str(closed))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"xpulaunch: error: {config}: cannot read it (Permission denied)\n"


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (("--gpus", "none", "--accelerate-config", "default", "/bin/true"), {"HF_HOME": "{c}"},
         "--accelerate-config default: cannot look for {c}/accelerate/default_config.json "
         "(Permission denied); check HF_HOME, or give the file"),
        (("logs", "{c}/logs"), {},
         "{c}/logs: cannot read it (Permission denied); give the --log-dir of a run"),
        (("llama", "-m", "{c}/model.gguf", "--dry-run"), {},
         "--model {c}/model.gguf: Permission denied; expected the path of a .gguf file"),
        (("--gpus", "none", "--log-dir", "{c}/logs", "/bin/true"), {},
         "--log-dir {c}/logs: cannot create or write it (Permission denied); give a writable "
         "directory"),
    ],
    ids=["accelerate-config-default", "logs", "llama-model", "log-dir"],
)  # fmt: skip
def test_a_folder_closed_to_the_user_is_one_line(
    box: QueueBox, closed: Path, args: tuple[str, ...], env: dict[str, str], line: str
) -> None:
    def filled(text: str) -> str:
        return text.replace("{c}", str(closed))

    done = box.cli(*map(filled, args), uid=NOBODY, check=False,
                   **{k: filled(v) for k, v in env.items()})  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"xpulaunch: error: {filled(line)}\n"
