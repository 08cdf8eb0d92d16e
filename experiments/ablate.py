"""Ablations: run named variants of a teacher or student training with the same budget, one table at the end.

    python -m experiments.ablate student --teacher runs/teacher/teacher.pt \\
        --variants base beta-zero no-history no-augment
    python -m experiments.ablate teacher --variants base no-reverse no-random-start no-noise dropout-0.3
    python -m experiments.ablate student --teacher … --student-args "default --dagger.rounds 10"   # another budget

Each variant is a list of override flags of the stage's script (see VARIANTS), appended to the base run's preset and
flags (`--teacher-args`, `--student-args`); the DeepRacer team's findings map onto them (reversed direction, random
starts, action noise, augmentation types, dropout, entropy, max throttle). Every variant trains in its own process
(`python -m experiments.train_teacher` / `experiments.distill_student`, its run directory `<out-dir>/<variant>`), and
its row is read back from that run's `eval.json`. A finished variant is not run again, one that was stopped part-way
resumes from its latest checkpoint (the command each variant ran is kept in its run directory, and a directory holding
another command is refused). A variant that fails stops the ablation with one line naming it and its exit code.

Seeds and launchers:

    python -m experiments.ablate teacher --variants base no-noise --seeds 0 1 --launcher local --max-parallel 2
    python -m experiments.ablate student --teacher … --variants base beta-zero --seeds 0 1 2 3 \\
        --launcher slurm --slurm.partition gpu --slurm.gpus-per-job 1 --job-minutes 120 --max-parallel 8

`--seeds` runs every variant once per seed, passing the seed to the stage's seed flags (SEED_FLAGS), each run in
`<out-dir>/<variant>/seed_<S>`; the table then shows each metric's mean ± the half-width of its 95% t-interval over the
seeds, and `ablation.json` also keeps the per-seed rows. Without `--seeds` a variant runs once at the stage's own seed
in `<out-dir>/<variant>`. `--launcher inline` (default) runs the runs one after another from this process;
`local` and `slurm` submit one submitit job per run (logs in `--launcher-dir`, default `<out-dir>/jobs`), the job
running the same `python -m …` command line, at most `--max-parallel` at a time, and wait for them all. With a launcher,
a run that fails does not stop the others: the rows that finished are written, then one line names each failed run
with its exit code and job log, and the ablation exits non-zero. A sweep run again submits only what is missing.

With `--proxy`, every variant's final policy is also evaluated in the reality proxy (`--proxy-reality.*`,
`--proxy-eval.*`), which is where the transfer findings (augmentation, dropout, entropy, max throttle) show: the
training sim cannot tell them apart. `--proxy-top-speed 2.8` races every variant there at the same top speed through
the car's maximum-speed setting (the fast-throttle variant at 78%), as the DeepRacer team raced models trained with a
higher max throttle. The proxy result is kept next to the run (`proxy.json`) and read back while the checkpoint and
proxy settings are the same.

Results: `ablation.json` and `ablation.md` in the output directory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import yaml
from rich.table import Table

from datasets.jobs import SlurmConfig, cell, check_sbatch, check_seeds, make_executor, run_jobs, seed_summary
from datasets.run_layout import STUDENT_CHECKPOINTS, TEACHER_CHECKPOINTS, latest_checkpoint, run_teacher
from datasets.run_logger import WandbConfig, check_login, wandb_flags
from envs.config_io import to_yaml, write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.evaluation import EvalConfig
from envs.racing.reality import RealityConfig, reality_env_config
from experiments.cli import DEFAULT_TASK, StageFailed, current_task, run, run_stage, stage_args
from student.policies import load_policy
from student.transfer import evaluate_one


def only_augmentation(name: str) -> tuple[str, ...]:
    """One augmentation at probability 1, the others off."""
    kinds = ("color", "translate", "shadow", "sharpen", "noise")
    return tuple(flag for kind in kinds for flag in (f"--augment.{kind}-p", "1" if kind == name else "0"))


VARIANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "teacher": {
        "base": (),
        "no-reverse": ("--env.randomization.direction", "forward"),
        "no-random-start": ("--env.randomization.no-random-start",),
        "no-noise": ("--env.randomization.no-action-noise",),
        "no-latency": ("--env.randomization.no-action-latency", "--env.randomization.no-camera-latency"),
        "dropout-0.3": ("--policy.dropout", "0.3"),
        "entropy-0.01": ("--ppo.entropy-coef", "0.01"),
        "fast-throttle": ("--env.action-space", "fast-throttle"),
        "blind-to-grip": ("--policy.hidden-factors", "friction", "mass_scale", "motor_gain"),
        "speed-setting": ("--env.randomization.max-speed-percent",),
    },
    "student": {
        "base": (),
        "beta-zero": ("--dagger.beta", "zero"),
        "beta-exponential": ("--dagger.beta", "exponential"),
        "gating": ("--dagger.gating",),
        "no-history": ("--student.history.kind", "none"),
        "gru-history": ("--student.history.kind", "gru"),
        "no-factor-estimator": ("--student.estimator.kind", "none"),
        "motion-encoder": ("--student.encoder.motion",),
        "no-augment": ("--augment.no-enabled",),
        "color-only": only_augmentation("color"),
        "translate-only": only_augmentation("translate"),
        "shadow-only": only_augmentation("shadow"),
        "sharpen-only": only_augmentation("sharpen"),
        "noise-only": only_augmentation("noise"),
        "dropout-0.3": ("--student.head-dropout", "0.3"),
        "low-grip-data": ("--dagger.low-grip-share", "0.5"),
        "redrawn-dynamics": ("--dagger.redraw-seconds", "5"),
        "dense-encoder-gradient": ("--dagger.cnn-grad-stride", "1"),
        "privileged-aux": ("--dagger.privileged-weight", "0.5"),
        "lighting-aug": ("--augment.lighting-p", "0.3"),
        "frozen-teacher-head": ("--student.head", "frozen-teacher", "--dagger.privileged-weight", "0.5"),
    },
}
"""each stage's variants: override flags of its script, after the base run's preset and flags"""

STAGE_MODULES = {"teacher": "experiments.train_teacher", "student": "experiments.distill_student"}
CHECKPOINTS = {"teacher": TEACHER_CHECKPOINTS, "student": STUDENT_CHECKPOINTS}
SEED_FLAGS = {"teacher": ("--trainer.seed", "--env.seed"), "student": ("--dagger.seed",)}
"""each stage's seed flags: a sweep's seed is given to all of them (the student's env seed is its teacher's)"""
COMMAND_FILE = "ablation_command.json"
"""in a variant's run directory: the command it runs (without `--resume`)"""

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


