"""Measure the car's motion from the frames without the commands, and what the factor estimator reads from that.

    python -m experiments.probe_motion default --checkpoint runs/student/checkpoints/round_014.pt
    python -m experiments.probe_motion default --checkpoint … --sources odometry --estimator.dilations 1 2 4 8

Two command-free motion sources, each giving every recorded row's body velocities: `two_frame`, a fresh two-frame
CNN (`adaptation.motion_branch`) cross-fitted on the run's recorded frames to regress them; `odometry`, planar visual
odometry through the calibrated camera (`adaptation.odometry`, nothing learned). The factor estimator is then fitted on
the same episodes (1 in 10 held out) once on the student's own motion estimates and once on each source's, and all are
scored on the held-out episodes from 2 s after a start. A better friction or motor-gain score on a command-free source
says the student's estimates hide the car's response behind its commands. All recorded frames are held in memory
(about 1.3 GB for 14 default rounds). Writes `probe_motion.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from adaptation.estimator_fit import episode_inputs, fit_estimator, normalize_velocities, normalized_motion
from adaptation.factor_estimator import MOTION, EstimatorConfig, FactorEstimator
from adaptation.losses import r2_score
from adaptation.motion_branch import cross_fit_motion, load_frames
from adaptation.odometry import OdometryConfig, PlanarOdometry, track_episodes
from datasets.checkpoints import save_atomic
from envs.config_io import write_text_atomic
from envs.errors import ConfigError, check_range
from experiments.cli import run
from experiments.fit_estimator import recorded_data
from student.dagger import bf16_enabled
from student.loaded import load_student

ESTIMATOR_SCORES = ("loop_latency_r2", "action_latency_r2", "friction_r2", "motor_gain_r2")
SOURCES = {
    "student": "the student's (frames + commands)",
    "two_frame": "two-frame CNN (no commands)",
    "odometry": "planar odometry (no commands)",
}


@dataclass(frozen=True)
class ProbeMotionConfig:
    """Two-frame motion CNN and the factor-estimator fits on its estimates and on the student's."""

    checkpoint: str = ""
    """student checkpoint (required: its run's frames, and its own estimates to compare)"""
    sources: tuple[Literal["two_frame", "odometry"], ...] = ("two_frame", "odometry")
    """command-free motion sources compared with the student's estimates"""
    odometry: OdometryConfig = field(default_factory=OdometryConfig)
    """planar visual odometry through the run's calibrated camera"""
    data_dir: str = ""
    """the run's shard folder (default: `data` beside the checkpoint's `checkpoints` folder)"""
    folds: int = 2
    """episode folds of the cross-fit (each row estimated by a network that never saw its episode)"""
    steps: int = 2500
    """gradient steps of the CNN, per fold"""
    batch: int = 64
    """frame pairs per step"""
    estimator: EstimatorConfig = field(default_factory=lambda: EstimatorConfig(dilations=(1, 2, 4, 8, 16)))
    """the factor estimator fitted on both sets of estimates (default: 63 steps of history)"""
    estimator_steps: int = 4000
    """gradient steps of each factor-estimator fit"""
    seed: int = 0
    """seed of the CNN and of the fits"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bfloat16 autocast for the student's replay"""
    out_dir: str = ""
    """where probe_motion.json goes (default: `probe_motion` in the run directory)"""

    def __post_init__(self) -> None:
        check_range("folds", self.folds, 2, 100)
        check_range("steps", self.steps, 1, 10_000_000)
        check_range("batch", self.batch, 1, 100_000)
        check_range("estimator_steps", self.estimator_steps, 1, 10_000_000)
        if self.estimator.kind == "none":
            raise ConfigError("--estimator.kind none: nothing to fit")
        if not self.sources or len(set(self.sources)) != len(self.sources):
            raise ConfigError(f"--sources {' '.join(self.sources)}: give one or more of two_frame odometry, once each")


