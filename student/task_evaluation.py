"""Evaluation of any task's policy through the task contract: each episode's world in physical units, the selection
metric by third of each randomized factor with Wilson intervals, and a student's online estimates scored by time
since reset.

An episode's world is what the `env_factors` group shows at its first step, mapped back onto physical units through the
task's `factor_bounds`; so any task whose evaluation env offers that group gets the breakdown without its episode
records holding the factors. `EpisodeWatch` wraps a policy's `act` for the task's own `run_episodes` and records that
world, the student's estimate heads against the task's `estimate_targets` at every step, and a few camera frames of the
first env.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
from rich.table import Table
from torch import Tensor

from adaptation.evaluation import AFTER_SECONDS, TIME_BINS, r2_interval, world_ids
from adaptation.losses import estimate_metrics
from envs.errors import ConfigError
from envs.intervals import wilson_interval
from envs.task import Task


def control_hz(env_cfg: Any) -> float:
    """Control steps per second of an env config: its `control_hz`, or the inverse of its `control_dt`."""
    if hasattr(env_cfg, "control_hz"):
        return float(env_cfg.control_hz)
    if hasattr(env_cfg, "control_dt"):
        return 1.0 / float(env_cfg.control_dt)
    raise ConfigError(f"{type(env_cfg).__name__} names no control rate (control_hz or control_dt)")


def physical_factors(task: Task, env_factors: Tensor) -> list[dict[str, float]]:
    """`(N, F)` normalized `env_factors` -> one dict per env of each bounded factor's physical value."""
    x = env_factors.detach().cpu().double()
    out: list[dict[str, float]] = [{} for _ in range(x.shape[0])]
    for i, name in enumerate(task.factor_names):
        if name not in task.factor_bounds:
            continue
        lo, hi = task.factor_bounds[name]
        values = lo + (x[:, i] + 1.0) * 0.5 * (hi - lo)
        for row, value in zip(out, values.tolist()):
            row[name] = value
    return out


def score_by_factor(
    task: Task, records: list, worlds: list[dict[str, float]], bins: int = 3
) -> dict[str, list[dict[str, float]]]:
    """The task's selection metric by equal-count bins (thirds) of each factor that varies over the episodes: per factor
    a list of {lo, hi, episodes, <selection metric>, ci_low, ci_high} (a Wilson interval on the episodes' summed
    scores, exact for a success rate)."""
    out: dict[str, list[dict[str, float]]] = {}
    if not records or not worlds:
        return out
    scores = np.array([task.episode_score(r) for r in records], dtype=float)
    for name in worlds[0]:
        x = np.array([w[name] for w in worlds])
        if np.ptp(x) < 1e-9:
            continue
        rows = []
        for part in np.array_split(np.argsort(x, kind="stable"), min(bins, len(x))):
            m, total = len(part), float(scores[part].sum())
            lo, hi = wilson_interval(int(round(total)), m)
            rows.append({"lo": float(x[part].min()), "hi": float(x[part].max()), "episodes": float(m),
                         task.selection_metric: total / m, "ci_low": lo, "ci_high": hi})  # fmt: skip
        out[name] = rows
    return out


class EpisodeWatch:
    """A policy's `act` for `Task.run_episodes` that also records: each env's world at its first step, the student's
    estimate heads (`policy.last_heads`, when it has any) beside the task's ground truth, the time since reset and,
    for an env that counts it (`held_steps`: the arm tasks' consecutive steps with the object held), the time the
    object has been held at every step, and the first `frames` camera frames of env 0."""

    def __init__(self, task: Task, env: Any, policy: Any, frames: int = 0) -> None:
        self.task, self.env, self.policy, self.frames_wanted = task, env, policy, frames
        self.hz = control_hz(env.cfg)
        self.first_factors: Tensor | None = None
        self.rows: list[tuple[dict[str, Tensor], Tensor, Tensor]] = []
        self.frames: list[np.ndarray] = []

    def act(self, obs) -> Tensor:
        if self.first_factors is None and "env_factors" in obs.keys():
            self.first_factors = obs["env_factors"].detach().cpu().clone()
        if len(self.frames) < self.frames_wanted and "camera" in obs.keys():
            self.frames.append(obs["camera"][0].cpu().numpy())
        since = self.env.episode_length_buf.detach().cpu().float() / self.hz
        held = getattr(self.env, "held_steps", None)
        targets = self.task.estimate_targets(self.env).detach().cpu()
        action = self.policy.act(obs)
        heads = getattr(self.policy, "last_heads", None) or {}
        if heads:
            held_s = None if held is None else held.detach().cpu().float() / self.hz
            self.rows.append(({k: v.detach().float().cpu() for k, v in heads.items()}, targets, since, held_s))
        return action

    def reset(self, dones: Tensor) -> None:
        reset = getattr(self.policy, "reset", None)
        if reset is not None:
            reset(dones)

    @property
    def worlds(self) -> list[dict[str, float]]:
        return [] if self.first_factors is None else physical_factors(self.task, self.first_factors)

    def estimation(self) -> dict[str, dict[str, float]]:
        """The estimates' quality by time since reset (`estimation_by_time`); empty for a policy without estimates."""
        if not self.rows:
            return {}
        dt = self.task.dt_physics(self.env.cfg)
        return estimation_by_time(self.task, self.rows, dt, max(1, round(1.0 / (self.hz * dt))))


