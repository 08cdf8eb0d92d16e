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
errors measured on the recorded episodes (`adaptation.simulated_worlds.simulated_inputs`): labels for thousands of
worlds instead of the run's few hundred. The held-out scores stay on recorded episodes the fit never saw; it is off
by default because those scores came out worse with it (docs/results.md#estimates).

The `odometry` preset (`--estimator.motion odometry`) gives the student a new estimator that reads planar visual
odometry of its frames instead (`adaptation.odometry`: command-free, so slip and a weak motor show through). The
recorded episodes hold the encoder's estimates, not odometry, so it is fitted on simulated worlds alone: `--sim-envs`
cars with exact odometry, given the errors the default odometry makes on a pure-pursuit drive of the run's camera env
(`--error-drive-envs` x `--error-drive-steps`; `adaptation.odometry_errors.odometry_error_model`), 1 in 10 worlds held
out. In the preset the student itself drives those worlds through its camera (`--sim-driver student`; `teacher`: the
teacher without a camera, blind to the factors; `both`: half the cars each), so the estimator learns from the driving
it will read online. The saved student runs the odometry beside it wherever its estimates are scored (`StudentPolicy`
given the env's camera) and on the car (the exported graph's `motion` input). The preset's estimator is 64 channels
wide (32 for `default`) because the odometry-fed fit underfits at 32, and the preset drives 4,096 cars for 20 s
because on fewer worlds the estimator overfits them (docs/results.md#odometry-fed-estimator).

    python -m experiments.fit_estimator odometry --checkpoint runs/student/checkpoints/round_014.pt

The simulated worlds' inputs are a large part of that fit's cost (the student drives 4,096 cars through its camera);
`--inputs F` keeps them in F and reads them back on the next fit of the same worlds, so variants of the fit (another
`--estimator.*`, `--steps`) share one drive.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console

from adaptation.estimator_fit import (
    EPISODE_FIELDS,
    EpisodeInputs,
    episode_inputs,
    estimate_sources,
    fit_estimator,
    with_odometry_errors,
)
from adaptation.factor_estimator import EstimatorConfig, FactorEstimator
from adaptation.odometry import OdometryConfig
from adaptation.odometry_errors import odometry_error_model
from adaptation.simulated_worlds import simulated_inputs, simulated_worlds
from datasets.checkpoints import load_checkpoint, save_atomic
from datasets.run_layout import estimator_path, recorded_data
from envs.config_io import to_yaml
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.pure_pursuit import pure_pursuit_cars
from experiments.cli import run
from student.dagger import bf16_enabled
from student.loaded import STUDENT_KIND, load_student
from teacher.policy import load_teacher


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
    sim_driver: Literal["teacher", "student", "both"] = "teacher"
    """odometry estimators: who drives the simulated worlds: the teacher (without a camera, blind to the factors), the
    student itself through its camera (the driving the estimator will read online), or half the cars each"""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bfloat16 autocast for the student's pass over the recorded episodes (auto: on CPUs with native bf16, as
    DAgger trains)"""
    batch: int = 32
    """windows per gradient step"""
    error_drive_envs: int = 64
    """odometry estimators: pure-pursuit cars on the run's camera env whose odometry errors the simulated worlds get"""
    error_drive_steps: int = 160
    """frames per car of that drive"""
    inputs: str = ""
    """odometry estimators: a file for the simulated worlds' inputs: read when it holds the same worlds (same policy,
    teacher, `--sim-*`, `--seed`, `--error-drive-*`; any other is refused), else generated and written there
    atomically, so variants of the fit share one drive"""

    def __post_init__(self) -> None:
        check_range("steps", self.steps, 1, 10_000_000)
        check_range("batch", self.batch, 1, 100_000)
        check_range("sim_envs", self.sim_envs, 0, 1_000_000)
        check_range("sim_seconds", self.sim_seconds, 0.1, 3600.0)
        check_range("error_drive_envs", self.error_drive_envs, 1, 100_000)
        check_range("error_drive_steps", self.error_drive_steps, 2, 100_000)
        if self.estimator.motion == "odometry" and self.sim_envs <= 0:
            raise ConfigError(
                "--estimator.motion odometry trains on simulated worlds only (the recorded episodes hold the history "
                "encoder's motion estimates, not odometry): give --sim-envs N"
            )
        if self.inputs and self.estimator.motion != "odometry":
            raise ConfigError("--inputs: only an estimator that reads odometry is fitted on simulated worlds alone")
        if self.sim_driver != "teacher" and self.estimator.motion != "odometry":
            raise ConfigError(
                f"--sim-driver {self.sim_driver}: only an estimator that reads odometry (--estimator.motion odometry) "
                "has the student drive its simulated worlds"
            )


def odometry_worlds(teacher, student, env_cfg, cfg: FitEstimatorConfig, extra: dict) -> EpisodeInputs:
    """Simulated worlds for an estimator that reads odometry: `cfg.sim_envs` cars driven by the `teacher` (blind to
    the factors), the `student` (through its camera) or half each (`cfg.sim_driver`) with exact odometry, given the
    errors the default odometry makes on a pure-pursuit drive of the run's camera env
    (`adaptation.odometry_errors.odometry_error_model`); the errors' summary goes into `extra`."""
    steps = max(1, int(round(cfg.sim_seconds * env_cfg.control_hz)))
    by_student = {"teacher": 0, "student": cfg.sim_envs, "both": cfg.sim_envs // 2}[cfg.sim_driver]
    parts = []
    if cfg.sim_envs - by_student > 0:
        parts.append(simulated_inputs(teacher, env_cfg, None, cfg.sim_envs - by_student, steps, seed=cfg.seed + 1))
    if by_student > 0:
        first = int(parts[0].episode.max()) + 1 if parts else 0
        parts.append(
            simulated_inputs(student, env_cfg, None, by_student, steps, seed=cfg.seed + 3, first_episode=first,
                             camera=True)
        )  # fmt: skip
    exact = EpisodeInputs.cat(parts)
    drive = pure_pursuit_cars(env_cfg, cfg.error_drive_envs, cfg.seed)
    errors, extra["odometry_errors"] = odometry_error_model(*drive, OdometryConfig(), cfg.error_drive_steps)
    return with_odometry_errors(exact, errors, seed=cfg.seed + 2)


def fit_progress(console: Console, steps: int):
    """A `fit_estimator` progress callback that prints the step, the mean loss and the time left (a long fit would
    otherwise run silent for most of an hour)."""
    start = time.time()

    def report(step: int, loss: float) -> None:
        spent = time.time() - start
        console.print(
            f"fit step {step:,}/{steps:,}: loss {loss:.4f}, {spent:.0f} s, "
            f"about {spent * (steps - step) / step:.0f} s left"
        )

    return report


INPUTS_KIND = "fit_estimator_inputs"


def worlds_key(student, teacher_path: str, cfg: FitEstimatorConfig) -> dict:
    """What an odometry fit's simulated worlds depend on: the student's policy weights (not its estimator, which feeds
    nothing back) and env, the teacher when it drives, and the flags that shape the worlds."""
    digest = hashlib.sha256(to_yaml(student.env_cfg).encode())
    for name, tensor in sorted(student.model.state_dict().items()):
        if not name.startswith("estimator."):
            digest.update(name.encode())
            digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return {
        "policy": digest.hexdigest(),
        "teacher": teacher_path if cfg.sim_driver != "student" else "",
        **{k: getattr(cfg, k) for k in ("sim_envs", "sim_seconds", "sim_driver", "seed", "error_drive_envs",
                                        "error_drive_steps")},
    }  # fmt: skip


def cached_worlds(path: Path, key: dict) -> tuple[EpisodeInputs, dict] | None:
    """The inputs saved at `path` (None when there is no file); refused by name when made for other worlds."""
    if not path.is_file():
        return None
    saved = load_checkpoint(path, kind=INPUTS_KIND, required=("key", "data", "odometry_errors"))
    differ = [f"{k} {saved['key'].get(k)!r} (now {v!r})" for k, v in key.items() if saved["key"].get(k) != v]
    if differ:
        raise ConfigError(f"--inputs {path}: made for other simulated worlds: {', '.join(differ)}; give another file")
    return EpisodeInputs(*(saved["data"][k] for k in EPISODE_FIELDS)), saved["odometry_errors"]


def main(cfg: FitEstimatorConfig) -> dict:
    if cfg.estimator.kind == "none":
        raise ConfigError("--estimator.kind none: nothing to fit")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    odometry = cfg.estimator.motion == "odometry"
    if odometry and not cfg.checkpoint:
        raise ConfigError("--checkpoint is required (a student checkpoint from experiments.distill_student)")
    ckpt = Path(cfg.checkpoint)
    data_dir = None if odometry else recorded_data(cfg.checkpoint, cfg.data_dir)  # odometry: simulated worlds only
    out = Path(cfg.out) if cfg.out else estimator_path(ckpt)
    console = make_console()
    student = load_student(ckpt)
    model = student.model
    if model.history is None:
        raise ConfigError(f"{ckpt}: a student without a history encoder has no motion estimates to read")
    torch.manual_seed(cfg.seed)
    if model.estimator is None or cfg.new or model.estimator.cfg.motion != cfg.estimator.motion:
        model.cfg = replace(model.cfg, estimator=cfg.estimator)
        model.estimator = FactorEstimator(
            cfg.estimator, model.spec.latency_classes["action_latency"], model.spec.latency_classes["camera_latency"]
        )
    t0 = time.time()
    driver, teacher_path = None, ""
    if cfg.sim_envs > 0 and not (odometry and cfg.sim_driver == "student"):
        teacher_path = cfg.teacher or str(load_checkpoint(ckpt, kind=STUDENT_KIND)["teacher_path"])
        if not teacher_path:
            raise ConfigError(f"{ckpt} names no teacher; give --teacher to drive the simulated worlds")
        driver = load_teacher(teacher_path)
    dt = student.env_cfg.dt_physics
    extra: dict = {}
    if odometry:
        key = worlds_key(student, teacher_path, cfg) if cfg.inputs else {}
        cached = cached_worlds(Path(cfg.inputs), key) if cfg.inputs else None
        if cached is not None:
            data, extra["odometry_errors"] = cached
            console.print(f"simulated worlds' inputs read from {cfg.inputs}")
        else:
            data = odometry_worlds(driver, load_student(ckpt), student.env_cfg, cfg, extra)
            if cfg.inputs:
                fields = {k: getattr(data, k) for k in EPISODE_FIELDS}
                blob = {"kind": INPUTS_KIND, "key": key, "data": fields, "odometry_errors": extra["odometry_errors"]}
                save_atomic(blob, cfg.inputs)
        t1 = time.time()
        stats = fit_estimator(
            model.estimator, data, dt, steps=cfg.steps, batch=cfg.batch, seed=cfg.seed,
            progress=fit_progress(console, cfg.steps),
        )  # fmt: skip
    else:
        data = episode_inputs(model, data_dir, bf16=bf16_enabled(cfg.bf16))
        simulated = simulated_worlds(driver, student.env_cfg, data, cfg.sim_envs, cfg.sim_seconds, seed=cfg.seed + 1)
        t1 = time.time()
        stats = fit_estimator(
            model.estimator, data, dt, steps=cfg.steps, batch=cfg.batch, seed=cfg.seed, simulated=simulated,
            progress=fit_progress(console, cfg.steps),
        )  # fmt: skip
        stats.update({f"sources/{k}": v for k, v in estimate_sources(data).items()})
    t2 = time.time()
    saved = load_checkpoint(ckpt, kind=STUDENT_KIND)
    saved["model"] = model.state_dict()
    saved["student_yaml"] = to_yaml(model.cfg)
    saved["estimator_fit"] = json.dumps(
        {**stats, **extra, "steps": cfg.steps, "data_dir": str(data_dir or ""), "sim_envs": cfg.sim_envs}
    )
    save_atomic(saved, out)
    stats.update({"inputs_s": t1 - t0, "fit_s": t2 - t1, "rows": float(len(data.episode))})
    if odometry:
        e = extra["odometry_errors"]
        console.print(
            f"odometry errors on {e['episodes']} drive episodes ({e['frames']:,} frames, {e['seconds']:.0f} s; "
            "normalized): gain " + ", ".join(f"{k} {v:.2f}" for k, v in e["gain"].items())
            + "; residual std " + ", ".join(f"{k} {v:.3f}" for k, v in e["residual_std"].items())
        )  # fmt: skip
        drivers = {"teacher": "the teacher", "student": "the student", "both": "the teacher and the student"}
        kind = f" simulated (driven by {drivers[cfg.sim_driver]}; 1 in 10 held out; odometry with its errors)"
    else:
        kind = "" if "simulated_episodes" not in stats else f" + {int(stats['simulated_episodes'])} simulated"
    console.print(
        f"{int(stats['episodes'])} episodes{kind}, {len(data.episode):,} rows: inputs {t1 - t0:.0f} s, "
        f"fit {t2 - t1:.0f} s"
    )
    for part in ("train", "heldout", "heldout_after"):
        row = ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in stats.items() if k.startswith(part + "/"))
        console.print(f"{part}: {row}")
    for part in ("truth", "commands", "both") if not odometry else ():
        row = ", ".join(f"{k.split('/')[2]} {v:.2f}" for k, v in stats.items() if k.startswith(f"sources/{part}/"))
        console.print(f"motion estimates (R² after 2 s) from {part}: {row}")
    console.print(f"student with the fitted estimator: [bold]{out.resolve()}[/]")
    return stats


PRESETS = {
    "default": ("fit the factor estimator on the run's recorded episodes", FitEstimatorConfig()),
    "odometry": (
        "a new 64-channel estimator over 63 steps of planar odometry, fitted on 4,096 cars' simulated worlds that the "
        "student drives, with the odometry's errors",
        FitEstimatorConfig(
            estimator=EstimatorConfig(motion="odometry", dilations=(1, 2, 4, 8, 16), channels=64),
            new=True,
            sim_envs=4096,
            sim_driver="student",
            steps=12000,
            batch=128,
        ),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
