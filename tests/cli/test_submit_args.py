"""``xpulaunch submit``'s own options taken out of run's, and plan devices named as units."""

from __future__ import annotations

import pytest

from helpers import load_inventory
from xpulaunch.cli.group import option_arity
from xpulaunch.cli.submit import device_label, run_arguments, submit
from xpulaunch.core.plan import LaunchRequest, make_plan, to_dict

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


@pytest.mark.parametrize(
    ("fixture", "gpus", "env"),
    [
        ("2x-h200.json", "2", {}),
        ("2x-max1550.json", "2", {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}),
        ("a100-mig.json", "1", {}),
    ],
)
def test_plan_devices_are_named_as_their_units(
    fixture: str, gpus: str, env: dict[str, str]
) -> None:
    plan = make_plan(LaunchRequest(argv=("x",), gpus=gpus), load_inventory(fixture), env)
    labels = [device_label(d) for d in to_dict(plan)["devices"]]
    assert labels == [u.label() for u in plan.devices]
