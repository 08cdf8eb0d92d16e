"""How well and how fast the history encoder estimates the world: quality by time since reset, and a mid-episode
shift test (friction or latency changes halfway; do the estimates follow, does the student keep driving?)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import torch

from adaptation.losses import FACTOR_ESTIMATES, TARGET_COLUMNS, denormalize_estimates, estimate_metrics, expected_class
from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from student.model import StudentModel, StudentPolicy

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
    r2 = (1.0 - s[:, 3] / sst)[sst > 1e-12]
    if len(r2) == 0:
        return float("nan"), float("nan")
    lo, hi = torch.quantile(r2, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    return lo, hi


def world_ids(since: torch.Tensor) -> torch.Tensor:
    """`(steps, cars)` time since reset -> an id per output of the world it came from: a car's episode (a car that
    resets draws a new world)."""
    return (since == 0).long().cumsum(0) * since.shape[1] + torch.arange(since.shape[1])


def estimate_targets(env: RacingEnv) -> torch.Tensor:
    """Per-env ground truth `(N, len(TARGET_COLUMNS))` of the explicit estimates, in TARGET_COLUMNS order."""
    cols = {
        "action_latency": env.world.action_latency.float() * env.cfg.dt_physics,
        "camera_latency": env.world.camera_latency.float() * env.cfg.dt_physics,
        "friction": env.world.params.friction,
        "motor_gain": env.world.params.motor_gain,
        "speed": env.physics.state.vx,
        "lateral_speed": env.physics.state.vy,
        "yaw_rate": env.physics.state.yaw_rate,
    }
    return torch.stack([cols[c] for c in TARGET_COLUMNS], dim=-1)


@torch.no_grad()
def estimation_by_time(model: StudentModel, env_cfg: EnvConfig, num_envs: int = 32, steps: int = 300) -> dict:
    """Drive `num_envs` randomized episodes with the student and score its estimates per time-since-reset bin, the
    regressed factors' R^2 with a 95% interval over the worlds driven (`friction_r2_ci`, `motor_gain_r2_ci`)."""
    if model.history is None:
        return {}
    env = RacingEnv(replace(env_cfg, num_envs=num_envs, compile=False))
    policy = StudentPolicy(model, num_envs, optics=env.cfg.optics, dt=env.cfg.dt)
    obs = env.get_observations()
    rows: list[tuple[dict, torch.Tensor, torch.Tensor]] = []
    for _ in range(steps):
        since = env.episode_length_buf.float() / env.cfg.control_hz
        targets = estimate_targets(env)
        action = policy.act(obs)
        rows.append(({k: v.clone() for k, v in policy.last_heads.items()}, targets, since))
        obs, _, dones, _ = env.step(action)
        policy.reset(dones)
    heads = {k: torch.cat([r[0][k] for r in rows]) for k in rows[0][0]}
    targets = torch.cat([r[1] for r in rows])
    since = torch.cat([r[2] for r in rows])
    world = world_ids(since.view(len(rows), num_envs)).flatten()
    estimated = denormalize_estimates(heads["estimates"])
    out = {}
    spans = [*itertools.pairwise(TIME_BINS), (AFTER_SECONDS, TIME_BINS[-1])]  # the last: every output after 2 s
    for lo, hi in spans:
        sel = (since >= lo) & (since < hi)
        if int(sel.sum()) < 20:
            continue
        key = f"{lo:g}-{hi:g}s" if hi < 1e8 else f">{lo:g}s"
        key = "after 2s" if (lo, hi) == (AFTER_SECONDS, TIME_BINS[-1]) else key
        out[key] = estimate_metrics(
            {k: v[sel] for k, v in heads.items()}, targets[sel], env.cfg.dt_physics, env.cfg.substeps
        )
        for name in FACTOR_ESTIMATES:
            truth = targets[sel, TARGET_COLUMNS.index(name)]
            out[key][f"{name}_r2_ci"] = r2_interval(estimated[name][sel], truth, world[sel])
        out[key]["samples"] = int(sel.sum())
    return out


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


@torch.no_grad()
def shift_test(
    model: StudentModel,
    env_cfg: EnvConfig,
    factor: str = "friction",
    before: float = 1.1,
    after: float = 0.65,
    num_envs: int = 16,
    seconds: float = 16.0,
) -> dict:
    """Change one factor for every env halfway through an episode; trace the estimate and count off-tracks.

    `factor` is friction (estimate: friction) or action_latency (value in seconds; estimate: the expected latency
    under the predicted class distribution).
    Returns the mean estimate per step, the time after the shift until it has covered 80% of the shift
    (`seconds_to_follow`, or None), and off-track events before and after.
    """
    term = replace(env_cfg.termination, episode_seconds=seconds + 1.0, laps=0)
    rnd = replace(env_cfg.randomization, random_start=False)
    starts = tuple(i / num_envs for i in range(num_envs))
    env = RacingEnv(
        replace(env_cfg, num_envs=num_envs, termination=term, randomization=rnd, start_points=starts, compile=False)
    )
    ids = torch.arange(num_envs)

    def set_factor(value: float) -> None:
        if factor == "friction":
            env.shift_world(ids, friction=value)
        else:
            env.shift_world(ids, action_latency=int(round(value / env.cfg.dt_physics)))

    set_factor(before)
    policy = StudentPolicy(model, num_envs, optics=env.cfg.optics, dt=env.cfg.dt)
    obs = env.get_observations()
    steps = int(seconds * env.cfg.control_hz)
    shift_step = steps // 2
    trace, offtrack = [], [0, 0]
    for t in range(steps):
        if t == shift_step:
            set_factor(after)
        action = policy.act(obs)
        heads = policy.last_heads
        if factor == "friction":
            trace.append(float(denormalize_estimates(heads["estimates"])["friction"].mean()))
        else:
            trace.append(float(expected_class(heads["action_latency_logits"]).mean() * env.cfg.dt_physics))
        obs, _, dones, extras = env.step(action)
        offtrack[int(t >= shift_step)] += int(extras["offtrack"].sum())
        policy.reset(dones)
    trace_np = np.asarray(trace)
    base = float(trace_np[shift_step - 15 : shift_step].mean())
    follow = seconds_to_follow(trace_np, shift_step, after, env.cfg.control_hz)
    return {
        "factor": factor, "before": before, "after": after, "estimate_before_shift": base,
        "estimate_end": float(trace_np[-15:].mean()), "seconds_to_follow_80pct": follow,
        "offtrack_before": offtrack[0], "offtrack_after": offtrack[1], "envs": num_envs,
        "trace": trace, "control_hz": env.cfg.control_hz, "shift_step": shift_step,
    }  # fmt: skip
