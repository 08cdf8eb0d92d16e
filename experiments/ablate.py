"""Ablations: run named variants of a teacher or student training with the same budget, one table at the end.

    python -m experiments.ablate student --teacher runs/teacher/checkpoints/iter_000400.pt \\
        --variants base beta-zero no-history no-augment
    python -m experiments.ablate teacher --variants base no-reverse no-random-start no-noise dropout-0.3

Each variant is a set of field overrides of the stage's config (see VARIANTS); the DeepRacer team's findings map
onto them (reversed direction, random starts, action noise, augmentation types, dropout, entropy, max throttle).
With `--proxy`, every variant's final policy is also evaluated in the reality proxy (`--proxy-reality.*`,
`--proxy-eval.*`), which is where the transfer findings (augmentation, dropout, entropy, max throttle) show: the
training sim cannot tell them apart. `--proxy-top-speed 2.8` races every variant there at the same top speed through
the car's maximum-speed setting (the fast-throttle variant at 78%), as the DeepRacer team raced models trained with a
higher max throttle. The proxy result is kept next to the run (`proxy.json`) and read back while the checkpoint and
proxy settings are the same.

Results: `ablation.json` and `ablation.md` in the output directory.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from envs.augment import AugmentConfig
from envs.config_io import to_yaml, write_text_atomic
from envs.errors import ConfigError, check_range
from envs.racing.evaluation import EvalConfig
from envs.racing.reality import RealityConfig, reality_env_config
from experiments import distill_student, train_teacher
from experiments.cli import run
from experiments.wandb_logger import WandbConfig
from student.dagger import DaggerConfig

VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "teacher": {
        "base": {},
        "no-reverse": {"env.randomization.direction": "forward"},
        "no-random-start": {"env.randomization.random_start": False},
        "no-noise": {"env.randomization.action_noise": False},
        "no-latency": {"env.randomization.action_latency": False, "env.randomization.camera_latency": False},
        "dropout-0.3": {"policy.dropout": 0.3},
        "entropy-0.01": {"ppo.entropy_coef": 0.01},
        "fast-throttle": {"env.action_space": "fast-throttle"},
        "blind-to-grip": {"policy.hidden_factors": ("friction", "mass_scale", "motor_gain")},
    },
    "student": {
        "base": {},
        "beta-zero": {"dagger.beta": "zero"},
        "beta-exponential": {"dagger.beta": "exponential"},
        "gating": {"dagger.gating": True},
        "no-history": {"student.history.kind": "none"},
        "gru-history": {"student.history.kind": "gru"},
        "no-factor-estimator": {"student.estimator.kind": "none"},
        "motion-encoder": {"student.encoder.motion": True},
        "no-augment": {"augment": AugmentConfig.off()},
        "color-only": {"augment": AugmentConfig.only("color")},
        "translate-only": {"augment": AugmentConfig.only("translate")},
        "shadow-only": {"augment": AugmentConfig.only("shadow")},
        "sharpen-only": {"augment": AugmentConfig.only("sharpen")},
        "noise-only": {"augment": AugmentConfig.only("noise")},
        "dropout-0.3": {"student.head_dropout": 0.3},
        "low-grip-data": {"dagger.low_grip_share": 0.5},
        "dense-encoder-gradient": {"dagger.cnn_grad_stride": 1},
    },
}


SHORT = {
    "lap_completion": "laps", "forward/lap_completion": "fwd", "reverse/lap_completion": "rev",
    "lap_completion_ci_low": "CI lo", "lap_completion_ci_high": "CI hi", "completion_vs_teacher": "laps/teacher",
    "lap_time_vs_teacher": "time/teacher", "teacher_lap_completion": "teacher", "offtrack_count": "off",
    "dagger_minutes": "min", "lap_time_ratio": "time/opt", "minutes": "min", "proxy/lap_completion": "proxy laps",
    "proxy/lap_completion_ci_low": "proxy lo", "proxy/lap_completion_ci_high": "proxy hi",
    "proxy/progress": "proxy progress", "proxy/lap_time_ratio": "proxy time/opt", "proxy/offtrack_count": "proxy off",
    "proxy/max_speed_percent": "proxy speed %",
}  # fmt: skip
"""terminal column headers (the Markdown and JSON keep the full names)"""


def apply_overrides(cfg: Any, overrides: dict[str, Any]) -> Any:
    """Frozen-dataclass `replace` along dotted paths, e.g. {"env.randomization.direction": "forward"}."""
    for path, value in overrides.items():
        head, _, rest = path.partition(".")
        if not dataclasses.is_dataclass(cfg) or head not in {f.name for f in dataclasses.fields(cfg)}:
            raise ConfigError(f"ablation override {path!r}: no field {head!r} in {type(cfg).__name__}")
        cfg = replace(cfg, **{head: apply_overrides(getattr(cfg, head), {rest: value}) if rest else value})
    return cfg


@dataclass(frozen=True)
class AblateConfig:
    """Which stage, which variants, what budget."""

    stage: Literal["teacher", "student"] = "student"
    """what to ablate"""
    variants: tuple[str, ...] = ("base",)
    """variant names (see VARIANTS)"""
    teacher: str = ""
    """teacher checkpoint (student stage)"""
    teacher_cfg: train_teacher.TrainTeacherConfig = field(
        default_factory=lambda: replace(train_teacher.PRESETS["default"][1], generalization_tracks=())
    )
    """base teacher run"""
    student_cfg: distill_student.DistillConfig = field(
        default_factory=lambda: replace(distill_student.PRESETS["default"][1], dagger=DaggerConfig(rounds=6))
    )
    """base student run (every variant gets the same budget)"""
    out_dir: str = "runs/ablation"
    """one run directory per variant under here, plus ablation.json / ablation.md"""
    wandb: WandbConfig = field(default_factory=lambda: WandbConfig(mode="offline"))
    """W&B settings of every variant's run (each gets the group `ablation-<stage>` and its name as a tag)"""
    proxy: bool = False
    """also evaluate every variant's final policy in the reality proxy (adds the proxy/* columns)"""
    proxy_reality: RealityConfig = field(default_factory=RealityConfig)
    """the reality proxy of that evaluation"""
    proxy_eval: EvalConfig = field(default_factory=lambda: EvalConfig(start_points=10, max_seconds=40.0, seed=7))
    """its episodes (default: 10 start points x both directions, 1 lap each)"""
    proxy_top_speed: float = 0.0
    """race every variant in the proxy at this top speed (m/s) through the car's maximum-speed setting, as the DeepRacer
    team raced models trained with a higher max throttle (2.8: the fast-throttle variant, 3.6 m/s, at 78%); 0 = each
    variant at its own action space's top speed"""

    def __post_init__(self) -> None:
        check_range("proxy_top_speed", self.proxy_top_speed, 0.0, 20.0)


