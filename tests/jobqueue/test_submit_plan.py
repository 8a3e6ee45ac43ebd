"""``xpulaunch submit`` records the devices its job's plan asks for, named as the plan's units
(the queue shows them while the job waits), from the plan object of the same dry run a run
makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_inventory
from queue_kit import QueueBox
from xpulaunch.core.plan import LaunchRequest, make_plan
from xpulaunch.jobqueue import actions
from xpulaunch.jobqueue.store import Store

FIXTURES = Path(__file__).parent.parent / "fixtures" / "inventories"


@pytest.mark.parametrize(
    ("fixture", "gpus", "env"),
    [
        ("2x-h200.json", "2", {}),
        ("2x-max1550.json", "2", {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}),
        ("a100-mig.json", "1", {}),
    ],
)
def test_a_queued_job_wants_its_plans_units(
    box: QueueBox, fixture: str, gpus: str, env: dict[str, str]
) -> None:
    plan = make_plan(LaunchRequest(argv=("x",), gpus=gpus), load_inventory(fixture), env)
    inventory = FIXTURES / fixture
    args = ("--lock-dir", box.lock_dir, "--inventory", inventory, "--hold", "--gpus", gpus)
    job = int(box.cli("submit", *args, "--", "true", **env).stdout)
    store = Store.open(
        actions.queue_directory(str(box.lock_dir), box.env()), box.env(), create=False
    )
    assert store is not None
    with store:
        recorded = store.job(job)
    assert recorded is not None
    assert recorded.wanted == tuple(u.label() for u in plan.devices)
    assert recorded.shares is False
