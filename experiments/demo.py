"""`make demo`: the whole pipeline on built-in defaults, small enough for a 2-core laptop.

the scripted driver on the contact-wheel Genesis car with a strip of Genesis-rendered frames -> teacher (PPO on
ground truth) -> student (DAgger from the camera) -> teacher vs student table -> export (ONNX, OpenVINO, DeepRacer
metadata) -> the exported student driving the sim in the 15 Hz deployment loop -> the transfer
report of the student run: every checkpoint scored in the sim and in the held-out reality proxy (Genesis car and
rendered scene), the checkpoint-selection rules, and the sim-to-real gap split into perception and dynamics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from envs.config_io import write_text_atomic
from envs.racing.config import EnvConfig
from envs.racing.evaluation import EvalConfig
from experiments import (
    distill_student,
    drive_scripted,
    export_student,
    run_car,
    select_checkpoint,
    train_teacher,
)
from experiments.cli import run
from experiments.wandb_logger import WandbConfig
from student.dagger import DaggerConfig
from student.deploy import LoopConfig
from teacher.trainer import TrainerConfig


@dataclass(frozen=True)
class DemoConfig:
    """End-to-end demo."""

    out_dir: str = "outputs/demo"
    """everything goes under here"""
    genesis_drive: drive_scripted.DriveConfig = field(
        default_factory=lambda: replace(
            drive_scripted.PRESETS["genesis"][1], tracks=("reinvent2018",), eval=EvalConfig(start_points=2, laps=1)
        )
    )
    """pure pursuit on the Genesis car (both directions) with a Genesis-rendered camera strip; out_dir is set by the
    demo"""
    teacher: train_teacher.TrainTeacherConfig = field(
        default_factory=lambda: replace(
            train_teacher.PRESETS["transfer"][1],
            trainer=TrainerConfig(iterations=250, max_minutes=3.0, eval_every=25, save_every=25),
            final_eval=EvalConfig(start_points=10, laps=1, max_seconds=30.0, seed=4321),
            generalization_tracks=(),
        )
    )
    """teacher run in the transfer training world (calibrated fisheye lens, wider randomization, unmodeled effects
    drawn per env); the run directory is set by out_dir"""
    student: distill_student.DistillConfig = field(
        default_factory=lambda: replace(
            distill_student.PRESETS["default"][1], dagger=DaggerConfig(rounds=5, train_steps=150)
        )
    )
    """student distillation (the teacher and run directory are set by the demo)"""
    drive_steps: int = 300
    """steps of the exported student in the deployment loop"""
    transfer: select_checkpoint.SelectConfig = field(
        default_factory=lambda: select_checkpoint.SelectConfig(
            proxy=EvalConfig(start_points=5, laps=1, max_seconds=30.0, seed=7)
        )
    )
    """the transfer report of the student run (10 proxy laps per checkpoint; the run directory is set by the demo)"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """W&B for every stage"""


def main(cfg: DemoConfig) -> dict:
    console = Console()
    out = Path(cfg.out_dir)
    console.rule("1/6 the scripted driver on the contact-wheel Genesis car")
    genesis = drive_scripted.main(replace(cfg.genesis_drive, out_dir=str(out / "genesis_drive")))

    console.rule("2/6 teacher: PPO on ground-truth state")
    t_cfg = replace(cfg.teacher, run_dir=str(out / "teacher"), wandb=cfg.wandb)
    teacher_summary = train_teacher.main(t_cfg)
    teacher_ckpt = train_teacher.latest_checkpoint(out / "teacher")

    console.rule("3/6 student: DAgger from the camera")
    s_cfg = replace(cfg.student, teacher=str(teacher_ckpt), run_dir=str(out / "student"), wandb=cfg.wandb)
    student_summary = distill_student.main(s_cfg)
    student_ckpt = distill_student.latest_round(out / "student")

    console.rule("4/6 export")
    export_summary = export_student.main(
        export_student.ExportConfig(checkpoint=str(student_ckpt), out_dir=str(out / "export"), parity_steps=100)
    )

    console.rule("5/6 the exported student in the 15 Hz deployment loop (sim)")
    drive = run_car.main(
        run_car.RunCarConfig(
            export=str(out / "export"), log_out=str(out / "real_log_sim.h5"),
            loop=LoopConfig(max_steps=cfg.drive_steps), sim=EnvConfig(num_envs=1, camera="projective"),
        )
    )  # fmt: skip

    console.rule("6/6 transfer report: sim vs the held-out reality proxy")
    transfer = select_checkpoint.main(
        replace(cfg.transfer, run_dir=str(out / "student"), out_dir=str(out / "transfer"), wandb=cfg.wandb)
    )
    summary = {
        "genesis_drive": {track: v["metrics"] for track, v in genesis.items()},
        "teacher": {"checkpoint": str(teacher_ckpt), **{k: v for k, v in teacher_summary.items() if k != "train_eval"}},
        "student": {"checkpoint": str(student_ckpt), **student_summary},
        "export": export_summary,
        "deployment_loop": drive,
        "transfer": {k: transfer[k] for k in ("picks", "spearman_robust_vs_proxy", "spearman_fixed_lap_vs_proxy")},
    }
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2, default=str))
    console.rule("results")
    console.print(f"everything is in [bold]{out.resolve()}[/]:")
    names = ("genesis_drive/", "teacher/", "student/", "export/", "real_log_sim.h5", "transfer/transfer.md")
    for name in (*names, "summary.json"):
        console.print(f"  {out.resolve() / name}")
    return summary


PRESETS = {
    "default": ("teacher ~3 min, 5 DAgger rounds, export, deployment loop, transfer report", DemoConfig()),
    "smoke": ("every stage in seconds (checks the wiring)", DemoConfig(
        genesis_drive=replace(
            drive_scripted.PRESETS["smoke"][1], eval=EvalConfig(start_points=1, laps=1, max_seconds=3.0),
            camera_frames=2,
        ),
        teacher=replace(train_teacher.PRESETS["smoke"][1]),
        student=distill_student.PRESETS["smoke"][1],
        drive_steps=10,
        transfer=select_checkpoint.PRESETS["smoke"][1],
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

if __name__ == "__main__":
    run(main, PRESETS, description=__doc__)
