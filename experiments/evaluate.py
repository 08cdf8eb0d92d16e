"""Evaluate any saved policy: fixed seeds, several start points, both directions; table + JSON + trajectory plots.

    python -m experiments.evaluate default --checkpoint runs/teacher/checkpoints/iter_000100.pt
    python -m experiments.evaluate default --checkpoint ... --tracks oval technical --conditions nominal
    python -m experiments.evaluate default --checkpoint ... --physics genesis
    python -m experiments.evaluate robust --checkpoint runs/student/checkpoints/round_014.pt   # sim and proxy
    python -m experiments.evaluate proxy --checkpoint ... --reality.variant office-corridor
    python -m experiments.evaluate default --task bimanual-lift --checkpoint runs/student-bimanual-lift/checkpoints/...

`--world sim` runs the training sim: `--conditions train` uses the randomization the policy was trained with
(latency, friction, gains, action noise), `nominal` switches every randomization off, `--action-noise x` adds action
noise up to x. `--world proxy` runs the held-out reality proxy (`--reality.*`, see envs/racing/reality.py);
`--world both` runs both with the same episode plan, so the gap is one subtraction.

Another task (`--task bimanual-lift`) is evaluated through the task contract: fixed-seed episodes of its own
evaluation (`--eval.*`: episodes, seed, randomize), its metrics with their Wilson intervals, the selection metric by
third of each randomized factor, and for a student its online estimates by time since reset; a task without a reality
proxy refuses `--world proxy` and `both`, naming what is missing.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from envs.bimanual.reality import ArmRealityConfig
from envs.bimanual.task import BimanualEvalConfig
from envs.config_io import to_dict, write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.car import MAX_SPEED_PERCENT_RANGE
from envs.racing.evaluation import EvalConfig, completion_by_factor, failures_by_section
from envs.racing.reality import RealityConfig, reality_env_config
from envs.racing.transfer import NOMINAL
from envs.racing.visualize import plot_trajectories
from envs.task import check_task
from experiments.cli import current_task, run
from student.policies import load_policy
from student.task_evaluation import EpisodeWatch, estimation_table, score_by_factor
from student.task_evaluation import factor_table as task_factor_table
from student.transfer import evaluate_one


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
    """training-sim randomization: as in training, or all off"""
    action_noise: float = -1.0
    """training sim: action noise up to this fraction (robust evaluation uses 0.1); negative = as conditions say"""
    world: Literal["sim", "proxy", "both"] = "sim"
    """the training sim, the held-out reality proxy, or both"""
    reality: RealityConfig = field(default_factory=RealityConfig)
    """the reality proxy (with --world proxy or both)"""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(start_points=8, laps=1, max_seconds=40.0))
    """episodes: start points, directions, repeats, laps, seed"""
    out_dir: str = "outputs/evaluate"
    """where the JSON and plots go"""
    max_speed_percent: float = 100.0
    """the car's maximum-speed setting (%) in every world evaluated, as on the DeepRacer device console: speed commands
    are scaled by it at the car (train with a higher top speed, race with it turned down). A policy trained with the
    setting drawn per env (`--env.randomization.max-speed-percent`) is evaluated at this one setting"""
    estimation: bool = True
    """students: also score the online estimates by time since reset, and run the mid-episode shift tests"""
    estimation_envs: int = 128
    """students: randomized cars (one world each) driven for the estimates by time since reset; an R^2 of a
    per-episode factor such as friction rests on about this many distinct values"""

    def __post_init__(self) -> None:
        check_range("estimation_envs", self.estimation_envs, 1, 100_000)
        check_range("max_speed_percent", self.max_speed_percent, *MAX_SPEED_PERCENT_RANGE)


@dataclass(frozen=True)
class EvaluateTaskConfig:
    """Policy evaluation in a task other than racing, through the task contract."""

    checkpoint: str = ""
    """policy checkpoint (teacher or student)"""
    world: Literal["sim", "proxy", "both"] = "sim"
    """the training sim, or the task's reality proxy (refused while the task has none)"""
    eval: BimanualEvalConfig = field(default_factory=lambda: BimanualEvalConfig(episodes=32))
    """fixed-seed episodes (one per env), the seed, and whether the world is drawn from the training ranges"""
    max_steps: int = 0
    """control steps per episode (0 = the policy's own env config: a student's is DAgger's `steps_per_round`)"""
    out_dir: str = "outputs/evaluate"
    """where the JSON goes"""
    estimation: bool = True
    """students: also score the online estimates by time since reset"""
    reality: ArmRealityConfig = field(default_factory=ArmRealityConfig)
    """the two-arm reality proxy (with --world proxy; see envs/bimanual/reality.py)"""
    part: Literal["all", "dynamics", "perception", "none"] = "all"
    """what of the proxy the world takes: all of it, its dynamics or its perception only, or none (the training sim
    at nominal values); against none the two parts split the gap"""

    def __post_init__(self) -> None:
        check_range("max_steps", self.max_steps, 0, 1_000_000)


