"""Export a distilled student for the car: ONNX (stateful and stateless), OpenVINO IR, DeepRacer metadata, bundle.

    python -m experiments.export_student default --checkpoint runs/student/checkpoints/round_010.pt

Writes `student.onnx`, `student_stateless.onnx`, `student.xml/.bin` (with the `deploy` extra), `model_metadata.json`,
`export.json`, `parity.json` and `carfile.tar.gz` into `--out-dir`, and checks closed-loop parity in the sim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from datasets.checkpoints import git_sha
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError
from experiments.cli import run
from student.export import (
    add_metadata,
    bundle,
    closed_loop_parity,
    export_openvino,
    export_stateful,
    export_stateless,
    odometry_info,
    output_names,
    write_json,
)
from student.loaded import load_student


@dataclass(frozen=True)
class ExportConfig:
    """Student export."""

    checkpoint: str = ""
    """student checkpoint (required)"""
    out_dir: str = "outputs/export"
    """export folder"""
    stateless_frames: int = 0
    """frames stacked in the stateless variant (0 = the history encoder's receptive field)"""
    openvino: bool = True
    """also write OpenVINO IR when the openvino package is installed"""
    parity_steps: int = 200
    """closed-loop sim steps of the parity check (0 = skip)"""
    wandb_run: str = ""
    """W&B run id recorded in the metadata"""


def main(cfg: ExportConfig) -> dict:
    if not cfg.checkpoint:
        raise ConfigError("--checkpoint is required (a student checkpoint from experiments.distill_student)")
    console = make_console()
    student = load_student(cfg.checkpoint)
    model, space = student.model, student.action_space
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frames = cfg.stateless_frames or max(1, model.cfg.context + 1)
    stateful = export_stateful(model, out / "student.onnx")
    stateless = export_stateless(model, out / "student_stateless.onnx", frames)
    history_shape = list(model.init_state(1).shape)
    table = [list(c) for c in getattr(space, "choices", ())] if space.kind == "discrete" else []
    props = {
        "gapbridge.task": student.task.name,
        "gapbridge.inputs": f"camera (1,1,120,160) raw gray 0-255; prev_action (1,{model.spec.proprio_dim}) the "
        "previous action as the policy reads it; history_in",
        "gapbridge.image_size": "160x120",
        "gapbridge.pixel_range": "0-255 (scaled inside the graph)",
        "gapbridge.control_hz": str(student.env_cfg.control_hz),
        "gapbridge.action_table": json.dumps(table),
        "gapbridge.action_space": json.dumps(space.to_dict()),
        "gapbridge.history_shape": json.dumps(history_shape),
        "gapbridge.git_sha": git_sha(),
        "gapbridge.wandb_run": cfg.wandb_run,
        "gapbridge.checkpoint": Path(cfg.checkpoint).name,
    }
    add_metadata(stateful, props)
    add_metadata(stateless, {**props, "gapbridge.inputs": f"FRONT_FACING_CAMERA (1,{frames},120,160) oldest first"})
    task_files = student.task.export_files(space, student.env_cfg)  # racing: model_metadata.json
    files = ["student.onnx", "student_stateless.onnx", *task_files, "export.json"]
    if cfg.openvino and export_openvino(stateful, out / "student.xml") is not None:
        files += ["student.xml", "student.bin"]
    for name, text in task_files.items():
        write_text_atomic(out / name, text)
    write_json(out / "export.json", {
        "task": student.task.name, "history_shape": history_shape, "stateless_frames": frames,
        "control_hz": student.env_cfg.control_hz,
        "outputs": output_names(student.model),
        "checkpoint": str(cfg.checkpoint), "git_sha": git_sha(), "wandb_run": cfg.wandb_run,
        **odometry_info(model, student.env_cfg),
    })  # fmt: skip
    parity = {}
    if cfg.parity_steps > 0:
        env_cfg = replace(student.env_cfg, num_envs=1, compile=False)
        for backend in ("onnx", "openvino") if "student.xml" in files else ("onnx",):
            env = student.task.make_env(env_cfg)
            parity[backend] = closed_loop_parity(model, out, env, cfg.parity_steps, backend)
            console.print(f"{backend} parity over {cfg.parity_steps} closed-loop steps: {parity[backend]}")
        write_json(out / "parity.json", parity)
    bundle(out, files, out / "carfile.tar.gz")
    console.print(f"export in [bold]{out.resolve()}[/]: {', '.join(files)}, carfile.tar.gz")
    return {"files": files, "parity": parity}


PRESETS = {"default": ("export with parity checks", ExportConfig())}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
