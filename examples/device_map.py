"""One process, several devices: place a model with the device map xpulaunch planned.

    xpulaunch examples/device_map.py --gpus 2                # balanced over 2 GPUs
    xpulaunch examples/device_map.py --gpus 2 --device-map sequential
    xpulaunch examples/device_map.py --gpus none             # on the CPU

xpulaunch hands the process XPULAUNCH_DEVICE_MAP and XPULAUNCH_MAX_MEMORY (budgets from what
the probe saw free); ``infer_device_map`` turns them into accelerate's placement, and
``dispatch`` applies it. With transformers it is one line:
``AutoModelForCausalLM.from_pretrained(name, **from_pretrained_kwargs())``.
"""

import torch
from torch import nn

from xpulaunch.integrations.accelerate import budgets, device_map, dispatch, infer_device_map


class Stack(nn.Module):
    """Eight equal blocks and a head: big enough to split, small enough for a CPU."""

    def __init__(self, width: int = 256, depth: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def devices_present(placement: dict[str, int | str]) -> bool:
    wanted = {d for d in placement.values() if isinstance(d, int)}
    if not wanted:
        return True
    if torch.cuda.is_available():
        return max(wanted) < torch.cuda.device_count()
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and xpu.is_available() and max(wanted) < xpu.device_count()


def main() -> None:
    torch.manual_seed(0)
    model = Stack()
    chosen = device_map()
    print(f"device map: {chosen.value if chosen else 'none (CPU)'}; budgets: {budgets()}")
    placement = infer_device_map(model, no_split_module_classes=["Linear"])
    print("placement:", ", ".join(f"{name or 'model'}->{dev}" for name, dev in placement.items()))
    if devices_present(placement):
        model = dispatch(model, no_split_module_classes=["Linear"])
    else:  # a placement planned for another machine (xpulaunch --dry-run --inventory ...)
        print("those devices are not on this machine: the forward pass runs on the CPU")
    out = model(torch.ones(2, 256))
    print(f"output {tuple(out.shape)}, sum {out.sum().item():.4f}")


if __name__ == "__main__":
    main()