def task_main(cfg: EvaluateTaskConfig) -> dict:
    """A task's own evaluation of one policy: metrics, the selection metric by third of each world factor, a student's
    estimates by time since reset; eval.json with every episode."""
    console = make_console()
    policy = load_policy(cfg.checkpoint)
    task = policy.task
    check_task(f"--checkpoint {cfg.checkpoint}", task.name, current_task())
    if cfg.world == "both":
        raise ConfigError(f"--world both: not yet for task {task.name!r}; run --world sim and --world proxy")
    if cfg.world == "proxy" and task.reality_env_config is None:
        raise ConfigError(
            f"--world {cfg.world}: task {task.name!r} has no reality proxy yet (its task entry has no "
            "reality_env_config); evaluate with --world sim"
        )
    env_cfg, eval_cfg, where = policy.env_cfg, cfg.eval, "the training sim"
    if cfg.max_steps > 0:
        env_cfg = task.student_env_config(env_cfg, env_cfg.num_envs, cfg.max_steps)
    if cfg.world == "proxy":
        env_cfg = task.reality_env_config(env_cfg, cfg.reality, cfg.part)
        eval_cfg = replace(cfg.eval, randomize=True)  # the proxy fixes its world; `nominal` would undo it
        where = f"the reality proxy ({cfg.reality.variant}, part {cfg.part})"
    env = task.make_eval_env(env_cfg, eval_cfg)
    policy.check_env(env)
    watch = EpisodeWatch(task, env, policy)
    records = task.run_episodes(watch.act, env, eval_cfg, watch.reset)
    metrics = task.summarize(records, env)
    by_factor = score_by_factor(task, records, watch.worlds)
    primary, metric = task.primary_metric, task.selection_metric
    table = Table(title=f"{Path(cfg.checkpoint).name}: {len(records)} episodes of {task.name} in {where}")
    for col in ("metric", "value"):
        table.add_column(col)
    for name, value in metrics.items():
        table.add_row(name, f"{value:.3g}")
    console.print(table)
    if by_factor:
        console.print(task_factor_table(by_factor, metric, f"{metric} by third of each world factor"))
    results: dict = {
        "checkpoint": cfg.checkpoint, "task": task.name, "world": cfg.world, "metrics": metrics,
        "episodes": [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r for r in records],
        "worlds": watch.worlds, "by_factor": by_factor,
    }  # fmt: skip
    if cfg.world == "proxy":
        results["reality"] = {"part": cfg.part, **to_dict(cfg.reality.resolved())}
    if cfg.estimation:
        results["estimation"] = watch.estimation()
        if results["estimation"]:
            console.print(estimation_table(results["estimation"], task, "online estimates by time since reset"))
    out = Path(cfg.out_dir)
    write_text_atomic(out / "eval.json", json.dumps(results, indent=2))
    lo, hi = metrics.get(f"{primary}_ci_low", float("nan")), metrics.get(f"{primary}_ci_high", float("nan"))
    console.print(
        f"{primary} {metrics[primary]:.0%} (95% CI [{lo:.2f}, {hi:.2f}]); results in [bold]{out.resolve()}[/]"
    )
    return results


