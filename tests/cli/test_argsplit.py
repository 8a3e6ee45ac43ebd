"""Who owns which argument: xpulaunch's options anywhere before --, the rest to PROGRAM."""

from __future__ import annotations

import pytest

from xpulaunch.cli.group import split_args

ARITY = {"--gpus": 1, "--dry-run": 0, "--json": 0, "--nproc-per-node": 1, "-h": 0, "--help": 0}


@pytest.mark.parametrize(
    ("argv", "ours", "program"),
    [
        (["train.py", "--gpus", "auto"], ["--gpus", "auto"], ["train.py"]),
        (["--dry-run", "--", "python", "-c", "pass"], ["--dry-run"], ["python", "-c", "pass"]),
        (["train.py", "--lr", "0.1", "--gpus=2"], ["--gpus=2"], ["train.py", "--lr", "0.1"]),
        (["train.py", "--", "--gpus", "7"], [], ["train.py", "--gpus", "7"]),
        (["--bogus", "train.py"], ["--bogus"], ["train.py"]),
        (["train.py", "-h"], [], ["train.py", "-h"]),
        (["-h"], ["-h"], []),
        (
            ["python", "-c", "print(1)", "--nproc-per-node", "auto"],
            ["--nproc-per-node", "auto"],
            ["python", "-c", "print(1)"],
        ),
    ],
)
def test_split(argv: list[str], ours: list[str], program: list[str]) -> None:
    assert split_args(argv, ARITY) == (ours, program)
