"""Simulated worlds for the factor estimator's fit: cars driven by the teacher (without a camera, blind to the factors
the student cannot see) or by the student itself (through its camera), each car a new world per episode, with the
estimator's inputs and the true factors recorded; the motion inputs are the student's own errors applied to the true
velocities, or what exact planar odometry reads (`adaptation.estimator_fit` explains why and what they are worth)."""

from __future__ import annotations

from dataclasses import replace

import torch

from adaptation.estimator_fit import EpisodeInputs, MotionErrors, episode_spans, motion_errors, normalized_motion
from adaptation.factor_estimator import FACTORS, normalize_velocities
from adaptation.observability import blind_factor, driving_env
from adaptation.odometry import PlanarOdometry, pose_change
from envs.task import task_of_config


@torch.no_grad()
def simulated_inputs(
    driver,
    env_cfg,
    errors: MotionErrors | None,
    envs: int = 1024,
    steps: int = 300,
    seed: int = 0,
    blind: tuple[str, ...] = FACTORS,
    first_episode: int = 0,
    camera: bool = False,
) -> EpisodeInputs:
    """Estimator inputs and true targets of `envs` cars driven `steps` control steps by `driver` (a teacher) in
    `env_cfg`'s world without a camera, blind to `blind` (the factors the student does not see), each car drawing a
    new world per episode; with `camera`, `driver` is a student (`act` on the camera frames, `reset` on done) driving
    the world with its camera, so the worlds hold the student's own driving. The motion inputs are `errors` applied to
    the true body velocities, or with `errors` None what exact planar odometry reads: the body velocities of the
    camera's pose change between consecutive frames (`adaptation.odometry.PlanarOdometry` measures the same from the
    frames; zeros at an episode's first step). Episode ids start at `first_episode`; rows are grouped by episode, in
    step order."""
    task = task_of_config(env_cfg)
    if camera:
        env = task.make_env(replace(env_cfg, num_envs=envs, seed=seed, compile=False))
        driver.reset(torch.ones(envs, dtype=torch.bool))
    else:
        env = driving_env(replace(env_cfg, seed=seed), envs)
    obs = env.get_observations()
    episode = torch.arange(envs) + first_episode
    next_episode = first_episode + envs
    prev, targets, steps_since, episodes, poses = [], [], [], [], []
    for _ in range(steps):
        prev.append(obs["proprio"][:, :2].clone())
        targets.append(task.estimate_targets(env))
        steps_since.append(env.episode_length_buf.clone())
        episodes.append(episode.clone())
        poses.append(env.camera_pose().clone())
        seen = obs
        for name in () if camera else blind:
            seen = blind_factor(seen, name, task)
        obs, _, dones, _ = env.step(driver.act(seen))
        if camera:
            driver.reset(dones)
        done = dones.bool().cpu()
        episode[done] = torch.arange(next_episode, next_episode + int(done.sum()))
        next_episode += int(done.sum())
    stack = lambda xs: torch.stack(xs, 1).cpu()  # noqa: E731  (envs, steps, ...): env-major, each episode contiguous
    prev_t, targets_t, step_t, episode_t = (stack(x).flatten(0, 1) for x in (prev, targets, steps_since, episodes))
    targets_t = targets_t.float()
    if errors is None:
        pose = stack(poses)
        velocity = PlanarOdometry.body_velocity(pose_change(pose[:, :-1], pose[:, 1:]), env_cfg.dt)
        velocity = torch.cat([torch.zeros_like(velocity[:, :1]), velocity], 1).flatten(0, 1)
        motion = normalize_velocities(velocity * (step_t > 0).float()[:, None])
    else:
        motion = errors.predict(normalized_motion(targets_t), prev_t, step_t)
        gen = torch.Generator().manual_seed(seed)
        for a, b in episode_spans(episode_t):
            motion[a:b] += errors.sample(b - a, gen)
    return EpisodeInputs(torch.cat([prev_t.float(), motion], -1), targets_t, episode_t, step_t)


def simulated_worlds(driver, env_cfg, data: EpisodeInputs, envs: int, seconds: float, seed: int = 0):
    """`simulated_inputs` for a run: `envs` cars driving `seconds` each, with the motion errors the student shows on
    its recorded episodes `data`, their episode ids after the recorded ones. None when `envs` is 0."""
    if envs <= 0:
        return None
    return simulated_inputs(
        driver, env_cfg, motion_errors(data), envs=envs, steps=max(1, int(round(seconds * env_cfg.control_hz))),
        seed=seed, first_episode=int(data.episode.max()) + 1,
    )  # fmt: skip
