"""Evaluate any saved policy: fixed seeds, several start points, both directions; table + JSON + trajectory plots.

    python -m experiments.evaluate default --checkpoint runs/teacher/checkpoints/iter_000100.pt
    python -m experiments.evaluate default --checkpoint ... --tracks oval technical --conditions nominal
    python -m experiments.evaluate default --checkpoint ... --physics genesis

`--conditions train` uses the randomization the policy was trained with (latency, friction, gains, action noise);
`nominal` switches every randomization off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from datasets.checkpoints import CheckpointError, load_checkpoint
from envs.config_io import write_text_atomic
from envs.errors import ConfigError
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EvalConfig, evaluate, evaluation_env_config
from envs.racing.randomization import RandomizationConfig
from envs.racing.visualize import plot_trajectories
from experiments.cli import run
from student.loaded import STUDENT_KIND, load_student
from teacher.policy import TEACHER_KIND, load_teacher

NOMINAL = RandomizationConfig(
    friction=False, mass=False, motor_gain=False, steering_gain=False, steering_offset=False, action_latency=False,
    camera_latency=False, action_noise=False, visual=False, random_start=False,
)  # fmt: skip


@dataclass(frozen=True)
class EvaluateConfig:
    """Policy evaluation."""

    checkpoint: str = ""
    """policy checkpoint (teacher or student)"""
    tracks: tuple[str, ...] = ()
    """tracks to evaluate on (empty = the track the policy trained on)"""
    physics: str = ""
    """physics backend override (bicycle | genesis); empty = as trained"""
    conditions: Literal["train", "nominal"] = "train"
    """world randomization: as in training, or all off"""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(start_points=8, laps=1, max_seconds=40.0))
    """episodes: start points, directions, repeats, laps, seed"""
    out_dir: str = "outputs/evaluate"
    """where the JSON and plots go"""
    estimation: bool = True
    """students: also score the online estimates by time since reset, and run the mid-episode shift tests"""


def load_policy(path: str):
    """Any saved policy -> an object with `.act(obs)`, `.env_cfg`, `.check_env(env)` (and `.reset(dones)` if it has
    recurrent state)."""
    data = load_checkpoint(path)
    kind = data.get("kind")
    if kind == TEACHER_KIND:
        return load_teacher(path)
    if kind == STUDENT_KIND:
        return load_student(path)
    raise CheckpointError(f"{path}: unknown policy kind {kind!r}")


def main(cfg: EvaluateConfig) -> dict:
    if not cfg.checkpoint:
        raise ConfigError("--checkpoint is required")
    console = Console()
    policy = load_policy(cfg.checkpoint)
    base = policy.env_cfg
    if cfg.physics:
        base = replace(base, physics=cfg.physics)
    if cfg.conditions == "nominal":
        base = replace(base, randomization=replace(NOMINAL, direction=base.randomization.direction))
    base = replace(base, compile=False)
    out = Path(cfg.out_dir)
    results: dict = {"checkpoint": cfg.checkpoint, "conditions": cfg.conditions, "tracks": {}}
    table = Table(title=f"{Path(cfg.checkpoint).name}: {cfg.conditions} conditions, {base.physics} physics")
    for col in ("track", "laps (fwd / rev)", "95% CI", "lap time (s)", "lap / optimal", "progress", "off-track"):
        table.add_column(col)
    for track in cfg.tracks or (base.track,):
        env_cfg = replace(base, track=track)
        env = RacingEnv(evaluation_env_config(env_cfg, cfg.eval))
        policy.check_env(env)
        reset = getattr(policy, "reset", None)
        metrics, records, env = evaluate(policy.act, env_cfg, cfg.eval, reset=reset, env=env)
        results["tracks"][track] = {
            "metrics": metrics,
            "optimal_lap_time": env.optimal_lap_time,
            "episodes": [
                {k: getattr(r, k) for k in ("start", "direction", "success", "lap_time", "progress", "offtrack")}
                for r in records
            ],
        }
        table.add_row(
            track, f"{metrics['forward/lap_completion']:.0%} / {metrics['reverse/lap_completion']:.0%}",
            f"[{metrics['lap_completion_ci_low']:.2f}, {metrics['lap_completion_ci_high']:.2f}]",
            f"{metrics['lap_time']:.2f}", f"{metrics['lap_time_ratio']:.2f}", f"{metrics['progress']:.2f}",
            f"{int(metrics['offtrack_count'])}",
        )  # fmt: skip
        plot_trajectories(
            env.track, [r.path for r in records], out / f"trajectories_{track.replace('/', '_')}.png",
            colors=["tab:blue" if r.direction == "forward" else "tab:orange" for r in records],
            title=f"{track}: {metrics['lap_completion']:.0%} laps completed (blue forward, orange reverse)",
        )  # fmt: skip
        env.close()
    console.print(table)
    if cfg.estimation and hasattr(policy, "model") and policy.model.history is not None:
        results["estimation"] = online_estimation_report(policy.model, base, console)
    write_text_atomic(out / "eval.json", json.dumps(results, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/] (eval.json, trajectories_*.png)")
    return results


def online_estimation_report(model, env_cfg, console: Console) -> dict:
    """Estimate quality by time since reset, and friction / latency shifts halfway through an episode."""
    from adaptation.evaluation import estimation_by_time, shift_test

    by_time = estimation_by_time(model, env_cfg)
    table = Table(title="online estimation by time since reset")
    cols = ("action_latency_within_frame", "loop_latency_within_frame", "loop_latency_mae_ms", "friction_r2",
            "motor_gain_r2", "speed_r2")  # fmt: skip
    table.add_column("time")
    for c in cols:
        table.add_column(c)
    for key, m in by_time.items():
        table.add_row(key, *(f"{m[c]:.2f}" for c in cols))
    console.print(table)
    shifts = {
        "friction": shift_test(model, env_cfg, "friction", 1.1, 0.65),
        "action_latency": shift_test(model, env_cfg, "action_latency", 0.0, 0.1),
    }
    for name, r in shifts.items():
        console.print(
            f"shift {name} {r['before']} -> {r['after']} at {r['shift_step'] / r['control_hz']:.0f} s: estimate "
            f"{r['estimate_before_shift']:.3f} -> {r['estimate_end']:.3f}, 80% followed after "
            f"{r['seconds_to_follow_80pct']} s; off-track before/after: {r['offtrack_before']}/{r['offtrack_after']}"
        )
    return {"by_time_since_reset": by_time, "shift": shifts}


PRESETS = {
    "default": ("8 start points x 2 directions, 1 lap each", EvaluateConfig()),
    "smoke": ("2 start points, short episodes", EvaluateConfig(eval=EvalConfig(start_points=1, max_seconds=5.0))),
}

if __name__ == "__main__":
    run(main, PRESETS, description=__doc__)
