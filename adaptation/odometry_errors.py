"""How planar odometry errs on a camera env: frames recorded with the motion they really show, and the error model.

A drive keeps every frame with the pose it was taken from (`env.camera_pose()`), so the true motion between two
frames is the change of that pose, as body velocities. Tracking each car's frames through its episodes
(`adaptation.odometry.track_episodes`) and comparing with that truth gives the odometry's errors, which the factor
estimator's simulated worlds then carry (`adaptation.estimator_fit.with_odometry_errors`). The env and its driver
come from the caller (a pure-pursuit drive of a student's camera env in `experiments.fit_estimator`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from adaptation.estimator_fit import MotionErrors, odometry_errors
from adaptation.factor_estimator import MOTION, normalize_velocities
from adaptation.odometry import OdometryConfig, PlanarOdometry, pose_change, track_episodes


@dataclass
class Drive:
    """Rows of a recorded drive, grouped by car in step order."""

    camera: Tensor  # (N, 1, H, W) uint8
    truth: Tensor  # (N, 3) body velocities the frames show (zeros at episode starts)
    episode: Tensor  # (N,)
    step: Tensor  # (N,) frames since the episode's start


@torch.no_grad()
def record_drive(env, driver, steps: int) -> Drive:
    """Step `env` (a camera env of E cars) `steps` times with `driver.act(obs)`, keeping each frame with the pose it
    was taken from; a reset starts a new episode. Rows are car-major: `(E * steps, ...)`."""
    obs = env.get_observations()
    frames, poses, starts = [], [], []
    start = torch.ones(env.num_envs, dtype=torch.bool)  # the frame is an episode's first
    for _ in range(steps):
        frames.append(obs["camera"].to(torch.uint8).cpu())
        poses.append(env.camera_pose().cpu().clone())
        starts.append(start)
        obs, _, dones, _ = env.step(driver.act(obs))
        start = dones.cpu().bool()
    start_t = torch.stack(starts, 1)  # (E, T)
    episode = torch.cumsum(start_t.reshape(-1).long(), 0) - 1  # car-major rows: a car's first frame starts one
    step = torch.zeros_like(start_t, dtype=torch.long)
    for t in range(1, steps):
        step[:, t] = torch.where(start_t[:, t], 0, step[:, t - 1] + 1)
    pose = torch.stack(poses, 1)  # (E, T, 3)
    motion = torch.zeros_like(pose)
    motion[:, 1:] = pose_change(pose[:, :-1], pose[:, 1:])
    truth = PlanarOdometry.body_velocity(motion, env.cfg.dt) * (step > 0)[..., None]
    camera = torch.stack(frames, 1)
    return Drive(camera.reshape(-1, *camera.shape[2:]), truth.reshape(-1, 3), episode, step.reshape(-1))


def odometry_error_model(env, driver, odometry: OdometryConfig, steps: int = 160) -> tuple[MotionErrors, dict]:
    """How `odometry` errs on `env`'s camera: a drive of its cars for `steps` frames (`record_drive`), each car
    tracked through its episodes and compared with the camera's true pose change
    (`adaptation.estimator_fit.odometry_errors`), and a summary (normalized units: the linear map's diagonal, the
    residuals' standard deviation, the drive's size and time)."""
    t0 = time.perf_counter()
    rows = record_drive(env, driver, steps)
    measured = track_episodes(PlanarOdometry(env.cfg.optics, odometry), rows.camera, rows.episode, rows.step,
                              env.cfg.dt)  # fmt: skip
    errors = odometry_errors(normalize_velocities(measured), normalize_velocities(rows.truth), rows.episode, rows.step)
    res = torch.cat(errors.residuals)
    summary = {
        "frames": int(len(rows.step)),
        "episodes": int(len(torch.unique(rows.episode))),
        "gain": dict(zip(MOTION, torch.diagonal(errors.weights[1:]).tolist(), strict=True)),
        "residual_std": dict(zip(MOTION, res.std(0).tolist(), strict=True)),
        "seconds": time.perf_counter() - t0,
    }
    return errors, summary
