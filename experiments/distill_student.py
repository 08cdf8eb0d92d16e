"""Distill a saved teacher into the camera student with DAgger.

    python -m experiments.distill_student default --teacher runs/teacher/teacher.pt
    python -m experiments.distill_student default --teacher ... --dagger.beta zero        # ablation: β = 0
    python -m experiments.distill_student default --teacher ... --student.history.kind none
    python -m experiments.distill_student default --teacher ... --augment.enabled False
    python -m experiments.distill_student default --teacher ... --resume runs/student      # continue exactly
    torchrun --nproc-per-node 2 -m experiments.distill_student default --teacher ... --distributed   # 2 ranks
    python -m experiments.distill_student default --task bimanual-lift --teacher runs/teacher-lift/teacher.pt

The teacher's task must be the script's (`--task`, default racing): a teacher of another task is refused naming both.
The run directory holds `data/` (one HDF5 shard per round + manifest.json), `checkpoints/round_*.pt`, `eval.json`,
plots and a short camera video; W&B gets the same. Racing's final report compares student and teacher lap by lap with
trajectory plots; another task's compares every metric of its own evaluation on the same episodes, the primary metric
by third of each randomized factor, and the student's online estimates by time since reset. With `--distributed`
under torchrun every rank collects `dagger.envs / world size` envs into its own shards (`data/round_NNN_rankK.h5`, all
listed in the manifest) and trains on `dagger.batch-windows / world size` windows per step with the gradients
averaged; rank 0 evaluates and writes the run directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
from rich.table import Table

from adaptation.factor_estimator import EstimatorConfig
from adaptation.history_encoder import HistoryConfig
from datasets.run_layout import STUDENT_CHECKPOINTS, latest_checkpoint
from datasets.run_logger import RunLogger, WandbConfig, check_login
from envs.augment import AugmentConfig
from envs.bimanual.task import BimanualEvalConfig
from envs.config_io import to_yaml, write_text_atomic
from envs.console import make_console
from envs.distributed import init_distributed, shutdown
from envs.errors import ConfigError
from envs.racing.evaluation import EvalConfig, evaluate
from envs.racing.visualize import plot_trajectories, save_frame_strip
from envs.task import check_task
from experiments.cli import current_task, run
from student.dagger import DaggerConfig
from student.distiller import Distiller
from student.model import StudentConfig, StudentPolicy
from student.networks import EncoderConfig
from student.task_evaluation import EpisodeWatch, estimation_table, factor_table, score_by_factor
from teacher.policy import load_teacher


@dataclass(frozen=True)
class DistillConfig:
    """A DAgger distillation run."""

    default_run_dir: ClassVar[str] = "runs/student"
    teacher: str = ""
    """teacher checkpoint (required)"""
    student: StudentConfig = field(default_factory=StudentConfig)
    """student architecture"""
    dagger: DaggerConfig = field(default_factory=DaggerConfig)
    """DAgger schedule and sizes"""
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    """training-time image augmentation"""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(start_points=4, laps=1, max_seconds=30.0))
    """per-round evaluation"""
    final_eval: EvalConfig = field(
        default_factory=lambda: EvalConfig(start_points=10, repeats=2, laps=1, max_seconds=30.0, seed=4321)
    )
    """final comparison with the teacher (same episodes for both)"""
    run_dir: str = ""
    """run directory (empty: the resumed run's own when resuming, else `runs/student`, `runs/student-bimanual-lift`
    for the arm task)"""
    resume: str = ""
    """checkpoint, or run directory (its latest round), to continue"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """W&B logging"""
    distributed: bool = False
    """data-parallel DAgger over the processes torchrun starts (`torchrun --nproc-per-node N -m
    experiments.distill_student ... --distributed`): gloo on CPU, nccl on CUDA"""
    distributed_timeout_s: float = 300.0
    """how long a rank waits for the others at a collective before the run fails (a rank that dies fails the others
    at once)"""

    def __post_init__(self) -> None:
        if self.student.estimator.motion == "odometry":
            raise ConfigError(
                "--student.estimator.motion odometry: DAgger's windows carry no odometry, so that estimator cannot "
                "train here; distill with the encoder-fed one, then `python -m experiments.fit_estimator odometry "
                "--checkpoint <round .pt>`"
            )


@dataclass(frozen=True)
class DistillBimanualConfig(DistillConfig):
    """A DAgger distillation run of the two-arm bar lift (`--task bimanual-lift`): the student reads the camera and the
    whole `proprio` group (previous action, joint positions, gripper widths, wrench estimate); its history encoder
    spans about 2 s (41 control steps at 20 Hz) and estimates the task's latency and factors beside z."""

    student: StudentConfig = field(default_factory=lambda: BIMANUAL_STUDENT)
    """student architecture"""
    dagger: DaggerConfig = field(default_factory=lambda: BIMANUAL_DAGGER)
    """DAgger schedule and sizes"""
    eval: BimanualEvalConfig = field(default_factory=lambda: BimanualEvalConfig(episodes=16))
    """per-round evaluation: fixed-seed episodes in the teacher's randomization"""
    final_eval: BimanualEvalConfig = field(default_factory=lambda: BimanualEvalConfig(episodes=32, seed=4321))
    """final comparison with the teacher (same episodes for both; a seed the per-round evaluation never used)"""
    default_run_dir: ClassVar[str] = "runs/student-bimanual-lift"