def _row(stage: str, summary: dict, track: str) -> dict[str, float]:
    """One table row from a run's `eval.json` summary."""
    if stage == "teacher":
        m = summary[f"eval/{track}"]
        row = {k: m[k] for k in ("lap_completion", "forward/lap_completion", "reverse/lap_completion")}
        row |= {k: m[k] for k in ("lap_completion_ci_low", "lap_completion_ci_high", "lap_time_ratio")}
        row["minutes"] = summary["wall_minutes"]
        return row
    s, t = summary["student"], summary["teacher"]
    return {
        "lap_completion": s["lap_completion"],
        "forward/lap_completion": s["forward/lap_completion"],
        "reverse/lap_completion": s["reverse/lap_completion"],
        "lap_completion_ci_low": s["lap_completion_ci_low"],
        "lap_completion_ci_high": s["lap_completion_ci_high"],
        "completion_vs_teacher": summary["completion_ratio"],
        "lap_time_vs_teacher": summary["lap_time_ratio_vs_teacher"],
        "teacher_lap_completion": t["lap_completion"],
        "offtrack_count": s["offtrack_count"],
        "dagger_minutes": summary["dagger_minutes"],
    }


PROXY_KEYS = (
    "lap_completion", "lap_completion_ci_low", "lap_completion_ci_high", "progress", "lap_time_ratio", "offtrack_count"
)  # fmt: skip


def proxy_row(cfg: AblateConfig, run_dir: Path) -> dict[str, float]:
    """The proxy columns of a finished variant: its final checkpoint evaluated in `cfg.proxy_reality`, read back from
    `proxy.json` when that was written for the same checkpoint and settings."""
    from experiments.evaluate import evaluate_one, load_policy

    pattern = "iter_*.pt" if cfg.stage == "teacher" else "round_*.pt"
    checkpoints = sorted((run_dir / "checkpoints").glob(pattern))
    if not checkpoints:
        raise ConfigError(f"{run_dir}: no checkpoints/{pattern} to evaluate in the reality proxy")
    policy = load_policy(str(checkpoints[-1]))
    top = policy.action_space.max_speed
    percent = min(100.0, 100.0 * cfg.proxy_top_speed / top) if cfg.proxy_top_speed > 0 else 100.0
    key = {
        "checkpoint": checkpoints[-1].name, "reality": to_yaml(cfg.proxy_reality), "eval": to_yaml(cfg.proxy_eval),
        "columns": list(PROXY_KEYS), **({"max_speed_percent": percent} if cfg.proxy_top_speed > 0 else {}),
    }  # fmt: skip
    path = run_dir / "proxy.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return saved["row"]
    if percent < 10.0:
        raise ConfigError(
            f"--proxy-top-speed {cfg.proxy_top_speed} is below 10% of {run_dir.name}'s top speed ({top} m/s)"
        )
    policy.env_cfg = replace(policy.env_cfg, max_speed_percent=percent)
    metrics, _, env = evaluate_one(policy, reality_env_config(policy.env_cfg, cfg.proxy_reality), cfg.proxy_eval)
    env.close()
    row = {f"proxy/{k}": float(metrics[k]) for k in PROXY_KEYS}
    if cfg.proxy_top_speed > 0:
        row["proxy/max_speed_percent"] = percent
    write_text_atomic(path, json.dumps({"key": key, "row": row}, indent=2))
    return row


