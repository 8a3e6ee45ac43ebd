"""``xpulaunch submit``'s own options taken out of run's."""

from __future__ import annotations

import pytest

from xpulaunch.cli.group import option_arity
from xpulaunch.cli.submit import run_arguments, submit

ARITY = option_arity(submit)


@pytest.mark.parametrize(
    ("raw", "run_args"),
    [
        (["--gpus", "2", "--priority", "5", "--", "train.py"], ["--gpus", "2", "--", "train.py"]),
        (["train.py", "--after", "3", "--lr", "1"], ["--", "train.py", "--lr", "1"]),
        (["--priority=5", "--hold", "--grace", "2", "x"], ["--grace", "2", "--", "x"]),
        (["--after", "1", "--after", "2", "--", "x", "--hold"], ["--", "x", "--hold"]),
    ],
)
def test_the_queues_own_options_are_not_passed_to_run(raw: list[str], run_args: list[str]) -> None:
    assert run_arguments(raw, ARITY) == run_args
