"""Fit (or refit) a student's factor estimator on its run's recorded episodes, and save the student with it.

    python -m experiments.fit_estimator default --checkpoint runs/student/checkpoints/round_014.pt
    python -m experiments.fit_estimator default --checkpoint … --new --estimator.dilations 1 2 4 8 16  # another one
    python -m experiments.fit_estimator default --checkpoint … --sim-envs 1024   # + 1,024 simulated cars' worlds

The policy, image encoder and history encoder are unchanged (the estimator reads their output and feeds nothing
back), so the student drives exactly as before; only its latency, friction and motor-gain estimates change. A
student distilled before the estimator existed gets one. The recorded episodes are the run's shards (`--data-dir`,
default `<run>/data` next to the checkpoint's folder). Writes `--out` (default: `<checkpoint>` with an `_estimator`
suffix) atomically and prints the held-out scores, and what the student's motion estimates follow: the R² of a
linear fit of each on the true body velocities, on its last 8 commands, and on both (an estimate the commands explain
as well as the truth carries little of how the car actually responds).

`--sim-envs N` adds N cars driven by the run's teacher (blind to friction and motor gain) in the student's world
without a camera, each car a new world per episode, their motion inputs passed through the student's own estimate
errors measured on the recorded episodes (`adaptation.estimator_fit.simulated_inputs`): labels for thousands of
worlds instead of the run's few hundred. The held-out scores stay on recorded episodes the fit never saw; on a
default-teacher student they came out worse than without (README), so it is off by default.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console

from adaptation.estimator_fit import episode_inputs, estimate_sources, fit_estimator, simulated_worlds
from adaptation.factor_estimator import EstimatorConfig, FactorEstimator
from datasets.checkpoints import load_checkpoint, save_atomic
from envs.config_io import to_yaml
from envs.errors import ConfigError, check_range
from experiments.cli import run
from student.dagger import bf16_enabled
from student.loaded import STUDENT_KIND, load_student
from teacher.policy import load_teacher

ESTIMATOR_SUFFIX = "_estimator"
"""the default output sits next to its checkpoint, named with this suffix (checkpoint selection skips such files: the
policy is the checkpoint's own)"""


def estimator_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(f"{checkpoint.stem}{ESTIMATOR_SUFFIX}{checkpoint.suffix}")


@dataclass(frozen=True)
class FitEstimatorConfig:
    """Factor estimator fit."""

    checkpoint: str = ""
    """student checkpoint (required)"""
    data_dir: str = ""
    """the run's shard folder (default: `data` beside the checkpoint's `checkpoints` folder)"""
    out: str = ""
    """output checkpoint (default: the checkpoint's name with an `_estimator` suffix)"""
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    """architecture of a new estimator (a student that has one keeps its own unless `--new`)"""
    new: bool = False
    """start from a new estimator of `--estimator` even when the student has one"""
    steps: int = 4000
    """gradient steps"""
    seed: int = 0
    """seed of the window sampling and of a new estimator's initialization"""
    threads: int = 0
    """torch CPU threads (0 = torch's default)"""
    sim_envs: int = 0
    """cars driving simulated worlds for the fit besides the recorded episodes (0: recorded episodes only)"""
    sim_seconds: float = 20.0
    """driving per simulated car (s); each car starts a new world whenever its episode ends"""
    teacher: str = ""
    """driver of the simulated worlds (default: the run's teacher, as the checkpoint names it)"""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bfloat16 autocast for the student's pass over the recorded episodes (auto: on CPUs with native bf16, as
    DAgger trains)"""

    def __post_init__(self) -> None:
        check_range("steps", self.steps, 1, 10_000_000)
        check_range("sim_envs", self.sim_envs, 0, 1_000_000)
        check_range("sim_seconds", self.sim_seconds, 0.1, 3600.0)


def recorded_data(checkpoint: str, data_dir: str = "") -> Path:
    """The run's shard folder: `data_dir`, or `data` beside the checkpoint's `checkpoints` folder; refused by name
    when it holds no manifest (and without a checkpoint: every script reading a run's episodes needs the student)."""
    if not checkpoint:
        raise ConfigError("--checkpoint is required (a student checkpoint from experiments.distill_student)")
    path = Path(data_dir) if data_dir else Path(checkpoint).resolve().parent.parent / "data"
    if not (path / "manifest.json").is_file():
        raise ConfigError(f"--data-dir {path}: no manifest.json (the run's recorded episodes)")
    return path


def main(cfg: FitEstimatorConfig) -> dict:
    if cfg.estimator.kind == "none":
        raise ConfigError("--estimator.kind none: nothing to fit")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    ckpt = Path(cfg.checkpoint)
    data_dir = recorded_data(cfg.checkpoint, cfg.data_dir)
    out = Path(cfg.out) if cfg.out else estimator_path(ckpt)
    console = Console()
    student = load_student(ckpt)
    model = student.model
    if model.history is None:
        raise ConfigError(f"{ckpt}: a student without a history encoder has no motion estimates to read")
    torch.manual_seed(cfg.seed)
    if model.estimator is None or cfg.new:
        model.cfg = replace(model.cfg, estimator=cfg.estimator)
        model.estimator = FactorEstimator(
            cfg.estimator, model.spec.action_latency_classes, model.spec.camera_latency_classes
        )
    t0 = time.time()
    data = episode_inputs(model, data_dir, bf16=bf16_enabled(cfg.bf16))
    driver = None
    if cfg.sim_envs > 0:
        teacher_path = cfg.teacher or str(load_checkpoint(ckpt, kind=STUDENT_KIND).get("teacher_path", ""))
        if not teacher_path:
            raise ConfigError(f"{ckpt} names no teacher; give --teacher to drive the simulated worlds")
        driver = load_teacher(teacher_path)
    simulated = simulated_worlds(driver, student.env_cfg, data, cfg.sim_envs, cfg.sim_seconds, seed=cfg.seed + 1)
    t1 = time.time()
    stats = fit_estimator(
        model.estimator, data, student.env_cfg.dt_physics, steps=cfg.steps, seed=cfg.seed, simulated=simulated
    )
    stats.update({f"sources/{k}": v for k, v in estimate_sources(data).items()})
    t2 = time.time()
    saved = load_checkpoint(ckpt, kind=STUDENT_KIND)
    saved["model"] = model.state_dict()
    saved["student_yaml"] = to_yaml(model.cfg)
    saved["estimator_fit"] = json.dumps(
        {**stats, "steps": cfg.steps, "data_dir": str(data_dir), "sim_envs": cfg.sim_envs}
    )
    save_atomic(saved, out)
    stats.update({"inputs_s": t1 - t0, "fit_s": t2 - t1, "rows": float(len(data.episode))})
    sim = f" + {int(stats['simulated_episodes'])} simulated" if simulated is not None else ""
    console.print(
        f"{int(stats['episodes'])} episodes{sim}, {len(data.episode):,} rows: inputs {t1 - t0:.0f} s, "
        f"fit {t2 - t1:.0f} s"
    )
    for part in ("train", "heldout", "heldout_after"):
        row = ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in stats.items() if k.startswith(part + "/"))
        console.print(f"{part}: {row}")
    for part in ("truth", "commands", "both"):
        row = ", ".join(f"{k.split('/')[2]} {v:.2f}" for k, v in stats.items() if k.startswith(f"sources/{part}/"))
        console.print(f"motion estimates (R² after 2 s) from {part}: {row}")
    console.print(f"student with the fitted estimator: [bold]{out.resolve()}[/]")
    return stats


PRESETS = {"default": ("fit the factor estimator on the run's recorded episodes", FitEstimatorConfig())}

if __name__ == "__main__":
    run(main, PRESETS, description=__doc__)
