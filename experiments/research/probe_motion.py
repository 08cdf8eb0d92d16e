"""Measure the car's motion from the frames without the commands, and what the factor estimator reads from that.

    python -m experiments.research.probe_motion default --checkpoint runs/student/checkpoints/round_014.pt
    python -m experiments.research.probe_motion default --checkpoint … --sources odometry --estimator.dilations 1 2 4 8

Two command-free motion sources, each giving every recorded row's body velocities: `two_frame`, a fresh two-frame
CNN (`adaptation.motion_branch`) cross-fitted on the run's recorded frames to regress them; `odometry`, planar visual
odometry through the calibrated camera (`adaptation.odometry`, nothing learned). The factor estimator is then fitted on
the same episodes (1 in 10 held out) once on the student's own motion estimates and once on each source's, and all are
scored on the held-out episodes from 2 s after a start. A better friction or motor-gain score on a command-free source
says the student's estimates hide the car's response behind its commands. All recorded frames are held in memory
(about 1.3 GB for 14 default rounds). Writes `probe_motion.json`.

`--sim-envs N` adds the other side: estimators trained only on simulated worlds (the run's teacher, blind to friction
and motor gain, drives N cars without a camera; a new world per episode), one per `--sim-motion`: `odometry`, what
exact planar odometry reads there (the camera's pose change between frames, a camera latency behind the car),
`noisy_odometry`, the same with the errors the odometry makes (measured on a pure-pursuit drive of the run's camera env,
`--error-drive-envs` cars, where the true pose change is known: `adaptation.estimator_fit.odometry_errors`, each
simulated episode given a whole recorded residual sequence), and `exact`, the car's true body velocities at each step.
Each is scored on held-out simulated worlds (what the estimator can do with that motion) and on the recorded episodes
with each motion source and with the true velocities (what is left of it on the student's own driving): an estimator
trained on exact odometry reads the measured odometry poorly (it never saw its errors), one trained on the noisy
odometry reads it far better (docs/results.md#why-the-default-estimator-misses-friction). `--motion-from` reads a
source's velocities from an earlier run's `motion.pt` instead of measuring them again (the odometry is the slow part:
it aligns every frame pair once per forward start).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from rich.table import Table
from torch import Tensor

from adaptation.estimator_fit import (
    EpisodeInputs,
    episode_inputs,
    fit_estimator,
    normalize_velocities,
    normalized_motion,
    score,
    with_odometry_errors,
)
from adaptation.factor_estimator import MOTION, EstimatorConfig, FactorEstimator
from adaptation.losses import r2_score
from adaptation.motion_branch import RecordedFrames, cross_fit_motion, load_frames
from adaptation.odometry import OdometryConfig, PlanarOdometry, track_episodes
from adaptation.odometry_errors import odometry_error_model
from adaptation.simulated_worlds import simulated_inputs
from datasets.checkpoints import load_checkpoint, save_atomic
from datasets.run_layout import recorded_data
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.pure_pursuit import pure_pursuit_cars
from experiments.cli import run
from student.dagger import bf16_enabled
from student.loaded import STUDENT_KIND, load_student
from teacher.policy import load_teacher

ESTIMATOR_SCORES = ("loop_latency_r2", "action_latency_r2", "friction_r2", "motor_gain_r2")
SOURCES = {
    "student": "the student's (frames + commands)",
    "two_frame": "two-frame CNN (no commands)",
    "odometry": "planar odometry (no commands)",
    "exact": "the true body velocities",
}
SIM_MOTION = {
    "odometry": "exact odometry",
    "noisy_odometry": "exact odometry with the odometry's errors",
    "exact": "the true body velocities",
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
    motion_from: str = ""
    """an earlier run's `motion.pt`: the sources it holds are read from it, not measured again"""
    sim_envs: int = 0
    """cars driving simulated worlds for estimators trained there alone (0: none)"""
    sim_motion: tuple[Literal["odometry", "noisy_odometry", "exact"], ...] = ("odometry", "noisy_odometry")
    """motion inputs of the simulated worlds: exact odometry (the camera's pose change), exact odometry with the errors
    the odometry makes on a drive of the run's camera env (`--error-drive-envs`), the true velocities"""
    error_drive_envs: int = 64
    """pure-pursuit cars on the run's camera env whose odometry errors `noisy_odometry` applies"""
    error_drive_steps: int = 160
    """frames per car of that drive"""
    sim_seconds: float = 20.0
    """driving per simulated car (s); each car starts a new world whenever its episode ends"""
    sim_estimator_steps: int = 12000
    """gradient steps of the estimator fitted on the simulated worlds"""
    sim_estimator_batch: int = 128
    """windows per gradient step of the estimator fitted on the simulated worlds (thousands of worlds want a larger
    batch than a run's recorded episodes: measured better, see
    docs/results.md#why-the-default-estimator-misses-friction)"""
    teacher: str = ""
    """driver of the simulated worlds (default: the run's teacher, as the checkpoint names it)"""
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
        check_range("sim_envs", self.sim_envs, 0, 1_000_000)
        check_range("sim_seconds", self.sim_seconds, 0.1, 3600.0)
        check_range("sim_estimator_steps", self.sim_estimator_steps, 1, 10_000_000)
        check_range("sim_estimator_batch", self.sim_estimator_batch, 1, 100_000)
        check_range("error_drive_envs", self.error_drive_envs, 1, 100_000)
        check_range("error_drive_steps", self.error_drive_steps, 2, 100_000)
        if not self.sim_motion or len(set(self.sim_motion)) != len(self.sim_motion):
            raise ConfigError(
                f"--sim-motion {' '.join(self.sim_motion)}: give one or more of {' '.join(SIM_MOTION)}, once each"
            )
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
    saved = saved_motion(cfg.motion_from, frames) if cfg.motion_from else {}
    for source in cfg.sources:
        t1 = time.perf_counter()
        if source in saved:
            motion[source] = saved[source]
        elif source == "two_frame":
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
    motion_r2["exact"] = motion_scores(normalized_motion(frames.targets), frames.targets, frames.step)  # 1 by design
    out = Path(cfg.out_dir) if cfg.out_dir else Path(cfg.checkpoint).resolve().parent.parent / "probe_motion"
    save_atomic({"episode": frames.episode, "step": frames.step, **motion}, out / "motion.pt")

    def new_estimator() -> FactorEstimator:
        torch.manual_seed(cfg.seed)
        classes = spec.latency_classes
        return FactorEstimator(cfg.estimator, classes["action_latency"], classes["camera_latency"])

    def heldout(stats: dict[str, float]) -> dict[str, float]:
        return {k: stats[f"heldout_after/{k}"] for k in ESTIMATOR_SCORES}

    def fit(data) -> dict[str, float]:
        return heldout(fit_estimator(new_estimator(), data, dt, steps=cfg.estimator_steps, seed=cfg.seed,
                                     after_steps=after))  # fmt: skip

    inputs = {"student": own, **{name: frames.episode_inputs(m) for name, m in motion.items()}}
    inputs["exact"] = frames.episode_inputs(normalized_motion(frames.targets))  # the reference: motion known exactly
    result = {
        "checkpoint": cfg.checkpoint,
        "data_dir": str(data_dir),
        "rows": int(len(frames.episode)),
        "episodes": int(len(torch.unique(frames.episode))),
        "receptive_field": cfg.estimator.receptive_field,
        "motion_r2": motion_r2,
        "estimator_heldout": {name: fit(data) for name, data in inputs.items()},
        "source_seconds": seconds,
    }
    if cfg.sim_envs > 0:
        teacher_path = cfg.teacher or str(load_checkpoint(cfg.checkpoint, kind=STUDENT_KIND)["teacher_path"])
        if not teacher_path:
            raise ConfigError(f"{cfg.checkpoint} names no teacher; give --teacher to drive the simulated worlds")
        steps = max(1, int(round(cfg.sim_seconds * hz)))
        sim = simulated_inputs(load_teacher(teacher_path), student.env_cfg, None, cfg.sim_envs, steps, cfg.seed + 1)
        result["simulated"] = {"episodes": int(len(torch.unique(sim.episode)))}
        if "noisy_odometry" in cfg.sim_motion:
            drive = pure_pursuit_cars(student.env_cfg, cfg.error_drive_envs, cfg.seed)
            errors, result["simulated"]["odometry_errors"] = odometry_error_model(
                *drive, cfg.odometry, cfg.error_drive_steps
            )
        for kind in cfg.sim_motion:
            t1 = time.perf_counter()
            if kind == "odometry":
                train = sim
            elif kind == "noisy_odometry":
                train = with_odometry_errors(sim, errors, seed=cfg.seed + 2)
            else:
                train = sim.with_motion(normalized_motion(sim.targets))
            est = new_estimator()
            stats = fit_estimator(
                est,
                train,
                dt,
                steps=cfg.sim_estimator_steps,
                batch=cfg.sim_estimator_batch,
                seed=cfg.seed,
                after_steps=after,
            )
            result["simulated"][kind] = {
                "heldout_simulated": heldout(stats),
                "recorded": {name: recorded_scores(est, data, dt, after) for name, data in inputs.items()},
                "seconds": time.perf_counter() - t1,
            }
    result["seconds"] = time.perf_counter() - t0
    console = make_console()
    table = Table(title=f"held-out R² ≥ 2 s after a start ({result['episodes']} episodes, {result['rows']:,} rows)")
    table.add_column("motion estimates")
    for c in (*MOTION, *ESTIMATOR_SCORES):
        table.add_column(c.removesuffix("_r2"))
    for name in result["motion_r2"]:
        m, est = result["motion_r2"][name], result["estimator_heldout"][name]
        table.add_row(SOURCES[name], *(f"{m[c]:.2f}" for c in MOTION), *(f"{est[c]:.2f}" for c in ESTIMATOR_SCORES))
    console.print(table)
    if "odometry_errors" in result.get("simulated", {}):
        e = result["simulated"]["odometry_errors"]
        console.print(
            f"odometry errors on {e['episodes']} drive episodes ({e['frames']:,} frames, normalized units): gain "
            + ", ".join(f"{k} {v:.2f}" for k, v in e["gain"].items())
            + "; residual std "
            + ", ".join(f"{k} {v:.3f}" for k, v in e["residual_std"].items())
        )
    for kind in cfg.sim_motion if "simulated" in result else ():
        sim = result["simulated"][kind]
        table = Table(title=f"estimator trained on {result['simulated']['episodes']:,} simulated worlds with "
                            f"{SIM_MOTION[kind]}, R² ≥ 2 s after a start")  # fmt: skip
        table.add_column("scored on")
        for c in ESTIMATOR_SCORES:
            table.add_column(c.removesuffix("_r2"))
        rows = {f"held-out simulated worlds ({SIM_MOTION[kind]})": sim["heldout_simulated"]}
        rows.update({f"recorded episodes, {SOURCES[name]}": v for name, v in sim["recorded"].items()})
        for name, v in rows.items():
            table.add_row(name, *(f"{v[c]:.2f}" for c in ESTIMATOR_SCORES))
        console.print(table)
    write_text_atomic(out / "probe_motion.json", json.dumps(result, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/]")
    return result


def saved_motion(path: str, frames: RecordedFrames) -> dict[str, Tensor]:
    """The motion sources of an earlier run's `motion.pt`, refused by name unless its rows are this run's."""
    saved = load_checkpoint(path)
    if not (torch.equal(saved.get("episode", torch.empty(0)), frames.episode)
            and torch.equal(saved.get("step", torch.empty(0)), frames.step)):  # fmt: skip
        raise ConfigError(f"--motion-from {path}: its rows are not this run's recorded episodes")
    return {k: v for k, v in saved.items() if k in SOURCES}


def recorded_scores(estimator: FactorEstimator, data: EpisodeInputs, dt: float, after: int) -> dict[str, float]:
    """An estimator fitted elsewhere, scored on every recorded episode from `after` steps on."""
    stats = score(estimator, data, torch.arange(len(data.episode)), dt, min_step=after)
    return {k: stats[k] for k in ESTIMATOR_SCORES}


PRESETS = {
    "default": (
        "two-frame CNN (2 folds x 2,500 steps) and planar odometry; estimator over 63 steps",
        ProbeMotionConfig(),
    )
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