def run_variant(cfg: AblateConfig, name: str) -> dict[str, float]:
    """Train one variant, or read it back: a finished variant (its `eval.json` written under the same config) is not
    run again, and one that was stopped part-way resumes from its latest checkpoint, so a killed ablation continues
    where it stopped."""
    overrides = VARIANTS[cfg.stage][name]
    wandb = replace(cfg.wandb, group=f"ablation-{cfg.stage}", tags=(name,))
    run_dir = Path(cfg.out_dir) / name
    if cfg.stage == "teacher":
        stage, base = train_teacher, apply_overrides(cfg.teacher_cfg, overrides)
        has_checkpoint = any((run_dir / "checkpoints").glob("iter_*.pt"))
    else:
        stage, base = distill_student, apply_overrides(replace(cfg.student_cfg, teacher=cfg.teacher), overrides)
        has_checkpoint = any((run_dir / "checkpoints").glob("round_*.pt"))
    run_cfg = replace(base, run_dir=str(run_dir), wandb=wandb, resume="")
    resumed_cfg = replace(run_cfg, resume=str(run_dir))
    track = run_cfg.env.track if cfg.stage == "teacher" else ""
    written = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else None
    if written is not None and written not in (to_yaml(run_cfg), to_yaml(resumed_cfg)):
        raise ConfigError(
            f"ablation variant {name!r}: {run_dir} holds a run with another configuration; "
            "use another --out-dir (or remove that directory) to run this one"
        )
    if written is not None and (run_dir / "eval.json").exists():
        row = _row(cfg.stage, json.loads((run_dir / "eval.json").read_text()), track)
    else:
        row = _row(cfg.stage, stage.main(resumed_cfg if has_checkpoint else run_cfg), track)
    return row | proxy_row(cfg, run_dir) if cfg.proxy else row


def main(cfg: AblateConfig) -> dict:
    unknown = [v for v in cfg.variants if v not in VARIANTS[cfg.stage]]
    if unknown:
        raise ConfigError(f"unknown {cfg.stage} variants {unknown}; known: {sorted(VARIANTS[cfg.stage])}")
    if cfg.stage == "student" and not cfg.teacher:
        raise ConfigError("--teacher is required for student ablations")
    results = {name: run_variant(cfg, name) for name in cfg.variants}
    cols = list(next(iter(results.values())))
    table = Table(title=f"{cfg.stage} ablation")
    table.add_column("variant")
    for c in cols:
        table.add_column(SHORT.get(c, c), justify="right")
    if cfg.stage == "student":
        budget = f"{cfg.student_cfg.dagger.rounds} DAgger rounds each, teacher {cfg.teacher}"
    else:
        trainer = cfg.teacher_cfg.trainer
        budget = f"{trainer.iterations} PPO iterations each"
        if trainer.max_minutes > 0:
            budget += f", or {trainer.max_minutes:g} minutes of wall time if that comes first"
    lines = [f"{cfg.stage} ablation, {budget}", ""]
    if cfg.proxy:
        r = cfg.proxy_reality
        lines[-1:] = [
            f"proxy/*: the final policy in the reality proxy (variant {r.variant}, {r.physics} physics, {r.camera} "
            f"camera, {r.lens} lens), {cfg.proxy_eval.num_episodes} episodes",
            "",
        ]
    lines += ["| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, row in results.items():
        cells = [f"{row[c]:.3f}" for c in cols]
        table.add_row(name, *cells)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    Console().print(table)
    out = Path(cfg.out_dir)
    write_text_atomic(out / "ablation.json", json.dumps(results, indent=2))
    write_text_atomic(out / "ablation.md", "\n".join(lines) + "\n")
    return results


PRESETS = {
    "student": ("DAgger variants with the same budget", AblateConfig(stage="student")),
    "teacher": ("PPO variants with the same budget", AblateConfig(stage="teacher")),
}

if __name__ == "__main__":
    run(main, PRESETS, description=__doc__)
