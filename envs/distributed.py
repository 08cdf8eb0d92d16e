"""Data-parallel runs launched by `torchrun`: the process group, each rank's share of the envs, and the few collectives
the training loops need (gradient averaging, a rank-0 decision, gathering every rank's state for a checkpoint).

    torchrun --nproc-per-node 2 -m experiments.train_teacher default --distributed

`gloo` on CPU devices, `nccl` on CUDA (rank `r` on `cuda:<local rank>`). Without `--distributed` a run is a single
process and nothing here touches `torch.distributed`. A rank that dies closes its connections, so the others fail at
their next collective instead of waiting; one that hangs is given up on after `timeout_s`. `torchrun` itself stops the
other workers when one exits with an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from envs.errors import ConfigError, check_range

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SEED_STRIDE = 10_007
"""rank r's env and sampling seeds are the run's seed + r * SEED_STRIDE (distinct worlds per rank)"""


@dataclass(frozen=True)
class Rank:
    """Where this process stands in the run: its rank, the world size, its local rank (its GPU on the node)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, evaluates and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def seed(self, seed: int) -> int:
        """This rank's seed derived from the run's (the run's own on rank 0)."""
        return seed + SEED_STRIDE * self.rank


SINGLE = Rank()
"""a run of one process"""


def launch_hint(script: str) -> str:
    return f"torchrun --nproc-per-node 2 -m {script} <preset> ... --distributed"


def init_distributed(enabled: bool, device: str, timeout_s: float, script: str) -> Rank:
    """Join the process group `torchrun` describes (when `enabled`) and return this process's `Rank`; on a CUDA
    `device` the rank's GPU becomes the current device, so `cuda` means that GPU (configs, and the checkpoints that
    record them, stay the same on every rank). Refuses `--distributed` outside torchrun, and torchrun without it (every
    rank would train the whole run into the same directory)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if not enabled:
        if world > 1:
            raise ConfigError(
                f"launched by torchrun with WORLD_SIZE={world} but without --distributed: each process would train "
                f"the whole run into the same directory; add --distributed"
            )
        return SINGLE
    missing = [name for name in TORCHRUN_VARS if name not in os.environ]
    if missing:
        raise ConfigError(
            f"--distributed needs torchrun's environment ({', '.join(missing)} unset); launch with "
            f"`{launch_hint(script)}`"
        )
    check_range("distributed_timeout_s", timeout_s, 1.0, 86_400.0)
    rank = Rank(int(os.environ["RANK"]), world, int(os.environ["LOCAL_RANK"]))
    cuda = device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            raise ConfigError(f"--distributed on device {device!r}: CUDA is not available here")
        torch.cuda.set_device(rank.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return rank


def shutdown(rank: Rank) -> None:
    """Leave the process group (a no-op for a single process)."""
    if rank.distributed and dist.is_initialized():
        dist.destroy_process_group()


def env_share(env_cfg: Any, rank: Rank, what: str = "env.num_envs") -> Any:
    """This rank's env config: `num_envs / world_size` envs and its own seed; refused when the world size does not
    divide the env count (naming both)."""
    if not rank.distributed:
        return env_cfg
    n = int(env_cfg.num_envs)
    if n % rank.world_size:
        raise ConfigError(f"{what} {n} is not divisible by the world size {rank.world_size}")
    changes: dict[str, Any] = {"num_envs": n // rank.world_size}
    if "seed" in {f.name for f in fields(env_cfg)}:
        changes["seed"] = rank.seed(int(env_cfg.seed))
    return replace(env_cfg, **changes)


def per_rank(total: int, rank: Rank, what: str) -> int:
    """`total` split evenly over the ranks; refused when the world size does not divide it (naming both)."""
    if total % rank.world_size:
        raise ConfigError(f"{what} {total} is not divisible by the world size {rank.world_size}")
    return total // rank.world_size


def average_gradients(parameters, rank: Rank) -> None:
    """Average the gradients of `parameters` over the ranks, in one flattened all-reduce (what DDP does after the
    backward pass). Parameters without a gradient take part as zeros, so every rank reduces the same buffer."""
    if not rank.distributed:
        return
    params = [p for p in parameters if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= rank.world_size
    for p, g in zip(params, _unflatten_dense_tensors(flat, grads), strict=True):
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)


def broadcast_parameters(module: torch.nn.Module, rank: Rank) -> None:
    """Rank 0's parameters and buffers on every rank."""
    if rank.distributed:
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)


def main_decides(value: bool, rank: Rank, device: str = "cpu") -> bool:
    """Rank 0's `value` on every rank (a stop decision taken on rank 0's clock)."""
    if not rank.distributed:
        return value
    flag = torch.tensor([1 if value else 0], dtype=torch.int64, device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def gather(obj: Any, rank: Rank) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank; `[obj]` for a single process."""
    if not rank.distributed:
        return [obj]
    out: list[Any] = [None] * rank.world_size
    dist.all_gather_object(out, obj)
    return out


def sum_over_ranks(value: float, rank: Rank, device: str = "cpu") -> float:
    if not rank.distributed:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def barrier(rank: Rank) -> None:
    if rank.distributed:
        dist.barrier()


def check_world(saved: int, rank: Rank, path: str) -> None:
    """Exact resume needs the world size the checkpoint was written with (each rank continues its own envs)."""
    if saved != rank.world_size:
        raise ConfigError(
            f"{path}: written by a run of world size {saved}, this run has world size {rank.world_size}; resume with "
            f"the same number of processes"
        )
