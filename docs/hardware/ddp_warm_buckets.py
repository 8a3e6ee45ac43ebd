"""examples/train.py with DDP's gradient buckets given their final layout before the first step.

DDP all-reduces the gradients of its first iteration in its initial bucket layout (the
parameters in registration order) and then rebuilds the buckets in the order the gradients
became ready (for ``torch.nn.Linear``: bias, then weight). A run resumed from a checkpoint
makes its first iteration at step 11 in the initial layout, where the uninterrupted run used the
rebuilt one: every element of the bucket sits at another offset, NCCL's ring sums each element
starting from another rank, and with more than two ranks floating-point addition in another
order changes the last bits. Here one zero backward pass right after DDP is built triggers the
rebuild, so every real step of every run uses the rebuilt layout. If a crashed-and-resumed run
then ends with exactly the uninterrupted weights, the bucket layout was the whole difference.

    python docs/hardware/ddp_warm_buckets.py ARGS...   # as examples/train.py ARGS...
"""

import runpy
import sys
from pathlib import Path

import torch
import torch.nn.parallel
from torch.nn.parallel import DistributedDataParallel


class WarmBucketsDDP(DistributedDataParallel):
    def __init__(self, module: torch.nn.Module, *args: object, **kwargs: object) -> None:
        super().__init__(module, *args, **kwargs)
        weight = next(module.parameters())
        self(torch.zeros(1, weight.shape[1], device=weight.device)).sum().mul(0).backward()
        for param in module.parameters():
            param.grad = None


torch.nn.parallel.DistributedDataParallel = WarmBucketsDDP  # type: ignore[misc]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