def main(cfg: ProbeMotionConfig) -> dict:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    data_dir = recorded_data(cfg.checkpoint, cfg.data_dir)
    student = load_student(cfg.checkpoint)
    if student.model.history is None:
        raise ConfigError(f"{cfg.checkpoint}: a student without a history encoder has no motion estimates to compare")
    spec, dt = student.model.spec, student.env_cfg.dt_physics
    hz = student.env_cfg.control_hz
    after = int(round(2.0 * hz))
    t0 = time.perf_counter()
    frames = load_frames(data_dir)
    motion, seconds = {}, {}
    for source in cfg.sources:
        t1 = time.perf_counter()
        if source == "two_frame":
            motion[source] = cross_fit_motion(
                frames, cfg.folds, cfg.steps, cfg.batch, seed=cfg.seed, after_steps=after
            )[0]
        else:
            odometry = PlanarOdometry(student.env_cfg.optics, cfg.odometry)
            velocities = track_episodes(odometry, frames.camera, frames.episode, frames.step, student.env_cfg.dt)
            motion[source] = normalize_velocities(velocities)
        seconds[source] = time.perf_counter() - t1
    own = episode_inputs(student.model, data_dir, bf16=bf16_enabled(cfg.bf16))

    def motion_scores(estimates: Tensor, targets: Tensor, step: Tensor) -> dict[str, float]:
        late = step >= after
        truth = normalized_motion(targets)
        return {n: r2_score(estimates[late, k], truth[late, k]) for k, n in enumerate(MOTION)}

    motion_r2 = {"student": motion_scores(own.inputs[:, 2:], own.targets, own.step)}
    motion_r2.update({name: motion_scores(m, frames.targets, frames.step) for name, m in motion.items()})
    out = Path(cfg.out_dir) if cfg.out_dir else Path(cfg.checkpoint).resolve().parent.parent / "probe_motion"
    save_atomic({"episode": frames.episode, "step": frames.step, **motion}, out / "motion.pt")

    def fit(data) -> dict[str, float]:
        torch.manual_seed(cfg.seed)
        est = FactorEstimator(cfg.estimator, spec.action_latency_classes, spec.camera_latency_classes)
        stats = fit_estimator(est, data, dt, steps=cfg.estimator_steps, seed=cfg.seed, after_steps=after)
        return {k: stats[f"heldout_after/{k}"] for k in ESTIMATOR_SCORES}

    result = {
        "checkpoint": cfg.checkpoint,
        "data_dir": str(data_dir),
        "rows": int(len(frames.episode)),
        "episodes": int(len(torch.unique(frames.episode))),
        "receptive_field": cfg.estimator.receptive_field,
        "motion_r2": motion_r2,
        "estimator_heldout": {
            "student": fit(own),
            **{name: fit(frames.episode_inputs(m)) for name, m in motion.items()},
        },
        "source_seconds": seconds,
    }
    result["seconds"] = time.perf_counter() - t0
    console = Console()
    table = Table(title=f"held-out R² ≥ 2 s after a start ({result['episodes']} episodes, {result['rows']:,} rows)")
    table.add_column("motion estimates")
    for c in (*MOTION, *ESTIMATOR_SCORES):
        table.add_column(c.removesuffix("_r2"))
    for name in result["motion_r2"]:
        m, est = result["motion_r2"][name], result["estimator_heldout"][name]
        table.add_row(SOURCES[name], *(f"{m[c]:.2f}" for c in MOTION), *(f"{est[c]:.2f}" for c in ESTIMATOR_SCORES))
    console.print(table)
    write_text_atomic(out / "probe_motion.json", json.dumps(result, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/]")
    return result


PRESETS = {
    "default": (
        "two-frame CNN (2 folds x 2,500 steps) and planar odometry; estimator over 63 steps",
        ProbeMotionConfig(),
    )
}

if __name__ == "__main__":
    run(main, PRESETS, description=__doc__)