@dataclass(frozen=True)
class AblateConfig:
    """Which stage, which variants, what budget."""

    stage: Literal["teacher", "student"] = "student"
    """what to ablate"""
    variants: tuple[str, ...] = ("base",)
    """variant names (see VARIANTS)"""
    teacher: str = ""
    """teacher checkpoint (student stage)"""
    teacher_args: str = "default --generalization-tracks"
    """the base teacher run: `experiments.train_teacher` preset and flags (the ablation adds each variant's flags,
    --run-dir and --wandb.*)"""
    student_args: str = "default --dagger.rounds 6"
    """the base student run: `experiments.distill_student` preset and flags, the same budget for every variant (the
    ablation adds each variant's flags, --teacher, --run-dir and --wandb.*)"""
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
    seeds: tuple[int, ...] = ()
    """run every variant once per seed (given to the stage's seed flags, runs in `<out-dir>/<variant>/seed_<S>`, the
    table showing mean ± 95% t-interval over the seeds); empty = once at the stage's own seed, in
    `<out-dir>/<variant>`"""
    launcher: Literal["inline", "local", "slurm"] = "inline"
    """how the runs are started: one after another from this process (inline), or as submitit jobs on this machine
    (local) or on a Slurm cluster (slurm)"""
    launcher_dir: str = ""
    """where submitit keeps its job files and logs (empty: `<out-dir>/jobs`)"""
    max_parallel: int = 0
    """jobs running at once with --launcher local or slurm (0: one at a time local, up to 256 on Slurm)"""
    job_minutes: int = 240
    """time limit of each job (local and slurm launchers); a job past it is stopped and resumes on the next sweep"""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """resources of each job with --launcher slurm"""

    def __post_init__(self) -> None:
        check_range("proxy_top_speed", self.proxy_top_speed, 0.0, 20.0)
        check_range("max_parallel", self.max_parallel, 0, 4096)
        check_range("job_minutes", self.job_minutes, 1, 60 * 24 * 30)
        check_seeds(self.seeds)
        stage_args("teacher_args", self.teacher_args)
        stage_args("student_args", self.student_args)


