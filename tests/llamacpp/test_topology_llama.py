"""``xpulaunch llama --gpus N`` spreads a model over N devices chosen by how they are linked."""

from __future__ import annotations

from helpers import load_inventory
from xpulaunch.llamacpp.devices import LlamaBackend
from xpulaunch.llamacpp.plan import LlamaRequest, make_llama_plan

PAIRS = "8x-a6000-nvlink-pairs.json"


def _plan(topology: str = "prefer", replicas: int = 1) -> tuple[list[list[int]], list[str]]:
    inventory = load_inventory(PAIRS)
    held = {inventory.devices[1].key: "pid 7 (python other.py)"}
    request = LlamaRequest(
        model="m.gguf",
        binary="/opt/llama-server",
        gpus=str(2 * replicas),
        replicas=replicas,
        topology=topology,
    )
    result = make_llama_plan(
        request,
        inventory,
        {},
        build=LlamaBackend.CUDA,
        listing=None,
        ports=[8000 + i for i in range(replicas)],
        unavailable=held,
    )
    devices = [[result.plan.devices[i].device.index for i in w.units] for w in result.plan.workers]
    return devices, [n for n in result.plan.notes if n.startswith("topology:")]


def test_a_model_over_two_gpus_gets_a_bridged_pair() -> None:
    devices, notes = _plan()
    assert devices == [[2, 3]]
    assert notes[0] == "topology: the 2 chosen devices share one NVLink group (NV4)"
    assert _plan("ignore")[0] == [[0, 2]]