def without_compile(env_cfg):
    """The env config with its kernels uncompiled where it has that setting (DAgger's envs change shape)."""
    return replace(env_cfg, compile=False) if hasattr(env_cfg, "compile") else env_cfg


def camera_video(distiller: Distiller, steps: int = 90) -> tuple[np.ndarray, list[str]]:
    """One racing env driven by the student from the start line: frames `(T, 1, H, W)` and the chosen actions."""
    env_cfg = replace(
        distiller.env_cfg, num_envs=1, randomization=replace(distiller.env_cfg.randomization, random_start=False)
    )
    env = distiller.task.make_env(env_cfg)
    policy = StudentPolicy(distiller.student, 1, distiller.device)
    obs = env.get_observations()
    frames, captions = [], []
    for t in range(steps):
        action = policy.act(obs)
        if env.action_space.kind == "discrete":
            angle, speed = env.action_space.choices[int(action[0, 0])]
            captions.append(f"t={t / env_cfg.control_hz:.1f}s {angle:+.0f}° {speed:.1f}m/s")
        frames.append(obs["camera"][0].cpu().numpy())
        obs, _, dones, _ = env.step(action)
        policy.reset(dones)
    return np.stack(frames), captions


def racing_report(cfg: DistillConfig, distiller: Distiller, teacher, logger, console) -> dict:
    """Racing's final comparison: student and teacher on the same camera-env episodes, lap table, trajectories and the
    camera video."""
    eval_env_cfg = replace(distiller.env_cfg, termination=teacher.env_cfg.termination)
    student_policy = StudentPolicy(distiller.student, cfg.final_eval.num_episodes, distiller.device)
    s_metrics, s_records, env = evaluate(student_policy.act, eval_env_cfg, cfg.final_eval, reset=student_policy.reset)
    t_metrics, _, _ = evaluate(teacher.act, eval_env_cfg, cfg.final_eval, env=env)
    table = Table(title=f"student vs teacher ({cfg.final_eval.num_episodes} episodes, camera env, train randomization)")
    for col in ("policy", "laps (fwd / rev)", "lap time (s)", "lap / optimal", "off-track"):
        table.add_column(col)
    for name, m in (("teacher", t_metrics), ("student", s_metrics)):
        table.add_row(
            name, f"{m['forward/lap_completion']:.0%} / {m['reverse/lap_completion']:.0%}", f"{m['lap_time']:.2f}",
            f"{m['lap_time_ratio']:.2f}", f"{int(m['offtrack_count'])}",
        )  # fmt: skip
    console.print(table)
    run_dir = Path(cfg.run_dir)
    plot = plot_trajectories(
        env.track, [r.path for r in s_records], run_dir / "student_trajectories.png",
        colors=["tab:blue" if r.direction == "forward" else "tab:orange" for r in s_records],
        title=f"student: {s_metrics['lap_completion']:.0%} laps completed (blue forward, orange reverse)",
    )  # fmt: skip
    frames, captions = camera_video(distiller)
    strip = save_frame_strip(frames[::8], run_dir / "student_camera.png", captions[::8])
    logger.image("plots/student_trajectories", plot, distiller.samples)
    logger.image("plots/student_camera", strip, distiller.samples)
    logger.video("video/student_camera", frames, distiller.samples)
    return {
        "student": s_metrics,
        "teacher": t_metrics,
        "completion_ratio": s_metrics["lap_completion"] / max(t_metrics["lap_completion"], 1e-9),
        "lap_time_ratio_vs_teacher": s_metrics["lap_time"] / t_metrics["lap_time"],
    }


