"""A small but real DDP training loop that checkpoints and resumes.

    xpulaunch examples/train.py --gpus none --nproc-per-node 2 --ckpt-dir /tmp/ckpt
    xpulaunch examples/train.py --gpus 2 --nproc-per-node auto --max-restarts 1 \\
        --ckpt-dir /tmp/ckpt --crash-at-step 12          # a gang restart resumes at step 10

The backend follows what this process can see: NCCL on CUDA, XCCL on Intel XPU, Gloo on the
CPU. xpulaunch has already put the visibility variables (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK
...) into this process's environment, so asking torch what is available is safe here.
Every ``--ckpt-every`` steps rank 0 writes the model and optimizer atomically (temporary file,
then rename); a restarted run loads the last checkpoint and continues. ``--crash-at-step K``
makes one rank exit once at step K (a marker file in the checkpoint folder keeps the
restarted run from crashing again). The data of each step depends only on the step and the
rank, so a crashed-and-resumed run ends with exactly the weights of a run resumed by hand from
the same checkpoint, and on the CPU or two ranks with those of an uninterrupted run. With more
than two NCCL ranks the last bits may differ from the uninterrupted run's: DDP all-reduces the
first step after a resume in its initial bucket layout where the uninterrupted run had rebuilt
its buckets, and a sum of three or more ranks depends on the order (docs/hardware/resume_check.sh
shows it on 4 GPUs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--ckpt-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--crash-at-step", type=int, default=None)
    parser.add_argument("--crash-rank", type=int, default=None, help="default: the last rank")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--dist-backend", default="auto", choices=["auto", "gloo", "nccl", "xccl"])
    return parser.parse_args()


def pick_device(local_rank: int) -> tuple[torch.device, str]:
    """The device of this rank and the matching collective backend."""
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()  # --isolate: one visible GPU, index 0
        torch.cuda.set_device(index)
        return torch.device("cuda", index), "nccl"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        index = local_rank % xpu.device_count()
        xpu.set_device(index)
        return torch.device("xpu", index), "xccl"
    return torch.device("cpu"), "gloo"


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device.index)
        uuid = str(props.uuid)
        return f"{props.name} uuid {uuid if uuid.startswith('GPU-') else 'GPU-' + uuid}"
    if device.type == "xpu":
        return str(torch.xpu.get_device_properties(device.index).name)
    return "cpu"


def batch_for(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, FEATURES, generator=generator)
    target_w = torch.arange(FEATURES, dtype=torch.float32) / FEATURES
    y = x @ target_w.unsqueeze(1) + 0.5
    return x.to(device), y.to(device)


def save_checkpoint(path: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer):
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict()}, tmp)
    os.replace(tmp, path)  # atomic: a reader sees the old or the new file, never half of one


def load_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """The last completed step in the checkpoint, or 0 without one."""
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    return int(state["step"])


def maybe_crash(args: argparse.Namespace, step: int, rank: int, world: int) -> None:
    crash_rank = world - 1 if args.crash_rank is None else args.crash_rank
    if args.crash_at_step != step or rank != crash_rank:
        return
    marker = args.ckpt_dir / f"crashed-at-{step}"
    if marker.exists():
        return
    marker.touch()
    print(f"rank {rank}: simulated crash at step {step}", file=sys.stderr, flush=True)
    os._exit(3)


def checksum(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def main() -> int:
    args = parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # this example alone, without a launcher
    os.environ.setdefault("MASTER_PORT", "29500")
    device, backend = pick_device(local_rank)
    backend = backend if args.dist_backend == "auto" else args.dist_backend
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(
        f"rank {rank}/{world} local_rank {local_rank} device {device} ({describe(device)}) "
        f"backend {backend} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
        f"ZE_AFFINITY_MASK={os.environ.get('ZE_AFFINITY_MASK')} restart {restart}",
        flush=True,
    )
    # NCCL is told the rank's GPU, so its communicator and barrier() use that one device
    device_id = device if device.type == "cuda" else None
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=device_id)
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.ckpt_dir / "last.pt"
    start = load_checkpoint(ckpt, model, opt)
    if start:
        print(f"rank {rank}: resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(
        model, device_ids=None if device.type == "cpu" else [device.index]
    )
    for step in range(start + 1, args.steps + 1):
        maybe_crash(args, step, rank, world)
        x, y = batch_for(step, rank, args.batch, device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.ckpt_every == 0 or step == args.steps):
            save_checkpoint(ckpt, step, model, opt)
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    digest = checksum(model)
    print(f"rank {rank}: done at step {args.steps} weights {digest}", flush=True)
    if rank == 0:
        result = {"steps": args.steps, "weights": digest, "world_size": world}
        (args.ckpt_dir / "result.json").write_text(json.dumps(result))
    dist.barrier()  # every rank done before rank 0's store goes away with its process group
    dist.destroy_process_group()
    return 0


def leave(status: int) -> None:
    """Exit without the interpreter's teardown, once everything written is flushed.

    torch's gloo worker threads can still be releasing the work of the last backward pass when
    Python shuts down (DDP's process group outlives ``destroy_process_group``). That work keeps
    a Python object, so its release waits for the GIL; a thread that asks for the GIL while
    the interpreter finalizes is ended with ``pthread_exit``, and the unwind through a
    ``noexcept`` destructor aborts the process: SIGABRT, "terminate called without an active
    exception" (pytorch/pytorch#190489). With torch 2.13 on two busy cores this ended about one
    two-rank run in ten after both ranks had printed their weights (``bench/exit_soak.py``).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    leave(main())
