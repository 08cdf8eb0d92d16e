"""Racing's evaluation suites for transfer: the robust, nominal (console-style fixed lap) and sim-to-sim worlds, the
episode plans that score checkpoints in them and in the reality proxy, and the action agreement between the
training camera and the proxy's (a perception diagnostic). `student.transfer` scores policies in them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EvalConfig, evaluation_env_config
from envs.racing.randomization import RandomizationConfig
from envs.racing.reality import RealityConfig, reality_env_config

NOMINAL = RandomizationConfig(
    friction=False, mass=False, motor_gain=False, steering_gain=False, steering_offset=False, action_latency=False,
    camera_latency=False, action_noise=False, visual=False, random_start=False,
)  # fmt: skip

ROBUST_EVAL = EvalConfig(start_points=8, repeats=4, laps=1, max_seconds=40.0, seed=2024)
"""robust evaluation: 8 starting points x both directions x 4 randomization draws = 64 episodes (a few seconds per
checkpoint in the bicycle sim)"""
FIXED_LAP_EVAL = EvalConfig(start_points=1, directions=("forward",), laps=1, max_seconds=40.0, seed=2024)
"""the console-style evaluation: one lap from the start line, forward, nominal world"""
PROXY_EVAL = EvalConfig(start_points=10, laps=1, max_seconds=40.0, seed=7)
"""reality-proxy evaluation: 10 starting points x both directions = 20 laps"""
SELECT_PROXY_EVAL = replace(PROXY_EVAL, repeats=4)
"""the proxy score of checkpoint selection: 80 laps. With 20, a lap-completion rate near 90% carries about +-13
points of binomial noise, as much as the differences between the checkpoints of a run's plateau, and the rank
correlation measures mostly that noise (docs/results.md#checkpoint-selection)"""


def robust_env_config(env_cfg: EnvConfig, action_noise: float = 0.1) -> EnvConfig:
    """The training world (its randomization) with action noise up to `action_noise`, eager kernels."""
    rnd = replace(env_cfg.randomization, action_noise=action_noise > 0, action_noise_max=action_noise)
    return replace(env_cfg, randomization=rnd, compile=False)


def sim2sim_env_config(env_cfg: EnvConfig, action_noise: float = 0.1) -> EnvConfig:
    """Robust evaluation on the second physics engine: the contact-wheel Genesis car at the training physics step,
    with the training camera, randomization and action noise (a sim-to-sim check). The reality proxy still differs
    from it: a finer step, the unmodeled actuation effects, a fixed car and floor, its own camera, lens and scene."""
    cfg = robust_env_config(env_cfg, action_noise)
    return replace(cfg, physics="genesis", randomization=replace(cfg.randomization, rear_grip=False))


def fixed_lap_env_config(env_cfg: EnvConfig) -> EnvConfig:
    """The training sim with every randomization off."""
    return replace(env_cfg, randomization=replace(NOMINAL, direction="forward"), compile=False)


@torch.no_grad()
def action_agreement(
    load,
    path: str,
    reality: RealityConfig,
    eval_cfg: EvalConfig = PROXY_EVAL,
    env: RacingEnv | None = None,
    frames_out: str | None = None,
) -> dict:
    """Drive the proxy with the student; at every step a twin of the student (its own recurrent state) sees the
    training camera rendered at the very same camera pose. Returns how often the two choose the same action.
    `env` is a proxy env built for `eval_cfg` to reuse (it is left open); `frames_out` saves a strip of both cameras'
    frames of the first episode (training camera above, proxy below)."""
    from envs.racing.camera import make_camera
    from envs.racing.evaluation import episode_plan
    from envs.racing.randomization import sample_visuals
    from envs.racing.track_texture import TrackScene

    driver, twin = load(path), load(path)
    train_cfg = driver.env_cfg
    own = env is None
    if own:
        env = RacingEnv(evaluation_env_config(reality_env_config(train_cfg, reality, part="all"), eval_cfg))
    try:
        driver.check_env(env)
        camera = make_camera("projective", TrackScene(env.track, train_cfg.scene), train_cfg.optics, env.device)
        visuals = sample_visuals(NOMINAL, env.num_envs, env.generator, env.device)
        starts, dirs = episode_plan(eval_cfg)
        env.generator.manual_seed(eval_cfg.seed)
        dev = env.device
        ids = torch.arange(env.num_envs, device=dev)
        direction = torch.tensor([1.0 if d == "forward" else -1.0 for d in dirs], device=dev)
        obs = env.reset_to(ids, torch.tensor(starts, device=dev), direction)
        everyone = torch.ones(env.num_envs, dtype=torch.bool, device=dev)
        driver.reset(everyone)
        twin.reset(everyone)
        alive = everyone.clone()
        same, total = 0, 0
        strip: list = []
        for t in range(env.max_episode_length):
            pose = env.pose_delay.read(env.world.camera_latency)
            twin_obs = obs.clone()
            twin_obs["camera"] = camera.render(pose[:, 0], pose[:, 1], pose[:, 2], visuals)
            action, twin_action = driver.act(obs), twin.act(twin_obs)
            if t % 10 == 0 and len(strip) < 6 and bool(alive[0]):
                strip.append((twin_obs["camera"][0].cpu().numpy(), obs["camera"][0].cpu().numpy(), t))
            if action.dtype == torch.long:
                match = action == twin_action
            else:  # continuous: within 5% of the normalized range on every axis
                match = (action - twin_action).abs().amax(-1) < 0.05
            same += int(match[alive].sum())
            total += int(alive.sum())
            obs, _, dones, _ = env.step(action)
            alive &= ~dones
            if not bool(alive.any()):
                break
    finally:
        if own:
            env.close()
    if frames_out and strip:
        from envs.racing.visualize import save_frame_strip

        frames = np.stack([f[0] for f in strip] + [f[1] for f in strip])
        captions = [f"training camera t={f[2]}" for f in strip] + [f"proxy camera t={f[2]}" for f in strip]
        save_frame_strip(frames, frames_out, captions, cols=len(strip))
    return {"agreement": same / max(total, 1), "steps": total}
