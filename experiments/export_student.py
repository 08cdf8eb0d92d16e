"""Export a distilled student for its robot: ONNX (stateful and stateless), OpenVINO IR, the task's files, bundle.

    python -m experiments.export_student default --checkpoint runs/student/checkpoints/round_010.pt
    python -m experiments.export_student default --task bimanual-lift --checkpoint runs/student-lift/checkpoints/...

Writes `student.onnx` (explicit recurrent state), `student_stateless.onnx` (stacked frames, for the stock car software;
`--stateless False` leaves it out), `student.xml/.bin` (with the `deploy` extra), the task's own files (racing:
`model_metadata.json`), `export.json`, `parity.json` and `carfile.tar.gz` into `--out-dir`; checks closed-loop parity
with the torch student in the sim and times the exported graph per control step on one core (`latency` in
`export.json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from datasets.checkpoints import git_sha
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, GapbridgeError
from envs.task import check_task
from experiments.cli import current_task, run
from student.export import (
    add_metadata,
    bundle,
    closed_loop_parity,
    export_openvino,
    export_stateful,
    export_stateless,
    odometry_info,
    output_names,
    proprio_input,
    step_latency,
    write_json,
)
from student.loaded import load_student
from student.task_evaluation import control_hz


@dataclass(frozen=True)
class ExportConfig:
    """Student export."""

    checkpoint: str = ""
    """student checkpoint (required)"""
    out_dir: str = "outputs/export"
    """export folder"""
    stateless: bool = True
    """also write the stateless stacked-frame variant (for the stock car software)"""
    stateless_frames: int = 0
    """frames stacked in the stateless variant (0 = the history encoder's receptive field)"""
    openvino: bool = True
    """also write OpenVINO IR when the openvino package is installed"""
    parity_steps: int = 200
    """closed-loop sim steps of the parity check (0 = skip)"""
    parity_tolerance: float = 1e-4
    """largest difference of the action outputs (logits or means) between the exported graph and torch that the parity
    check accepts (a larger one fails the export)"""
    latency_steps: int = 300
    """timed control steps of the exported graph on one core (0 = skip)"""
    wandb_run: str = ""
    """W&B run id recorded in the metadata"""


def main(cfg: ExportConfig) -> dict:
    if not cfg.checkpoint:
        raise ConfigError("--checkpoint is required (a student checkpoint from experiments.distill_student)")
    console = make_console()
    student = load_student(cfg.checkpoint)
    check_task(f"--checkpoint {cfg.checkpoint}", student.task.name, current_task())
    model, space = student.model, student.action_space
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frames = cfg.stateless_frames or max(1, model.cfg.context + 1)
    (h, w), spec, hz = model.image_hw, model.spec, control_hz(student.env_cfg)
    stateful = export_stateful(model, out / "student.onnx")
    history_shape = list(model.init_state(1).shape)
    table = [list(c) for c in getattr(space, "choices", ())] if space.kind == "discrete" else []
    reads = "the previous action" if proprio_input(model) == "prev_action" else "the group, previous action first"
    props = {
        "gapbridge.task": student.task.name,
        "gapbridge.inputs": f"camera (1,1,{h},{w}) raw gray 0-255; {proprio_input(model)} (1,{spec.proprio_dim}) "
        f"{reads} as the policy reads it; history_in",
        "gapbridge.image_size": f"{w}x{h}",
        "gapbridge.pixel_range": "0-255 (scaled inside the graph)",
        "gapbridge.control_hz": str(hz),
        "gapbridge.action_table": json.dumps(table),
        "gapbridge.action_space": json.dumps(space.to_dict()),
        "gapbridge.history_shape": json.dumps(history_shape),
        "gapbridge.git_sha": git_sha(),
        "gapbridge.wandb_run": cfg.wandb_run,
        "gapbridge.checkpoint": Path(cfg.checkpoint).name,
    }
    add_metadata(stateful, props)
    files = ["student.onnx"]
    if cfg.stateless:
        stateless = export_stateless(model, out / "student_stateless.onnx", frames)
        add_metadata(stateless, {**props, "gapbridge.inputs": f"FRONT_FACING_CAMERA (1,{frames},{h},{w}) oldest first"})
        files.append("student_stateless.onnx")
    task_files = student.task.export_files(space, student.env_cfg)  # racing: model_metadata.json
    files += [*task_files, "export.json"]
    if cfg.openvino and export_openvino(stateful, out / "student.xml") is not None:
        files += ["student.xml", "student.bin"]
    for name, text in task_files.items():
        write_text_atomic(out / name, text)
    info = {
        "task": student.task.name, "history_shape": history_shape, "stateless_frames": frames if cfg.stateless else 0,
        "control_hz": hz, "image_hw": [h, w], "proprio_dim": spec.proprio_dim,
        "previous_action_dim": spec.action_columns, "action_space": space.to_dict(),
        "outputs": output_names(student.model),
        "checkpoint": str(cfg.checkpoint), "git_sha": git_sha(), "wandb_run": cfg.wandb_run,
        **odometry_info(model, student.env_cfg),
    }  # fmt: skip
    write_json(out / "export.json", info)
    parity = {}
    if cfg.parity_steps > 0:
        env_cfg = student.env_cfg
        env_cfg = replace(env_cfg, compile=False) if hasattr(env_cfg, "compile") else env_cfg
        env_cfg = student.task.student_env_config(env_cfg, 1, None)
        env = student.task.make_env(env_cfg)
        for backend in ("onnx", "openvino") if "student.xml" in files else ("onnx",):
            parity[backend] = closed_loop_parity(model, out, env, cfg.parity_steps, backend)
            console.print(f"{backend} parity over {cfg.parity_steps} closed-loop steps: {parity[backend]}")
        if hasattr(env, "close"):
            env.close()
        write_json(out / "parity.json", parity)
        worst = max(p["max_logit_diff"] for p in parity.values())
        if worst > cfg.parity_tolerance:
            raise ExportParityError(
                f"the exported graph's actions differ from the torch student's by {worst:.2e} (> --parity-tolerance "
                f"{cfg.parity_tolerance:g}); see {out / 'parity.json'}"
            )
    if cfg.latency_steps > 0:
        info["latency"] = step_latency(out, cfg.latency_steps)
        write_json(out / "export.json", info)
        lat = info["latency"]
        console.print(
            f"onnx step on one core: median {lat['median_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms "
            f"(control period {1000.0 / hz:.0f} ms)"
        )
    bundle(out, files, out / "carfile.tar.gz")
    console.print(f"export in [bold]{out.resolve()}[/]: {', '.join(files)}, carfile.tar.gz")
    return {"files": files, "parity": parity, "latency": info.get("latency", {})}


class ExportParityError(GapbridgeError, RuntimeError):
    """The exported graph does not reproduce the torch student within the tolerance."""


PRESETS = {"default": ("export with parity checks", ExportConfig())}

BIMANUAL_PRESETS = {
    "default": ("the arm student: the stateful graph (no stock-software variant), parity and one-core latency",
                ExportConfig(out_dir="outputs/export-bimanual-lift", stateless=False)),
    "smoke": ("as default with a short parity drive and few timed steps (checks the pipeline)",
              ExportConfig(out_dir="outputs/export-bimanual-lift", stateless=False, openvino=False, parity_steps=20,
                           latency_steps=50)),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS, "bimanual-lift": BIMANUAL_PRESETS}, description=__doc__)
