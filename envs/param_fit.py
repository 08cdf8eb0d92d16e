"""Fitting a few physical parameters to logged data, for any task: Adam over many parameter sets at once, CMA-ES over
many instances in lockstep, and bootstrap weights over log segments.

Every parameter lives in a box and is optimized in the unit cube (Adam through a sigmoid, CMA-ES with bounds [0, 1]),
so one step size suits gains, time constants and offsets alike. The loss functions are batched: Adam's takes the
`(P, D)` parameter sets and returns `(P,)` losses (independent sets: the summed loss gives each set its own gradient,
so P restarts or bootstrap replicas cost one batched evaluation); CMA-ES's takes `(K, pop, D)` candidates of K
instances and returns `(K, pop)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from envs.errors import ConfigError


@dataclass(frozen=True)
class ParamBox:
    """Names and bounds of the fitted parameters, in a fixed order."""

    names: tuple[str, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.low) == len(self.high)):
            raise ConfigError(f"ParamBox: {len(self.names)} names, {len(self.low)} lows, {len(self.high)} highs")
        for name, lo, hi in zip(self.names, self.low, self.high, strict=True):
            if not lo < hi:
                raise ConfigError(f"ParamBox: {name} has low {lo} >= high {hi}")

    @property
    def dim(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def to_unit(self, values: Tensor) -> Tensor:
        """`(..., D)` physical values -> unit cube."""
        lo, hi = self._bounds(values)
        return (values - lo) / (hi - lo)

    def from_unit(self, unit: Tensor) -> Tensor:
        """`(..., D)` unit-cube values -> physical values."""
        lo, hi = self._bounds(unit)
        return lo + unit * (hi - lo)

    def _bounds(self, like: Tensor) -> tuple[Tensor, Tensor]:
        lo = torch.tensor(self.low, dtype=like.dtype, device=like.device)
        hi = torch.tensor(self.high, dtype=like.dtype, device=like.device)
        return lo, hi


@dataclass
class AdamResult:
    """Adam's end state: best unit-cube values `(P, D)` and loss `(P,)` of every set, and the loss history
    `(iterations, P)`."""

    unit: Tensor
    loss: Tensor
    history: Tensor

    def stalled(self, window: int = 20, rel_tol: float = 1e-3) -> Tensor:
        """`(P,)` bool: the best loss fell by less than `rel_tol` (relative) over the last `window` iterations."""
        best = torch.cummin(self.history, dim=0).values
        window = min(window, len(best) - 1)
        if window < 1:
            return torch.zeros(best.shape[1], dtype=torch.bool)
        drop = best[-window - 1] - best[-1]
        return drop <= rel_tol * best[-1].abs().clamp(min=1e-12)


def adam_fit(
    loss_fn: Callable[[Tensor], Tensor],
    init_unit: Tensor,
    iterations: int,
    lr: float = 0.05,
    free: Sequence[bool] | None = None,
) -> AdamResult:
    """Minimize `loss_fn(unit (P, D)) -> (P,)` over P independent sets from `init_unit` `(P, D)` with Adam in logit
    space (the unit value is the sigmoid of the optimized variable, so it stays inside the box). Dimensions with
    `free[d]` False stay at their initial values. Returns each set's best point, not its last."""
    eps = 1e-4
    mask = torch.ones(init_unit.shape[-1]) if free is None else torch.tensor([float(f) for f in free])
    mask = mask.to(init_unit)
    z = torch.logit(init_unit.clamp(eps, 1 - eps)).detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    best_unit = init_unit.clone()
    best_loss = torch.full(init_unit.shape[:1], float("inf"))
    history = []
    for _ in range(iterations):
        opt.zero_grad(set_to_none=True)
        unit = torch.sigmoid(z)
        loss = loss_fn(unit)
        loss.sum().backward()
        z.grad.mul_(mask)
        with torch.no_grad():
            better = loss.detach() < best_loss
            best_loss = torch.where(better, loss.detach(), best_loss)
            best_unit = torch.where(better[:, None], unit.detach(), best_unit)
        history.append(loss.detach().clone())
        opt.step()
    return AdamResult(best_unit, best_loss, torch.stack(history) if history else torch.zeros(0, len(init_unit)))


@dataclass
class CmaResult:
    """CMA-ES's end state per instance: best unit-cube point `(K, D)`, its loss `(K,)`, generations run and whether
    each instance met its own stopping criteria (tolerances) before the generation budget ran out."""

    unit: np.ndarray
    loss: np.ndarray
    generations: int
    stopped: list[bool]


def cma_fit(
    loss_fn: Callable[[Tensor], Tensor],
    x0_unit: np.ndarray,
    sigma0: float,
    generations: int,
    popsize: int = 12,
    seed: int = 0,
    tolfun: float = 1e-6,
    stds: Sequence[float] | None = None,
) -> CmaResult:
    """K CMA-ES instances (`cma`, bounds [0, 1] per dimension) started at `x0_unit` `(K, D)`, run in lockstep:
    every generation all instances' candidates go through one batched `loss_fn((K, pop, D)) -> (K, pop)` call.
    `stds` scales the initial step per dimension (times `sigma0`). For objectives that are not differentiable
    (integer parameters rounded inside the loss, thresholds)."""
    import cma

    x0 = np.asarray(x0_unit, dtype=float).reshape(-1, np.shape(x0_unit)[-1])
    opts = {"bounds": [0.0, 1.0], "popsize": popsize, "verbose": -9, "tolfun": tolfun, "maxiter": generations}
    if stds is not None:
        opts["CMA_stds"] = list(stds)
    instances = [cma.CMAEvolutionStrategy(x.clip(1e-3, 1 - 1e-3), sigma0, {**opts, "seed": seed + k + 1})
                 for k, x in enumerate(x0)]  # fmt: skip
    done = [False] * len(instances)
    ran = 0
    for _ in range(generations):
        live = [k for k, es in enumerate(instances) if not done[k]]
        if not live:
            break
        asked = [np.asarray(instances[k].ask()) for k in live]  # each (pop, D)
        with torch.no_grad():
            losses = loss_fn(torch.as_tensor(np.stack(asked), dtype=torch.float32)).double().numpy()
        for k, cand, loss in zip(live, asked, losses, strict=True):
            instances[k].tell(list(cand), list(loss))
            done[k] = bool(instances[k].stop())
        ran += 1
    unit = np.stack(
        [np.asarray(es.result.xbest if es.result.xbest is not None else x) for es, x in zip(instances, x0, strict=True)]
    )
    loss = np.array([es.result.fbest for es in instances], dtype=float)
    return CmaResult(unit, loss, ran, done)


def block_bootstrap_weights(blocks: Tensor, replicas: int, generator: torch.Generator) -> Tensor:
    """Bootstrap over log segments: `blocks` `(N,)` long gives each item's segment; every replica draws as many
    segments as there are, with replacement, and weighs each item by how often its segment was drawn. Returns
    `(replicas, N)` float weights (replica rows are independent draws)."""
    ids, inverse = torch.unique(blocks, return_inverse=True)
    draws = torch.randint(len(ids), (replicas, len(ids)), generator=generator)
    counts = torch.zeros(replicas, len(ids))
    counts.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float32))
    return counts[:, inverse]


def huber(x: Tensor, delta: float) -> Tensor:
    """Huber penalty of `x`, quadratic (x^2 / 2) within `delta` and linear beyond."""
    a = x.abs()
    return torch.where(a <= delta, 0.5 * x.square(), delta * (a - 0.5 * delta))
