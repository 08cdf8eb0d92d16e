"""How well and how fast a student's history encoder estimates the world while it drives: quality by time since
reset, and a mid-episode shift test (friction or latency changes halfway; do the estimates follow, does the student
keep driving?). Vehicle tasks: the estimates are `envs.vehicle.VEHICLE_ESTIMATES`."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import torch

from adaptation.evaluation import AFTER_SECONDS, TIME_BINS, r2_interval, seconds_to_follow, world_ids
from adaptation.losses import estimate_metrics, expected_class
from envs.task import task_of_config
from envs.vehicle import VEHICLE_ESTIMATES
from student.model import StudentModel, StudentPolicy


@torch.no_grad()
def estimation_by_time(model: StudentModel, env_cfg, num_envs: int = 32, steps: int = 300) -> dict:
    """Drive `num_envs` randomized episodes with the student and score its estimates per time-since-reset bin, the
    regressed factors' R^2 with a 95% interval over the worlds driven (`friction_r2_ci`, `motor_gain_r2_ci`)."""
    if model.history is None:
        return {}
    task = task_of_config(env_cfg)
    env = task.make_env(replace(env_cfg, num_envs=num_envs, compile=False))
    policy = StudentPolicy(model, num_envs, optics=env.cfg.optics, dt=env.cfg.dt)
    obs = env.get_observations()
    rows: list[tuple[dict, torch.Tensor, torch.Tensor]] = []
    for _ in range(steps):
        since = env.episode_length_buf.float() / env.cfg.control_hz
        targets = task.estimate_targets(env)
        action = policy.act(obs)
        rows.append(({k: v.clone() for k, v in policy.last_heads.items()}, targets, since))
        obs, _, dones, _ = env.step(action)
        policy.reset(dones)
    heads = {k: torch.cat([r[0][k] for r in rows]) for k in rows[0][0]}
    targets = torch.cat([r[1] for r in rows])
    since = torch.cat([r[2] for r in rows])
    world = world_ids(since.view(len(rows), num_envs)).flatten()
    estimated = VEHICLE_ESTIMATES.denormalize(heads["estimates"])
    out = {}
    spans = [*itertools.pairwise(TIME_BINS), (AFTER_SECONDS, TIME_BINS[-1])]  # the last: every output after 2 s
    for lo, hi in spans:
        sel = (since >= lo) & (since < hi)
        if int(sel.sum()) < 20:
            continue
        key = f"{lo:g}-{hi:g}s" if hi < 1e8 else f">{lo:g}s"
        key = "after 2s" if (lo, hi) == (AFTER_SECONDS, TIME_BINS[-1]) else key
        out[key] = estimate_metrics(
            {k: v[sel] for k, v in heads.items()}, targets[sel], env.cfg.dt_physics, env.cfg.substeps, task.estimates
        )
        for name in VEHICLE_ESTIMATES.factors:
            truth = targets[sel, VEHICLE_ESTIMATES.column(name)]
            out[key][f"{name}_r2_ci"] = r2_interval(estimated[name][sel], truth, world[sel])
        out[key]["samples"] = int(sel.sum())
    return out


@torch.no_grad()
def shift_test(
    model: StudentModel,
    env_cfg,
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
    env = task_of_config(env_cfg).make_env(
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
            trace.append(float(VEHICLE_ESTIMATES.denormalize(heads["estimates"])["friction"].mean()))
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