HELD_SECONDS = 1.5
"""an arm task's estimates are also scored on the steps after the object has been held this long"""


def estimation_by_time(
    task: Task, rows: list[tuple], dt_physics: float, frame_substeps: int
) -> dict[str, dict[str, float]]:
    """Per time-since-reset bin (and `after 2s`, every output from two seconds on): `estimate_metrics` of the task's
    estimates over the recorded steps `(heads, targets (N, K), seconds since reset (N,)[, seconds held (N,)])`, with
    each per-episode factor's R^2 interval over the worlds driven (`{name}_r2_ci`). Where the rows hold the time the
    object has been held, also `held 0-1.5s` and `held ≥1.5s`: every output while it is held, split at `HELD_SECONDS`
    (a mass or centre of mass shows only once it hangs from the grippers)."""
    heads = {k: torch.cat([r[0][k] for r in rows]) for k in rows[0][0]}
    targets = torch.cat([r[1] for r in rows])
    since = torch.cat([r[2] for r in rows])
    held = torch.cat([r[3] for r in rows]) if len(rows[0]) > 3 and rows[0][3] is not None else None
    world = world_ids(since.view(len(rows), -1)).flatten()
    spec = task.estimates
    estimated = spec.denormalize(heads["estimates"]) if spec.regressions else {}
    out: dict[str, dict[str, float]] = {}
    spans: list[tuple[str, Tensor]] = []
    for lo, hi in [*itertools.pairwise(TIME_BINS), (AFTER_SECONDS, TIME_BINS[-1])]:
        key = f"{lo:g}-{hi:g}s" if hi < 1e8 else f">{lo:g}s"
        key = "after 2s" if (lo, hi) == (AFTER_SECONDS, TIME_BINS[-1]) else key
        spans.append((key, (since >= lo) & (since < hi)))
    if held is not None:
        spans += [(f"held 0-{HELD_SECONDS:g}s", (held > 0) & (held < HELD_SECONDS)),
                  (f"held ≥{HELD_SECONDS:g}s", held >= HELD_SECONDS)]  # fmt: skip
    for key, sel in spans:
        if int(sel.sum()) < 20:
            continue
        metrics: dict[str, Any] = estimate_metrics(
            {k: v[sel] for k, v in heads.items()}, targets[sel], dt_physics, frame_substeps, spec
        )
        for name in spec.factors:
            metrics[f"{name}_r2_ci"] = r2_interval(estimated[name][sel], targets[sel, spec.column(name)], world[sel])
        metrics["samples"] = int(sel.sum())
        out[key] = metrics
    return out


def factor_table(by_factor: dict[str, list[dict[str, float]]], metric: str, title: str) -> Table:
    """One row per randomized factor: `metric` in its low / middle / high third, each with its value range and Wilson
    interval."""
    table = Table(title=title)
    table.add_column("factor")
    n_bins = max((len(rows) for rows in by_factor.values()), default=0)
    for i in range(n_bins):
        table.add_column(("low", "middle", "high")[i] if n_bins == 3 else f"bin {i + 1}")
    for name, rows in by_factor.items():
        cells = [f"{r[metric]:.0%} [{r['ci_low']:.2f}, {r['ci_high']:.2f}] ({r['lo']:.3g}–{r['hi']:.3g})" for r in rows]
        table.add_row(name, *cells)
    return table


def estimation_table(by_time: dict[str, dict[str, float]], task: Task, title: str) -> Table:
    """The estimates' quality per time since reset (and time held, where recorded): each latency's exact-class accuracy
    and the R^2 of its expected value, each regression's R^2 (a per-episode factor's with its interval over the worlds
    driven)."""
    spec = task.estimates
    table = Table(title=title)
    table.add_column("since reset")
    for name in spec.latencies:
        table.add_column(f"{name} acc")
        table.add_column(f"{name} R²")
    for name in spec.regressions:
        table.add_column(f"{name} R²")
    for key, m in by_time.items():
        cells = [cell for n in spec.latencies for cell in (f"{m[f'{n}_acc']:.2f}", _r2_cell(m[f"{n}_r2"], None))]
        for name in spec.regressions:
            cells.append(_r2_cell(m[f"{name}_r2"], m.get(f"{name}_r2_ci")))
        table.add_row(key, *cells)
    return table


def _r2_cell(r2: float, ci: tuple[float, float] | None) -> str:
    """An R^2 with its interval where it has one; `no spread` where the worlds held the factor fixed."""
    if not math.isfinite(r2):
        return "no spread"
    return f"{r2:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and all(map(math.isfinite, ci)) else "")