def main(cfg: EvaluateConfig | EvaluateTaskConfig) -> dict:
    if not cfg.checkpoint:
        raise ConfigError("--checkpoint is required")
    if isinstance(cfg, EvaluateTaskConfig):
        return task_main(cfg)
    console = make_console()
    policy = load_policy(cfg.checkpoint)
    check_task(f"--checkpoint {cfg.checkpoint}", policy.task.name, current_task())
    policy.env_cfg = replace(policy.env_cfg, max_speed_percent=cfg.max_speed_percent)
    sim = policy.env_cfg
    if cfg.physics:
        sim = replace(sim, physics=cfg.physics)
    if cfg.conditions == "nominal":
        sim = replace(sim, randomization=replace(NOMINAL, direction=sim.randomization.direction))
    if cfg.action_noise >= 0:
        rnd = replace(sim.randomization, action_noise=cfg.action_noise > 0, action_noise_max=cfg.action_noise)
        sim = replace(sim, randomization=rnd)
    worlds = {"sim": replace(sim, compile=False)}
    if cfg.world in ("proxy", "both"):
        worlds["proxy"] = reality_env_config(policy.env_cfg, cfg.reality)
        if cfg.world == "proxy":
            del worlds["sim"]
    out = Path(cfg.out_dir)
    results: dict = {
        "checkpoint": cfg.checkpoint, "conditions": cfg.conditions, "max_speed_percent": cfg.max_speed_percent,
        "worlds": {}, "tracks": {},
    }  # fmt: skip
    speed = f", car at {cfg.max_speed_percent:g}% of its top speed" if cfg.max_speed_percent != 100.0 else ""
    table = Table(title=f"{Path(cfg.checkpoint).name}: {cfg.eval.num_episodes} episodes per row{speed}")
    for col in ("world", "track", "laps (fwd / rev)", "95% CI", "lap time (s)", "lap / optimal", "progress",
                "off-track"):  # fmt: skip
        table.add_column(col)
    names: dict[str, str] = {}  # a track file is named by its stem in tables and plots (eval.json keeps the path)
    for world, base in worlds.items():
        label = f"{world} ({base.physics}/{base.camera})"
        for track in cfg.tracks or (base.track,):
            metrics, records, env = evaluate_one(policy, replace(base, track=track), cfg.eval)
            name = names[track] = env.track.name
            entry = {
                "metrics": metrics,
                "optimal_lap_time": env.optimal_lap_time,
                "episodes": [{k: getattr(r, k) for k in EPISODE_FIELDS} for r in records],
                "by_factor": completion_by_factor(records),
                "failures_by_section": failures_by_section(records),
            }
            results["worlds"].setdefault(world, {})[track] = entry
            if world == next(iter(worlds)):
                results["tracks"][track] = entry
            table.add_row(
                label, name, f"{metrics['forward/lap_completion']:.0%} / {metrics['reverse/lap_completion']:.0%}",
                f"[{metrics['lap_completion_ci_low']:.2f}, {metrics['lap_completion_ci_high']:.2f}]",
                f"{metrics['lap_time']:.2f}", f"{metrics['lap_time_ratio']:.2f}", f"{metrics['progress']:.2f}",
                f"{int(metrics['offtrack_count'])}",
            )  # fmt: skip
            plot_trajectories(
                env.track, [r.path for r in records], out / f"trajectories_{world}_{name}.png",
                colors=["tab:blue" if r.direction == "forward" else "tab:orange" for r in records],
                title=f"{world}, {name}: {metrics['lap_completion']:.0%} laps (blue forward, orange reverse)",
            )  # fmt: skip
            env.close()
    console.print(table)
    for world, tracks in results["worlds"].items():
        for track, entry in tracks.items():
            where = f"{world}, {names[track]}"
            if entry["by_factor"]:
                console.print(factor_table(entry["by_factor"], f"{where}: lap completion by world factor"))
            ended = failure_line(entry["failures_by_section"])
            if ended:
                console.print(f"{where}: failed episodes ended at (tenths of the lap from the start line) {ended}")
    if "sim" in worlds and "proxy" in worlds:
        for track in results["worlds"]["proxy"]:
            s_sim = results["worlds"]["sim"][track]["metrics"]["score"]
            s_proxy = results["worlds"]["proxy"][track]["metrics"]["score"]
            results["worlds"].setdefault("gap", {})[track] = s_sim - s_proxy
            console.print(
                f"{names[track]}: sim-to-proxy gap {s_sim - s_proxy:+.3f} (score: sim {s_sim:.3f}, proxy {s_proxy:.3f})"
            )
    if cfg.estimation and "sim" in worlds and hasattr(policy, "model") and policy.model.history is not None:
        results["estimation"] = online_estimation_report(policy.model, worlds["sim"], console, cfg.estimation_envs)
    write_text_atomic(out / "eval.json", json.dumps(results, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/] (eval.json, trajectories_*.png)")
    return results


EPISODE_FIELDS = ("start", "direction", "success", "lap_time", "progress", "offtrack", "end_position", "factors")
"""what `eval.json` keeps of each episode (`factors`: its world in physical units; `end_position`: lap fraction)"""


def failure_line(by_section: dict[str, list[int]]) -> str:
    """'0.3–0.4: 8 fwd / 0 rev, …' over the sections where any failed episode ended ('' when none did)."""
    dirs = list(by_section)
    if not dirs:
        return ""
    n = len(by_section[dirs[0]])
    short = {"forward": "fwd", "reverse": "rev"}
    parts = []
    for i in range(n):
        if any(by_section[d][i] for d in dirs):
            counts = " / ".join(f"{by_section[d][i]} {short[d]}" for d in dirs)
            parts.append(f"{i / n:.1f}–{(i + 1) / n:.1f}: {counts}")
    return ", ".join(parts)


def factor_table(by_factor: dict[str, list[dict[str, float]]], title: str) -> Table:
    """One row per randomized factor: lap completion in its low / middle / high third (value ranges beside)."""
    table = Table(title=title)
    table.add_column("factor")
    n_bins = max(len(rows) for rows in by_factor.values())
    for i in range(n_bins):
        table.add_column(("low", "middle", "high")[i] if n_bins == 3 else f"bin {i + 1}")
    for name, rows in by_factor.items():
        table.add_row(name, *(f"{r['lap_completion']:.0%} ({r['lo']:.3g}–{r['hi']:.3g})" for r in rows))
    return table


def online_estimation_report(model, env_cfg, console: Console, num_envs: int = 128) -> dict:
    """Estimate quality by time since reset, and friction / latency shifts halfway through an episode."""
    from student.estimation import estimation_by_time, shift_test

    by_time = estimation_by_time(model, env_cfg, num_envs=num_envs)
    table = Table(title="online estimation by time since reset")
    cols = ("action_latency_r2", "loop_latency_r2", "action_latency_within_frame",
            "action_latency_within_frame_constant_guess", "loop_latency_mae_ms", "loop_latency_mae_ms_constant_guess",
            "friction_r2", "motor_gain_r2", "speed_r2", "lateral_speed_r2", "yaw_rate_r2")  # fmt: skip
    table.add_column("time")
    for c in cols:
        table.add_column(c)
    table.add_column("friction_r2 95% CI (over worlds)")
    for key, m in by_time.items():
        lo, hi = m["friction_r2_ci"]
        table.add_row(key, *(f"{m[c]:.2f}" for c in cols), f"[{lo:.2f}, {hi:.2f}]")
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
    "robust": (
        "robust evaluation in the training sim (10% action noise) and in the reality proxy, 20 laps each",
        EvaluateConfig(world="both", action_noise=0.1, eval=EvalConfig(start_points=10, max_seconds=40.0, seed=7)),
    ),
    "proxy": (
        "20 laps in the reality proxy",
        EvaluateConfig(world="proxy", eval=EvalConfig(start_points=10, max_seconds=40.0, seed=7)),
    ),
    "smoke": ("2 start points, short episodes", EvaluateConfig(eval=EvalConfig(start_points=1, max_seconds=5.0))),
}

BIMANUAL_PRESETS = {
    "default": ("32 fixed-seed episodes in the training randomization", EvaluateTaskConfig()),
    "nominal": ("32 fixed-seed episodes with every factor at its nominal value",
                EvaluateTaskConfig(eval=BimanualEvalConfig(episodes=32, randomize=False))),
    "proxy": ("32 fixed-seed episodes in the reality proxy (--reality.variant, --part)",
              EvaluateTaskConfig(world="proxy")),
    "smoke": ("2 episodes (checks the pipeline)", EvaluateTaskConfig(eval=BimanualEvalConfig(episodes=2))),
}  # fmt: skip

if __name__ == "__main__":
    run(
        main,
        {"racing": PRESETS, "bimanual-lift": BIMANUAL_PRESETS, "bimanual-handover": BIMANUAL_PRESETS},
        description=__doc__,
    )
