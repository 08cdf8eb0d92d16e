"""How well planar visual odometry measures the car's motion, against the camera's true pose change.

    python -m experiments.research.probe_odometry default
    python -m experiments.research.probe_odometry default --checkpoint runs/student/checkpoints/round_014.pt
    python -m experiments.research.probe_odometry default --odometry.forward-starts 0 0.03 0.06 0.09 0.12

The pure-pursuit driver races `envs` cars on the camera env (a student checkpoint's, or `env`) for `steps` frames;
each car's frames are tracked through its episodes (`adaptation.odometry.track_episodes`, from rest at every start)
and compared with the motion the frames really show: the change of the pose each frame was taken from
(`RacingEnv.camera_pose`), as body velocities (`adaptation.odometry_errors.record_drive`). Scored from `after_steps`
frames into each episode: R² of speed, lateral speed and yaw rate, the absolute errors' quantiles, and the time per
frame pair. The single-start tracker is always scored beside the configured one, on the same frames. Writes
`probe_odometry.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from rich.table import Table
from torch import Tensor

from adaptation.odometry import OdometryConfig, PlanarOdometry, track_episodes
from adaptation.odometry_errors import Drive, record_drive
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import check_range
from envs.racing.config import EnvConfig
from envs.racing.pure_pursuit import PurePursuitConfig, pure_pursuit_cars
from experiments.cli import run

COMPONENTS = ("speed", "lateral", "yaw_rate")


@dataclass(frozen=True)
class ProbeOdometryConfig:
    """Planar odometry against the camera's true pose change, on a pure-pursuit drive."""

    checkpoint: str = ""
    """student checkpoint whose camera env (optics, scene, randomization) is driven (default: `env`)"""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(camera="projective"))
    """camera env driven when no checkpoint is given"""
    envs: int = 24
    """cars driven at once"""
    steps: int = 90
    """frames per car (6 s at 15 fps)"""
    after_steps: int = 10
    """frames after each episode start not scored (the tracker starts from rest)"""
    odometry: OdometryConfig = field(default_factory=OdometryConfig)
    """the odometry scored (a single-start one is scored beside it)"""
    driver: PurePursuitConfig = field(default_factory=PurePursuitConfig)
    """pure-pursuit gains"""
    seed: int = 0
    """seed of the env"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""
    out_dir: str = "outputs/probe_odometry"
    """where probe_odometry.json goes"""

    def __post_init__(self) -> None:
        check_range("envs", self.envs, 1, 100_000)
        check_range("steps", self.steps, 2, 100_000)
        check_range("after_steps", self.after_steps, 1, self.steps - 1)


def drive(cfg: ProbeOdometryConfig) -> tuple[Drive, EnvConfig]:
    """Race the cars on the camera env (the checkpoint's, or `cfg.env`) and keep each frame with the pose it was
    taken from; a reset starts a new episode."""
    if cfg.checkpoint:
        from student.loaded import load_student

        base = load_student(cfg.checkpoint).env_cfg
    else:
        base = cfg.env
    env, driver = pure_pursuit_cars(base, cfg.envs, cfg.seed, cfg.driver)
    return record_drive(env, driver, cfg.steps), env.cfg


def accuracy(estimate: Tensor, truth: Tensor) -> dict[str, dict[str, float]]:
    """Per component: R², and the absolute error's median, 90th and 99th percentiles (m/s or rad/s)."""
    err = estimate - truth
    out = {}
    for k, name in enumerate(COMPONENTS):
        q = torch.quantile(err[:, k].abs().double(), torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
        var = truth[:, k].double().var(correction=0).clamp(min=1e-12)
        out[name] = {
            "r2": float(1.0 - err[:, k].double().pow(2).mean() / var),
            "abs_q50": float(q[0]),
            "abs_q90": float(q[1]),
            "abs_q99": float(q[2]),
        }
    return out


def main(cfg: ProbeOdometryConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, env_cfg = drive(cfg)
    scored = rows.step >= cfg.after_steps
    trackers = {"single start": replace(cfg.odometry, forward_starts=(0.0,)), "configured": cfg.odometry}
    if cfg.odometry.forward_starts == (0.0,):
        trackers = {"configured": cfg.odometry}
    result: dict = {
        "config": {"envs": cfg.envs, "steps": cfg.steps, "after_steps": cfg.after_steps, "checkpoint": cfg.checkpoint},
        "rows_scored": int(scored.sum()),
        "episodes": int(rows.episode.max()) + 1,
        "trackers": {},
    }
    pairs = int((rows.step > 0).sum())
    for name, odo_cfg in trackers.items():
        odometry = PlanarOdometry(env_cfg.optics, odo_cfg)
        t0 = time.perf_counter()
        est = track_episodes(odometry, rows.camera, rows.episode, rows.step, env_cfg.dt)
        seconds = time.perf_counter() - t0
        result["trackers"][name] = {
            "forward_starts": list(odo_cfg.forward_starts),
            "ms_per_pair": 1000.0 * seconds / max(pairs, 1),
            **accuracy(est[scored], rows.truth[scored]),
        }
    console = make_console()
    table = Table(title=f"odometry vs the camera's pose change ({result['rows_scored']:,} frames scored)")
    table.add_column("tracker")
    table.add_column("starts (m)")
    for c in COMPONENTS:
        table.add_column(f"{c} R²")
        table.add_column(f"{c} |err| q90")
    table.add_column("ms / pair")
    for name, r in result["trackers"].items():
        cells = [f"{r[c]['r2']:.3f}" if i == 0 else f"{r[c]['abs_q90']:.3f}" for c in COMPONENTS for i in (0, 1)]
        table.add_row(name, " ".join(f"{x:g}" for x in r["forward_starts"]), *cells, f"{r['ms_per_pair']:.1f}")
    console.print(table)
    write_text_atomic(out / "probe_odometry.json", json.dumps(result, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/]")
    return result


PRESETS = {
    "default": ("24 pure-pursuit cars x 90 frames on the default camera env", ProbeOdometryConfig()),
    "smoke": ("4 cars x 24 frames", ProbeOdometryConfig(envs=4, steps=24, after_steps=4)),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
