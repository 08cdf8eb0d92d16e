"""`make demo`: the whole pipeline on built-in defaults, small enough for a 2-core laptop.

the scripted driver on the contact-wheel Genesis car with a strip of Genesis-rendered frames -> teacher (PPO on
ground truth) -> student (DAgger from the camera) -> teacher vs student table -> export (ONNX, OpenVINO, DeepRacer
metadata) -> the exported student driving the sim in the 15 Hz deployment loop -> the transfer
report of the student run: every checkpoint scored in the sim and in the held-out reality proxy (Genesis car and
rendered scene), the checkpoint-selection rules, and the sim-to-real gap split into perception and dynamics.

    python -m experiments.demo default
    python -m experiments.demo smoke --out-dir /tmp/demo
    python -m experiments.demo default --teacher "transfer --trainer.iterations 100"   # another teacher stage

Each stage is its script run in its own process (`python -m experiments.<script> PRESET --flag value ...`), so
nothing one stage imports (Genesis in the first) reaches the next; a stage is given as its preset and flags, and the
demo adds where its output goes and its own `--task`. The demo reads each stage's results back from its files
(summary.json, eval.json, checkpoints/, parity.json, transfer.json) into `summary.json`. A failing stage stops the demo
with one line naming it and its exit code, which the demo exits with (2: the stage refused its input).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from datasets.run_layout import STUDENT_CHECKPOINTS, latest_checkpoint, run_teacher
from datasets.run_logger import WandbConfig, check_login, wandb_flags
from envs.config_io import write_text_atomic
from envs.console import make_console, rule
from envs.errors import ConfigError, check_range
from experiments.cli import current_task, run, run_stage, stage_args

STAGE_FIELDS = ("genesis_drive", "teacher", "student", "export", "transfer")
EXPORT_FILES = ("student.onnx", "student_stateless.onnx", "model_metadata.json", "export.json", "student.xml",
                "student.bin")  # fmt: skip
RESULTS = ("genesis_drive/", "teacher/", "student/", "export/", "real_log_sim.h5", "transfer/transfer.md",
           "summary.json")  # fmt: skip


@dataclass(frozen=True)
class DemoConfig:
    """End-to-end demo: each stage a script in its own process, given as its preset and flags."""

    out_dir: str = "outputs/demo"
    """everything goes under here"""
    genesis_drive: str = "genesis --tracks reinvent2018 --eval.start-points 2 --eval.laps 1"
    """`experiments.drive_scripted` preset and flags: pure pursuit on the Genesis car (both directions) with a
    Genesis-rendered camera strip (the demo adds --out-dir)"""
    teacher: str = (
        "transfer --trainer.iterations 250 --trainer.max-minutes 3 --trainer.eval-every 25 --trainer.save-every 25 "
        "--final-eval.start-points 10 --final-eval.repeats 1"
    )
    """`experiments.train_teacher` preset and flags: the transfer training world (calibrated fisheye lens, wider
    randomization, unmodeled effects drawn per env), 3 minutes (the demo adds --run-dir and --wandb.*)"""
    student: str = "default --dagger.rounds 5 --dagger.train-steps 150"
    """`experiments.distill_student` preset and flags (the demo adds --teacher, --run-dir and --wandb.*)"""
    export: str = "default --parity-steps 100"
    """`experiments.export_student` preset and flags (the demo adds --checkpoint and --out-dir)"""
    drive_steps: int = 300
    """steps of the exported student in the deployment loop (`experiments.run_car sim`)"""
    transfer: str = "default --proxy.start-points 5 --proxy.max-seconds 30 --proxy.repeats 1"
    """`experiments.select_checkpoint` preset and flags: the transfer report of the student run, 10 proxy laps per
    checkpoint (the demo adds --run-dir, --out-dir and --wandb.*)"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """W&B for every stage"""

    def __post_init__(self) -> None:
        check_range("drive_steps", self.drive_steps, 1, 1_000_000)
        for name in STAGE_FIELDS:
            stage_args(name, getattr(self, name))


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: the stage that writes it finished without it")
    return json.loads(path.read_text())


def main(cfg: DemoConfig) -> dict:
    check_login(cfg.wandb)
    console = make_console()
    out = Path(cfg.out_dir)
    wandb = wandb_flags(cfg.wandb)

    def saved_checkpoint(run_dir: Path, found: Path | None, flag: str, spec: str) -> Path:
        """The stage's checkpoint (`found` in `run_dir`); a stage that saved none is refused, naming its flag."""
        if found is None:
            raise ConfigError(f"{flag} {spec!r} saved no checkpoint in {run_dir / 'checkpoints'}")
        return found

    def stage(number: int, title: str, module: str, args: list[str]) -> None:
        rule(console, f"{number}/6 {title}")
        run_stage(f"demo stage {number}/6", module, [*args, "--task", current_task()])

    finished = False
    try:
        drive_args = stage_args("genesis_drive", cfg.genesis_drive)
        stage(1, "the scripted driver on the contact-wheel Genesis car", "experiments.drive_scripted",
              [*drive_args, "--out-dir", str(out / "genesis_drive")])  # fmt: skip
        teacher_args = stage_args("teacher", cfg.teacher)
        stage(2, "teacher: PPO on ground-truth state", "experiments.train_teacher",
              [*teacher_args, "--run-dir", str(out / "teacher"), *wandb])  # fmt: skip
        teacher_ckpt = saved_checkpoint(out / "teacher", run_teacher(out / "teacher"), "--teacher", cfg.teacher)
        student_args = [*stage_args("student", cfg.student), "--teacher", str(teacher_ckpt)]
        stage(3, "student: DAgger from the camera", "experiments.distill_student",
              [*student_args, "--run-dir", str(out / "student"), *wandb])  # fmt: skip
        student_found = latest_checkpoint(out / "student", STUDENT_CHECKPOINTS)
        student_ckpt = saved_checkpoint(out / "student", student_found, "--student", cfg.student)
        export_args = [*stage_args("export", cfg.export), "--checkpoint", str(student_ckpt)]
        stage(4, "export", "experiments.export_student", [*export_args, "--out-dir", str(out / "export")])
        loop_args = ["sim", "--export", str(out / "export"), "--loop.max-steps", str(cfg.drive_steps)]
        stage(5, "the exported student in the 15 Hz deployment loop (sim)", "experiments.run_car",
              [*loop_args, "--log-out", str(out / "real_log_sim.h5")])  # fmt: skip
        transfer_args = [*stage_args("transfer", cfg.transfer), "--run-dir", str(out / "student")]
        stage(6, "transfer report: sim vs the held-out reality proxy", "experiments.select_checkpoint",
              [*transfer_args, "--out-dir", str(out / "transfer"), *wandb])  # fmt: skip
        summary = read_back(out, teacher_ckpt, student_ckpt)
        write_text_atomic(out / "summary.json", json.dumps(summary, indent=2, default=str))
        finished = True
    finally:
        rule(console, "results" if finished else "results so far")
        console.print(f"everything is in [bold]{out.resolve()}[/]:")
        for name in RESULTS:
            if finished or (out / name).exists():
                console.print(f"  {out.resolve() / name}")
    return summary