@dataclass(frozen=True)
class Run:
    """One run of an ablation: a variant at one seed (None: the stage's own seed, no seed flags)."""

    variant: str
    seed: int | None = None

    @property
    def label(self) -> str:
        """How messages name the run."""
        return repr(self.variant) if self.seed is None else f"{self.variant!r} seed {self.seed}"


def ablation_runs(cfg: AblateConfig) -> list[Run]:
    """Every (variant, seed) of the ablation, variant by variant."""
    return [Run(name, seed) for name in cfg.variants for seed in (cfg.seeds or (None,))]


def run_directory(cfg: AblateConfig, name: str, seed: int | None = None) -> Path:
    """`<out-dir>/<variant>`, or `<out-dir>/<variant>/seed_<S>` for a seed of a sweep."""
    return Path(cfg.out_dir) / name if seed is None else Path(cfg.out_dir) / name / f"seed_{seed}"


def variant_command(cfg: AblateConfig, name: str, seed: int | None = None) -> list[str]:
    """The arguments of a variant's stage script: the base run, the variant's flags, the seed flags when a seed is
    given, where its run goes, the task."""
    run_dir = run_directory(cfg, name, seed)
    base = stage_args(f"{cfg.stage}_args", cfg.teacher_args if cfg.stage == "teacher" else cfg.student_args)
    teacher = ["--teacher", cfg.teacher] if cfg.stage == "student" else []
    seeded = [] if seed is None else [arg for flag in SEED_FLAGS[cfg.stage] for arg in (flag, str(seed))]
    tags = (name,) if seed is None else (name, f"seed-{seed}")
    wandb = replace(cfg.wandb, group=f"ablation-{cfg.stage}", tags=tags)
    task = ["--task", current_task()]
    return [*base, *VARIANTS[cfg.stage][name], *seeded, *teacher, "--run-dir", str(run_dir), *wandb_flags(wandb), *task]


def recorded_command(record: Path) -> dict | None:
    """The command a variant's run directory records (None: none yet); one recorded before the stages were given
    `--task` ran the default task."""
    if not record.is_file():
        return None
    ran = json.loads(record.read_text())
    if "--task" not in ran["args"]:
        ran["args"] = [*ran["args"], "--task", DEFAULT_TASK]
    return ran