def task_report(cfg: DistillConfig, distiller: Distiller, teacher, logger, console) -> dict:
    """Another task's final comparison through the task contract: student and teacher on the same fixed-seed episodes
    (the per-round evaluation's env when `final_eval` equals `eval`), every metric of the task's evaluation side by
    side, the selection metric by third of each randomized factor, the student's estimates by time since reset, and
    the student's camera over its first steps."""
    task, run_dir = distiller.task, Path(cfg.run_dir)
    env = distiller.eval_env
    if cfg.final_eval != cfg.eval:
        base = task.student_env_config(without_compile(teacher.env_cfg), teacher.env_cfg.num_envs, None)
        env = task.make_eval_env(base, cfg.final_eval)
    watches = {
        "teacher": EpisodeWatch(task, env, teacher),
        "student": EpisodeWatch(task, env, StudentPolicy(distiller.student, env.num_envs, distiller.device), frames=96),
    }
    metrics, by_factor = {}, {}
    for name, watch in watches.items():
        records = task.run_episodes(watch.act, env, cfg.final_eval, watch.reset)
        metrics[name] = task.summarize(records, env)
        by_factor[name] = score_by_factor(task, records, watch.worlds)
    episodes = len(watches["student"].worlds)
    table = Table(title=f"student vs teacher ({episodes} episodes, camera env, the teacher's randomization)")
    for col in ("metric", "teacher", "student"):
        table.add_column(col)
    for key in metrics["student"]:
        table.add_row(key, f"{metrics['teacher'][key]:.3g}", f"{metrics['student'][key]:.3g}")
    console.print(table)
    metric = task.selection_metric
    for name in ("teacher", "student"):
        if by_factor[name]:
            console.print(factor_table(by_factor[name], metric, f"{name}: {metric} by third of each world factor"))
    estimation = watches["student"].estimation()
    if estimation:
        console.print(estimation_table(estimation, task, "student: online estimates by time since reset"))
    frames = np.stack(watches["student"].frames)
    hz = watches["student"].hz
    captions = [f"t={t / hz:.1f}s" for t in range(len(frames))]
    strip = save_frame_strip(frames[::8], run_dir / "student_camera.png", captions[::8])
    logger.image("plots/student_camera", strip, distiller.samples)
    logger.video("video/student_camera", frames, distiller.samples, fps=round(hz))
    primary = task.primary_metric
    return {
        "student": metrics["student"],
        "teacher": metrics["teacher"],
        f"{primary}_ratio": metrics["student"][primary] / max(metrics["teacher"][primary], 1e-9),
        "by_factor": by_factor,
        "estimation": estimation,
    }


def resume_checkpoint(spec: str) -> Path:
    """`--resume`: a round checkpoint, or a run directory's latest one."""
    ckpt = latest_checkpoint(spec, STUDENT_CHECKPOINTS) if Path(spec).is_dir() else Path(spec)
    if ckpt is None:
        raise ConfigError(f"--resume {spec}: no checkpoints/round_*.pt there")
    if not ckpt.is_file():
        raise ConfigError(f"--resume {spec}: no such checkpoint")
    return ckpt


def resumed_run_dir(cfg: DistillConfig, ckpt: Path | None) -> Path:
    """The folder a run writes to: `--run-dir`; when resuming, the resumed run's own (its shards and manifest are
    there), and a `--run-dir` that names another folder is refused; else the config's default folder."""
    if ckpt is None:
        return Path(cfg.run_dir or cfg.default_run_dir)
    own = ckpt.resolve().parent.parent
    if cfg.run_dir and Path(cfg.run_dir).resolve() != own:
        raise ConfigError(
            f"--resume {ckpt} belongs to the run {own}, but --run-dir is {cfg.run_dir}: a resumed run continues in "
            "its own folder (drop --run-dir or give that one)"
        )
    return own


