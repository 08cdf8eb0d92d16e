"""Statistics of online estimates: R^2 intervals that resample whole worlds, world ids from time since reset, time
bins, and how fast an estimate follows a mid-episode shift. The drives that produce the estimates are
`student.estimation`'s."""

from __future__ import annotations

import numpy as np
import torch

TIME_BINS = (0.0, 0.5, 1.0, 2.0, 4.0, 1e9)
"""seconds since reset"""
AFTER_SECONDS = 2.0
"""`estimation_by_time` also scores every output from this long after a reset on (`after 2s`): the estimate once it
has had two seconds of driving"""


def r2_interval(
    pred: torch.Tensor,
    target: torch.Tensor,
    cluster: torch.Tensor,
    draws: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the R^2 of `pred` against `target` with whole clusters resampled: the outputs
    of one world (a car's episode) share its friction and its stretch of track, so they are not independent samples
    and an interval over single outputs would be far too narrow. NaN where fewer than two clusters or no spread."""
    ids, inv = torch.unique(cluster, return_inverse=True)
    k = len(ids)
    if k < 2:
        return float("nan"), float("nan")
    p, t = pred.double().flatten(), target.double().flatten()
    terms = torch.stack([torch.ones_like(t), t, t.square(), (p - t).square()], -1)
    sums = torch.zeros(k, 4, dtype=torch.float64).index_add_(0, inv.flatten(), terms)
    pick = torch.randint(0, k, (draws, k), generator=torch.Generator().manual_seed(seed))
    counts = torch.zeros(draws, k, dtype=torch.float64).scatter_add_(1, pick, torch.ones(draws, k, dtype=torch.float64))
    s = counts @ sums
    sst = s[:, 2] - s[:, 1].square() / s[:, 0]
    # a target without spread (a factor the world holds fixed) leaves only rounding in `sst`: relative threshold
    r2 = (1.0 - s[:, 3] / sst)[sst > 1e-9 * s[:, 2].abs()]
    if len(r2) == 0:
        return float("nan"), float("nan")
    lo, hi = torch.quantile(r2, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    return lo, hi


def world_ids(since: torch.Tensor) -> torch.Tensor:
    """`(steps, cars)` time since reset -> an id per output of the world it came from: a car's episode (a car that
    resets draws a new world)."""
    return (since == 0).long().cumsum(0) * since.shape[1] + torch.arange(since.shape[1])


def seconds_to_follow(trace: np.ndarray, shift_step: int, after: float, hz: float, share: float = 0.8) -> float | None:
    """Seconds after `shift_step` until the estimate's trailing 1-s mean has covered `share` of the way from its mean
    over the second before the shift to the new value `after` (None: never). The trailing mean keeps a noisy trace
    that crosses the line once from counting as followed."""
    base = float(trace[max(0, shift_step - int(round(hz))) : shift_step].mean())
    goal = base + share * (after - base)
    window = max(1, int(round(hz)))
    smooth = np.convolve(trace, np.ones(window) / window)[: len(trace)]
    for t in range(shift_step, len(trace)):
        if (after < base and smooth[t] <= goal + 1e-9) or (after >= base and smooth[t] >= goal - 1e-9):
            return (t - shift_step) / hz
    return None
