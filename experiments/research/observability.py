"""Ceiling of the student's online estimate: regress a dynamics factor from the car's true state and commands.

    python -m experiments.research.observability default --teacher runs/teacher/checkpoints/iter_000256.pt
    python -m experiments.research.observability default --teacher … --factor motor_gain --no-blind
    python -m experiments.research.observability default --run-dir runs/student
    python -m experiments.research.observability default --teacher … --windows 30 --motion-r2 0.99 0.95 0.9

The teacher drives its own training world (no camera) with the factor's input held at nominal (`--blind`, so its
commands do not carry the true value); an MLP is fitted on windows of each history length in `--windows` (steps;
how much driving the estimate needs) that end at least `--min-seconds` after a reset, for several feature sets
(commands only; + speed; + yaw rate; the full planar state), and scored on held-out cars. The history encoder sees
only camera frames and its own actions, so its R^2 on the same driving and history cannot beat the full-state
figure: a low student R^2 under a high ceiling is a learning problem, a low ceiling means the driving does not
excite the factor (or the history is too short). With `--run-dir` the same regressor reads a DAgger run's recorded
episodes (commands and true body velocities): what the student could learn from its own data were its motion
estimates exact, which is bounded by how many distinct worlds (episodes) the run saw. `--motion-r2` adds fits from
the commands and body velocities blurred to a given estimate quality (R^2 of each velocity, white noise): how good the
student's motion estimates must be for the factor to show. Writes `observability.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.table import Table

from adaptation.observability import (
    FACTORS,
    FEATURE_SETS,
    SHARD_FEATURES,
    driving_env,
    observability,
    record,
    shard_recording,
)
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.config import EnvConfig
from experiments.cli import run
from teacher.policy import load_teacher


@dataclass(frozen=True)
class ObservabilityConfig:
    """Driving, windows and regressor."""

    teacher: str = ""
    """teacher checkpoint (the driver; its training world is the world)"""
    run_dir: str = ""
    """a DAgger run instead of a teacher: regress from the true body velocities and commands its shards recorded (the
    ceiling of what its student could learn from that data with exact motion estimates)"""
    factor: str = "friction"
    """factor to regress: friction, motor_gain or action_latency (seconds)"""
    blind: bool = True
    """hold the teacher's input of the factor at nominal (1.0; one frame of latency), so its commands do not reveal
    the true value"""
    envs: int = 512
    """cars driving at once (one randomized world each per episode)"""
    seconds: float = 30.0
    """recorded driving per car"""
    windows: tuple[int, ...] = (15, 30, 60)
    """history lengths: steps per regression window (30 = 2 s at 15 Hz), one fit per length and feature set"""
    min_seconds: float = 2.0
    """a window's last step is at least this long after the reset"""
    iterations: int = 3000
    """Adam steps of the regressor, per feature set"""
    motion_r2: tuple[float, ...] = (0.95, 0.9, 0.8)
    """also regress from the commands and the body velocities with white noise added so that each velocity scores
    this R^2 (as the evaluation scores the student's estimates): how good the motion estimates must be"""
    seed: int = 0
    """seed of the env and the regressor"""
    out_dir: str = "outputs/observability"
    """where the JSON goes"""

    def __post_init__(self) -> None:
        if self.factor not in FACTORS:
            raise ConfigError(f"factor={self.factor!r}; use one of {', '.join(FACTORS)}")
        check_range("envs", self.envs, 5, 1_000_000)
        if not self.windows:
            raise ConfigError("windows is empty; give at least one history length in steps, e.g. --windows 30")
        for w in self.windows:
            check_range("windows", w, 1, 10_000)
        check_range("seconds", self.seconds, 0.1, 3600.0)
        check_range("min_seconds", self.min_seconds, 0.0, 3600.0)
        check_range("iterations", self.iterations, 1, 1_000_000)
        for q in self.motion_r2:
            if not 0.0 < q <= 1.0:
                raise ConfigError(f"motion_r2={q}: each estimate R^2 must be in (0, 1]")


def main(cfg: ObservabilityConfig) -> dict:
    if bool(cfg.teacher) == bool(cfg.run_dir):
        raise ConfigError("give either --teacher (a teacher checkpoint drives the cars) or --run-dir (a DAgger run)")
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    sets = FEATURE_SETS
    if cfg.teacher:
        teacher = load_teacher(cfg.teacher)
        env = driving_env(teacher.env_cfg, cfg.envs)
        hz = env.cfg.control_hz
        rec = record(teacher, env, cfg.factor, steps=int(round(cfg.seconds * hz)), blind=cfg.blind)
        source = f"{cfg.teacher} driving, blind={cfg.blind}"
    else:
        data = Path(cfg.run_dir) / "data"
        if not (data / "manifest.json").is_file():
            raise ConfigError(f"--run-dir {cfg.run_dir}: no data/manifest.json (not a DAgger run directory)")
        rec = shard_recording(data, cfg.factor)
        hz = EnvConfig().control_hz
        sets = {k: v for k, v in FEATURE_SETS.items() if set(v) <= set(SHARD_FEATURES)}
        source = f"{cfg.run_dir}: {rec.features.shape[0]} recorded episodes"
    result = observability(rec, cfg.windows, int(round(cfg.min_seconds * hz)), sets, cfg.iterations,
                           motion_r2=cfg.motion_r2, seed=cfg.seed)  # fmt: skip
    for row in result["history"]:
        row["seconds"] = row["steps"] / hz
    result.update(factor=cfg.factor, blind=cfg.blind, teacher=cfg.teacher, run_dir=cfg.run_dir, source=source,
                  seconds=time.perf_counter() - t0, min_seconds=cfg.min_seconds)  # fmt: skip
    console = make_console()
    table = Table(title=f"{cfg.factor}: held-out R² (train R²) from the true state, by history length ({source})")
    table.add_column("features")
    for row in result["history"]:
        table.add_column(f"{row['seconds']:.1f} s ({row['windows']:,} windows)")
    for name in result["feature_sets"]:
        cells = [f"{row[name]['test_r2']:.3f} ({row[name]['train_r2']:.2f})" for row in result["history"]]
        table.add_row(name, *cells)
    console.print(table)
    g = result["grip_use_percentiles"]
    console.print(f"lateral acceleration / grip: median {g['p50']:.2f}, p90 {g['p90']:.2f}, p99 {g['p99']:.2f}")
    out = Path(cfg.out_dir)
    write_text_atomic(out / "observability.json", json.dumps(result, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/]")
    return result


PRESETS = {
    "default": ("512 cars, 30 s each, 1, 2 and 4 s of history, 3000 regressor steps", ObservabilityConfig()),
    "smoke": (
        "few cars, short driving",
        ObservabilityConfig(envs=10, seconds=3.0, windows=(3, 5), min_seconds=0.5, iterations=20),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