def main(cfg: DistillConfig) -> dict:
    if not cfg.teacher:
        raise ConfigError("--teacher is required (a teacher checkpoint from experiments.train_teacher)")
    check_login(cfg.wandb)
    teacher = load_teacher(cfg.teacher)
    check_task(f"--teacher {cfg.teacher}", teacher.task.name, current_task())
    rank = init_distributed(cfg.distributed, "cpu", cfg.distributed_timeout_s, "experiments.distill_student")
    console = make_console()
    ckpt = resume_checkpoint(cfg.resume) if cfg.resume else None
    run_dir = resumed_run_dir(cfg, ckpt)
    cfg = replace(cfg, run_dir=str(run_dir))
    env_cfg = without_compile(teacher.env_cfg)
    if rank.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", to_yaml(cfg))
    distiller = Distiller(
        teacher, env_cfg, cfg.student, cfg.dagger, cfg.augment, cfg.eval, run_dir, cfg.teacher, rank=rank
    )  # fmt: skip
    if ckpt is not None:
        distiller.resume(ckpt)
        if rank.is_main:
            console.print(f"resumed from {ckpt} after round {distiller.round}")
    if not rank.is_main:  # rank 0 logs, evaluates and writes; the others collect and train
        distiller.run(show_progress=False)
        shutdown(rank)
        return {}
    logger = RunLogger(cfg.wandb, run_dir, name=run_dir.name, config=cfg)
    distiller.log = logger.log
    distiller.run()
    shutdown(rank)
    # Final comparison: student and teacher on the same camera-env episodes.
    report = racing_report if distiller.task.name == "racing" else task_report
    summary = report(cfg, distiller, teacher, logger, console)
    if distiller.estimator_fit:
        fit = {k: distiller.estimator_fit.get(f"heldout/{k}_r2", float("nan")) for k in FIT_SCORES}
        console.print(
            "factor estimator on held-out recorded episodes: "
            + ", ".join(f"{k.replace('_', ' ')} R² {v:.2f}" for k, v in fit.items())
        )
    summary.update({
        "rounds": distiller.round, "samples": distiller.samples, "dagger_minutes": distiller.wall_minutes,
        "world_size": rank.world_size, "history": distiller.history, "estimator_fit": distiller.estimator_fit,
    })  # fmt: skip
    write_text_atomic(run_dir / "eval.json", json.dumps(summary, indent=2))
    last = latest_checkpoint(run_dir, STUDENT_CHECKPOINTS)
    if last is not None:
        logger.artifact(last, f"student-{run_dir.name}", "model")
    logger.finish()
    console.print(f"run directory: [bold]{run_dir.resolve()}[/] (checkpoints/, data/, eval.json, plots)")
    return summary


FIT_SCORES = ("action_latency", "loop_latency", "friction", "motor_gain")

BIMANUAL_STUDENT = StudentConfig(
    history=HistoryConfig(kind="tcn", kernel=5, dilations=(1, 2, 4, 3)),  # receptive field 41 steps: 2 s at 20 Hz
    estimator=EstimatorConfig(kind="none"),  # the second-stage estimator is a vehicle's
    proprio="all",
)
"""the arm student: the DeepRacer CNN on 96 x 96 frames, a 2-s TCN, the whole proprio group"""

BIMANUAL_DAGGER = DaggerConfig(
    rounds=30, envs=32, steps_per_round=160, train_steps=400, batch_windows=12, labels_per_window=24,
    estimator_fit_steps=0, max_minutes=28.0, ema_decay=0.999, privileged_weight=0.5,
)  # fmt: skip
"""one whole 8-s episode per env and round (160 steps at 20 Hz, so the saved student's episodes are the task's);
windows of the 40-step context plus 24 labels; about a minute per round with the camera on 2 CPU cores, and
`max_minutes` ends the run after the round in progress, so DAgger stays within 30 minutes. The student is the
weights' moving average over about the last 1,000 steps (single iterates swung between 6% and 56% success from one
round to the next), and it learns to predict the teacher's state (the bar's and the grippers' poses) beside its
actions"""

PRESETS = {
    "default": ("14 DAgger rounds, 32 camera envs, TCN history encoder, augmentation on", DistillConfig()),
    "smoke": ("2 tiny rounds (checks the pipeline)", DistillConfig(
        dagger=DaggerConfig(rounds=2, envs=4, steps_per_round=20, train_steps=2, batch_windows=2, labels_per_window=4,
                            estimator_fit_steps=20),
        eval=EvalConfig(start_points=1, laps=1, max_seconds=3.0),
        final_eval=EvalConfig(start_points=1, laps=1, max_seconds=3.0),
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

BIMANUAL_PRESETS = {
    "default": ("the two-arm bar lift: up to 30 DAgger rounds of one 8-s episode at 32 camera envs, a 2-s TCN history "
                "encoder, the whole proprio group, augmentation on; stops after 28 minutes of DAgger",
                DistillBimanualConfig()),
    "smoke": ("2 tiny rounds at 2 envs and a tiny student (checks the pipeline)", DistillBimanualConfig(
        student=replace(BIMANUAL_STUDENT, encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16),
                        history=HistoryConfig(kind="tcn", channels=16, kernel=3, dilations=(1, 2), input_dim=8)),
        dagger=DaggerConfig(rounds=2, envs=2, steps_per_round=10, train_steps=2, batch_windows=2, labels_per_window=4,
                            estimator_fit_steps=0, bf16="off", ema_decay=0.9, privileged_weight=0.5),
        eval=BimanualEvalConfig(episodes=2),
        final_eval=BimanualEvalConfig(episodes=2),
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS, "bimanual-lift": BIMANUAL_PRESETS}, description=__doc__)