def run_config(run_dir: Path) -> dict:
    """A finished run's resolved config (`config.yaml`, written by its script)."""
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def _row(stage: str, summary: dict, track: str) -> dict[str, float]:
    """One table row from a run's `eval.json` summary."""
    if stage == "teacher":
        m = summary[f"eval/{track}"]
        row = {k: m[k] for k in ("lap_completion", "forward/lap_completion", "reverse/lap_completion")}
        row |= {k: m[k] for k in ("lap_completion_ci_low", "lap_completion_ci_high", "progress", "lap_time_ratio")}
        row["minutes"] = summary["wall_minutes"]
        return row
    s, t = summary["student"], summary["teacher"]
    return {
        "lap_completion": s["lap_completion"],
        "forward/lap_completion": s["forward/lap_completion"],
        "reverse/lap_completion": s["reverse/lap_completion"],
        "lap_completion_ci_low": s["lap_completion_ci_low"],
        "lap_completion_ci_high": s["lap_completion_ci_high"],
        "progress": s["progress"],
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
    teacher = cfg.stage == "teacher"
    checkpoint = run_teacher(run_dir) if teacher else latest_checkpoint(run_dir, CHECKPOINTS[cfg.stage])
    if checkpoint is None:
        raise ConfigError(f"{run_dir}: no checkpoints/{CHECKPOINTS[cfg.stage]} to evaluate in the reality proxy")
    policy = load_policy(str(checkpoint))
    top = policy.action_space.max_speed
    percent = min(100.0, 100.0 * cfg.proxy_top_speed / top) if cfg.proxy_top_speed > 0 else 100.0
    key = {
        "checkpoint": checkpoint.name, "reality": to_yaml(cfg.proxy_reality), "eval": to_yaml(cfg.proxy_eval),
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


def pending_command(cfg: AblateConfig, r: Run) -> list[str] | None:
    """The stage arguments a run still needs, or None when it finished (its `eval.json` written by the same command):
    one stopped part-way gets `--resume` from its latest checkpoint, so a killed ablation continues where it stopped.
    The command is recorded in the run directory first; a directory holding another one is refused."""
    run_dir = run_directory(cfg, r.variant, r.seed)
    command = {"module": STAGE_MODULES[cfg.stage], "args": variant_command(cfg, r.variant, r.seed)}
    record = run_dir / COMMAND_FILE
    ran = recorded_command(record)
    if (ran is not None and ran != command) or (ran is None and (run_dir / "config.yaml").exists()):
        raise ConfigError(
            f"ablation variant {r.label}: {run_dir} holds a run with another configuration; "
            "use another --out-dir (or remove that directory) to run this one"
        )
    if ran is not None and (run_dir / "eval.json").exists():
        return None
    write_text_atomic(record, json.dumps(command, indent=2))
    resume = ["--resume", str(run_dir)] if latest_checkpoint(run_dir, CHECKPOINTS[cfg.stage]) else []
    return [*command["args"], *resume]


def read_row(cfg: AblateConfig, run_dir: Path) -> dict[str, float]:
    """A finished run's table row, from its `eval.json` (and the reality proxy with `--proxy`)."""
    track = run_config(run_dir)["env"]["track"] if cfg.stage == "teacher" else ""
    row = _row(cfg.stage, json.loads((run_dir / "eval.json").read_text()), track)
    return row | proxy_row(cfg, run_dir) if cfg.proxy else row


def launch(cfg: AblateConfig, pending: list[tuple[Run, list[str]]]) -> dict[Run, tuple[str, int]]:
    """Each pending run as a job of `--launcher local|slurm` (see `datasets.jobs.run_jobs`); the failed runs with their
    lines and exit codes (1 for a job that did not finish)."""
    folder = Path(cfg.launcher_dir or Path(cfg.out_dir) / "jobs")
    executor = make_executor(
        cfg.launcher, folder, f"ablation-{cfg.stage}", cfg.job_minutes, cfg.max_parallel, cfg.slurm
    )
    argv = [sys.executable, "-m", STAGE_MODULES[cfg.stage]]
    outcomes = run_jobs(executor, [(f"ablation variant {r.label}", [*argv, *a]) for r, a in pending], cfg.max_parallel)
    return {pending[i][0]: (o.describe(pending[i][0].label), o.code) for i, o in outcomes.items() if not o.ok}


class RunsFailed(StageFailed):
    """Runs of an ablation whose jobs failed; its exit code is the first one's (see `job_outcome`)."""

    def __init__(self, module: str, failed: list[tuple[str, int]], out_dir: str) -> None:
        super().__init__("ablation", module, failed[0][1])
        self.args = (f"ablation: {len(failed)} runs failed (the others' rows in {out_dir}): "
                     + "; ".join(line for line, _ in failed),)  # fmt: skip


def budget(cfg: AblateConfig, run_dir: Path) -> str:
    """What every variant was given, from one run's resolved config."""
    resolved = run_config(run_dir)
    if cfg.stage == "student":
        return f"{resolved['dagger']['rounds']} DAgger rounds each, teacher {cfg.teacher}"
    trainer = resolved["trainer"]
    text = f"{trainer['iterations']} PPO iterations each"
    if trainer["max_minutes"] > 0:
        text += f", or {trainer['max_minutes']:g} minutes of wall time if that comes first"
    return text


def write_results(cfg: AblateConfig, rows: dict[Run, dict[str, float]], failed: list[str]) -> dict:
    """The table of the finished runs (terminal, `ablation.md`) and `ablation.json`: a row per variant, over seeds each
    metric's mean ± 95% t-interval half-width (the JSON adds the per-seed rows)."""
    if cfg.seeds:
        by_variant = {name: {r.seed: row for r, row in rows.items() if r.variant == name} for name in cfg.variants}
        results = {name: seed_summary(per_seed) for name, per_seed in by_variant.items() if per_seed}
        cells = {name: [str(len(s["seeds"]))] + [cell(s["mean"][c], s["ci95"][c]) for c in s["mean"]]
                 for name, s in results.items()}  # fmt: skip
        cols = ["seeds", *next(iter(results.values()))["mean"]]
    else:
        results = {r.variant: row for r, row in rows.items()}
        cells = {name: [cell(v) for v in row.values()] for name, row in results.items()}
        cols = list(next(iter(results.values())))
    table = Table(title=f"{cfg.stage} ablation")
    table.add_column("variant")
    for c in cols:
        table.add_column(SHORT.get(c, c), justify="right")
    first = next(iter(rows))
    over = f"; mean ± 95% t-interval over seeds {' '.join(map(str, cfg.seeds))}" if cfg.seeds else ""
    lines = [f"{cfg.stage} ablation, {budget(cfg, run_directory(cfg, first.variant, first.seed))}{over}", ""]
    if cfg.proxy:
        r = cfg.proxy_reality
        lines[-1:] = [
            f"proxy/*: the final policy in the reality proxy (variant {r.variant}, {r.physics} physics, {r.camera} "
            f"camera, {r.lens} lens), {cfg.proxy_eval.num_episodes} episodes",
            "",
        ]
    lines += ["| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, row in cells.items():
        table.add_row(name, *row)
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += [f"\nfailed: {line}" for line in failed]
    make_console().print(table)
    out = Path(cfg.out_dir)
    write_text_atomic(out / "ablation.json", json.dumps(results, indent=2))
    write_text_atomic(out / "ablation.md", "\n".join(lines) + "\n")
    return results


def main(cfg: AblateConfig) -> dict:
    unknown = [v for v in cfg.variants if v not in VARIANTS[cfg.stage]]
    if unknown:
        raise ConfigError(f"unknown {cfg.stage} variants {unknown}; known: {sorted(VARIANTS[cfg.stage])}")
    if cfg.stage == "student" and not cfg.teacher:
        raise ConfigError("--teacher is required for student ablations")
    if cfg.launcher == "slurm":
        check_sbatch()
    check_login(cfg.wandb)
    module, runs = STAGE_MODULES[cfg.stage], ablation_runs(cfg)
    pending = [(r, args) for r in runs if (args := pending_command(cfg, r)) is not None]
    failed: dict[Run, tuple[str, int]] = {}
    if cfg.launcher == "inline":
        for r, args in pending:
            run_stage(f"ablation variant {r.label}", module, args)
    elif pending:
        failed = launch(cfg, pending)
    rows = {r: read_row(cfg, run_directory(cfg, r.variant, r.seed)) for r in runs if r not in failed}
    results = write_results(cfg, rows, [line for line, _ in failed.values()]) if rows else {}
    if failed:
        raise RunsFailed(module, list(failed.values()), cfg.out_dir)
    return results


PRESETS = {
    "student": ("DAgger variants with the same budget", AblateConfig(stage="student")),
    "teacher": ("PPO variants with the same budget", AblateConfig(stage="teacher")),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