def read_back(out: Path, teacher_ckpt: Path, student_ckpt: Path) -> dict:
    """Every stage's results, from the files it wrote."""
    genesis = read_json(out / "genesis_drive" / "summary.json")
    teacher = read_json(out / "teacher" / "eval.json")
    transfer = read_json(out / "transfer" / "transfer.json")
    export = out / "export"
    return {
        "genesis_drive": {track: v["metrics"] for track, v in genesis.items()},
        "teacher": {"checkpoint": str(teacher_ckpt), **{k: v for k, v in teacher.items() if k != "train_eval"}},
        "student": {"checkpoint": str(student_ckpt), **read_json(out / "student" / "eval.json")},
        "export": {
            "files": [name for name in EXPORT_FILES if (export / name).is_file()],
            "parity": read_json(export / "parity.json") if (export / "parity.json").is_file() else {},
        },
        "deployment_loop": read_json(out / "real_log_sim.json"),
        "transfer": {k: transfer[k] for k in ("picks", "spearman_robust_vs_proxy", "spearman_fixed_lap_vs_proxy")},
    }


PRESETS = {
    "default": ("teacher ~3 min, 5 DAgger rounds, export, deployment loop, transfer report", DemoConfig()),
    "smoke": ("every stage in seconds (checks the wiring)", DemoConfig(
        genesis_drive="smoke --eval.start-points 1 --eval.max-seconds 3 --camera-frames 2",
        teacher="smoke",
        student="smoke",
        drive_steps=10,
        transfer="smoke",
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
