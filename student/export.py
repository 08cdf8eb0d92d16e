"""Export the student: ONNX with explicit recurrent state, a stateless stock-software variant, OpenVINO IR, ONNX
metadata, the task's own files (racing: DeepRacer `model_metadata.json`), a `carfile.tar.gz` bundle, and the per-step
latency of the exported graph on one core.

Stateful graph (`student.onnx`): inputs `camera` (1, 1, H, W) float32 raw pixels 0-255 at the task's image size
(scaling is inside the graph, as a robot feeds raw pixels), the proprio input (`prev_action` (1, P) for a student that
reads the previous action alone; `proprio` (1, P) for one that reads the whole group, the previous action first),
`history_in`, and for a factor estimator that reads odometry `motion` (1, 3) (the deployment loop runs the odometry:
`export.json` carries its camera and period); outputs `action_logits` (logits, or a box policy's means), `history_out`,
`z_hat`, one `{latency}_probs` per latency the task estimates, and `estimates` (the task's regressions in physical
units: racing's friction, motor gain and body velocities; an arm's object mass, centre-of-mass offset, friction and
per-arm gain scale).

Stateless graph (`student_stateless.onnx`) for the stock car software: one input `FRONT_FACING_CAMERA` with the last
K frames stacked as channels (oldest first), first output `action_probs`. It cannot see its previous actions (the
stock software does not feed them), so it runs the history over the stacked frames with zero proprio inputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tarfile
import time
from pathlib import Path

import numpy as np
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
    """K stacked frames (1, K, H, W) raw -> action probabilities (a box policy: its clamped means); history recomputed
    over the stack."""

    def __init__(self, model: StudentModel, frames: int) -> None:
        super().__init__()
        self.model, self.frames = model.eval(), frames

    def forward(self, stacked: Tensor) -> Tensor:
        cam = stacked.unsqueeze(2) * (1.0 / 255.0)  # (1, K, 1, H, W)
        prev = torch.zeros(stacked.shape[0], self.frames, self.model.spec.proprio_dim)
        mask = torch.ones(stacked.shape[0], self.frames, dtype=torch.bool)
        outputs, _ = self.model.forward_window(cam, prev, mask)
        last = outputs[:, -1]
        return torch.softmax(last, -1) if self.model.spec.kind == "discrete" else self.model.actions(last)


def proprio_input(model: StudentModel) -> str:
    """The stateful graph's proprio input: `prev_action` when the student reads the previous action alone, `proprio`
    when it reads more of the group."""
    return "prev_action" if model.spec.proprio_dim == model.spec.action_columns else "proprio"


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
    dummy: tuple[Tensor, ...] = (torch.zeros(1, 1, *model.image_hw), torch.zeros(1, model.spec.proprio_dim), state)
    names = ["camera", proprio_input(model), "history_in"]
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
        graph, (torch.zeros(1, frames, *model.image_hw),), str(path), input_names=["FRONT_FACING_CAMERA"],
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
    frames and proprio readings with its own recurrent state; report the largest output difference (logits or means),
    the largest estimate difference, and for a categorical policy the argmax agreement."""
    from student.deploy import StudentRuntime

    runtime = StudentRuntime(folder, backend=backend)
    state = model.init_state(1)
    obs = env.get_observations()
    spec = model.spec
    max_diff, agree, est_diff = 0.0, 0, 0.0
    with torch.no_grad():
        for _ in range(steps):
            cam, prev = obs["camera"][:1], obs["proprio"][:1, : spec.proprio_dim]
            runtime.prev_action = prev[:, : spec.action_columns].numpy().astype("float32")
            readings = prev[:, spec.action_columns :].numpy() if spec.proprio_dim > spec.action_columns else None
            result = runtime.infer(cam.float().numpy(), readings)
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
    result = {"steps": steps, "max_logit_diff": max_diff, "max_estimate_diff": est_diff}
    if spec.kind == "discrete":
        result["argmax_agreement"] = agree / steps
    return result


def step_latency(folder: Path, steps: int = 300, warmup: int = 20, backend: str = "onnx") -> dict[str, float]:
    """Milliseconds per control step of the exported graph on one core (one inference thread, the process pinned to
    one CPU where the OS allows it): median, 90th and 99th percentile and the largest, over `steps` steps on random
    frames after `warmup` untimed ones."""
    from student.deploy import StudentRuntime

    runtime = StudentRuntime(folder, backend=backend, threads=1)
    pinned = hasattr(os, "sched_setaffinity")
    before = os.sched_getaffinity(0) if pinned else set()
    if pinned:
        os.sched_setaffinity(0, {min(before)})
    rng = np.random.default_rng(0)
    shape = (1, 1, *runtime.image_hw)
    readings = np.zeros((1, runtime.readings_dim), np.float32) if runtime.readings_dim else None
    times = []
    try:
        for i in range(warmup + steps):
            frame = rng.integers(0, 256, shape).astype(np.float32)
            t0 = time.perf_counter()
            runtime.command(runtime.infer(frame, readings))
            if i >= warmup:
                times.append(1000.0 * (time.perf_counter() - t0))
    finally:
        if pinned:
            os.sched_setaffinity(0, before)
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"median_ms": statistics.median(times), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "max_ms": times[-1],
            "steps": float(steps), "one_core": float(pinned)}  # fmt: skip
