"""Export the student for the car: ONNX with explicit recurrent state, a stateless stock-software variant, OpenVINO
IR, DeepRacer `model_metadata.json`, ONNX metadata, and a `carfile.tar.gz` bundle.

Stateful graph (`student.onnx`): inputs `camera` (1, 1, 120, 160) float32 raw pixels 0-255 (scaling is inside the graph,
as the car feeds raw pixels), `prev_action` (1, 2), `history_in`, and for a factor estimator that reads odometry
`motion` (1, 3) (the deployment loop runs the odometry: `export.json` carries its camera and period); outputs
`action_logits`, `history_out`, `z_hat`, `action_latency_probs`, `camera_latency_probs`, `estimates` (friction, motor
gain, speed, lateral speed, yaw rate).

Stateless graph (`student_stateless.onnx`) for the stock car software: one input `FRONT_FACING_CAMERA` with the last
K frames stacked as channels (oldest first), first output `action_probs`. It cannot see its previous actions (the
stock software does not feed them), so it runs the history over the stacked frames with zero previous actions.
"""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import torch
from torch import Tensor, nn

from student.model import StudentModel

OPSET = 17


class StatefulGraph(nn.Module):
    """One control step with explicit state, deterministic (eval mode)."""

    def __init__(self, model: StudentModel) -> None:
        super().__init__()
        self.model = model.eval()

    def forward(self, camera: Tensor, prev_action: Tensor, history_in: Tensor, motion: Tensor | None = None):
        outputs, heads, history_out = self.model.step(camera * (1.0 / 255.0), prev_action, history_in, motion)
        latencies = self.model.spec.estimates.latencies
        if not heads:
            zero = torch.zeros(camera.shape[0], 1)
            return outputs, history_out, zero, *(zero for _ in latencies), zero
        probs = [torch.softmax(heads[f"{name}_logits"], -1) for name in latencies]
        return outputs, history_out, heads["z_hat"], *probs, self.forward_estimates(heads)

    def forward_estimates(self, heads: dict[str, Tensor]) -> Tensor:
        """The `estimates` output: the heads' normalized estimates in physical units (the task's regressions)."""
        spec = self.model.spec.estimates
        return torch.stack(list(spec.denormalize(heads["estimates"]).values()), -1)


class StatelessGraph(nn.Module):
    """K stacked frames (1, K, 120, 160) raw -> action probabilities; history recomputed over the stack."""

    def __init__(self, model: StudentModel, frames: int) -> None:
        super().__init__()
        self.model, self.frames = model.eval(), frames

    def forward(self, stacked: Tensor) -> Tensor:
        cam = stacked.unsqueeze(2) * (1.0 / 255.0)  # (1, K, 1, H, W)
        prev = torch.zeros(stacked.shape[0], self.frames, 2)
        mask = torch.ones(stacked.shape[0], self.frames, dtype=torch.bool)
        outputs, _ = self.model.forward_window(cam, prev, mask)
        return torch.softmax(outputs[:, -1], -1)


def output_names(model: StudentModel) -> list[str]:
    """The stateful graph's outputs: action logits (or means), the new state, z-hat, one class-probability output per
    latency the task estimates (`{name}_probs`), and the regressed estimates in physical units."""
    latencies = [f"{name}_probs" for name in model.spec.estimates.latencies]
    return ["action_logits", "history_out", "z_hat", *latencies, "estimates"]


def reads_odometry(model: StudentModel) -> bool:
    return model.estimator is not None and model.estimator.reads_odometry


def export_stateful(model: StudentModel, path: Path) -> Path:
    """The stateful graph; a student whose factor estimator reads odometry takes a fourth input `motion` (1, 3), the
    normalized body velocities between the previous frame and this one (`student.deploy.StudentRuntime` runs the
    odometry and feeds it)."""
    graph = StatefulGraph(model)
    state = model.init_state(1)
    dummy: tuple[Tensor, ...] = (torch.zeros(1, 1, 120, 160), torch.zeros(1, model.spec.proprio_dim), state)
    names = ["camera", "prev_action", "history_in"]
    if reads_odometry(model):
        dummy, names = (*dummy, torch.zeros(1, 3)), [*names, "motion"]
    torch.onnx.export(
        graph, dummy, str(path), input_names=names, output_names=output_names(model),
        opset_version=OPSET, dynamo=False, external_data=False,
    )  # fmt: skip
    return path


def export_stateless(model: StudentModel, path: Path, frames: int) -> Path:
    graph = StatelessGraph(model, frames)
    torch.onnx.export(
        graph, (torch.zeros(1, frames, 120, 160),), str(path), input_names=["FRONT_FACING_CAMERA"],
        output_names=["action_probs"], opset_version=OPSET, dynamo=False, external_data=False,
    )  # fmt: skip
    return path


def odometry_info(model: StudentModel, env_cfg) -> dict:
    """`export.json`'s `odometry` entry for a student whose estimator reads odometry (the calibrated camera and the
    control period the deployment loop's tracker needs); empty otherwise."""
    if not reads_odometry(model):
        return {}
    return {"odometry": {"optics": dataclasses.asdict(env_cfg.optics), "dt": env_cfg.dt}}


def add_metadata(path: Path, props: dict[str, str]) -> None:
    """Write `metadata_props` into an ONNX file (atomically) and check the model."""
    import onnx

    m = onnx.load(str(path))
    del m.metadata_props[:]
    for k, v in props.items():
        entry = m.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.checker.check_model(m)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(m, str(tmp))
    tmp.replace(path)


def export_openvino(onnx_path: Path, out_xml: Path) -> Path | None:
    """OpenVINO IR (`.xml` + `.bin`) from the ONNX file; None when openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    model = ov.convert_model(str(onnx_path))
    ov.save_model(model, str(out_xml), compress_to_fp16=False)
    return out_xml


def bundle(folder: Path, names: list[str], out: Path) -> Path:
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in names:
            tar.add(folder / name, arcname=name)
    tmp.replace(out)
    return out


def write_json(path: Path, data: dict) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return path


def closed_loop_parity(model: StudentModel, folder: Path, env, steps: int = 200, backend: str = "onnx") -> dict:
    """Drive the sim with the torch student for `steps` steps while the exported graph runs alongside on the same
    frames with its own recurrent state; report the largest logit difference and the argmax agreement."""
    from student.deploy import StudentRuntime

    runtime = StudentRuntime(folder, backend=backend)
    state = model.init_state(1)
    obs = env.get_observations()
    max_diff, agree, est_diff = 0.0, 0, 0.0
    with torch.no_grad():
        for _ in range(steps):
            cam, prev = obs["camera"][:1], obs["proprio"][:1, : model.spec.proprio_dim]
            runtime.prev_action = prev.numpy().astype("float32")
            result = runtime.infer(cam.float().numpy())
            exported = result["action_logits"]
            motion = None if runtime.last_motion is None else torch.from_numpy(runtime.last_motion)
            out, heads, state = model.step(cam, prev, state, motion)  # the odometry's motion, as the car measured it
            if heads:
                est = StatefulGraph(model).forward_estimates(heads)
                est_diff = max(est_diff, float(abs(result["estimates"] - est.numpy()).max()))
            max_diff = max(max_diff, float(abs(exported - out.numpy()).max()))
            agree += int(exported.argmax() == out.argmax().item())
            action = model.actions(out)
            obs, _, dones, _ = env.step(action)
            if bool(dones[0]):
                state.zero_()
                runtime.reset()
    return {
        "steps": steps,
        "max_logit_diff": max_diff,
        "argmax_agreement": agree / steps,
        "max_estimate_diff": est_diff,
    }
