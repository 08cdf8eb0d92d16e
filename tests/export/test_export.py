"""Export -> load -> parity, metadata, bundle, runtime refusal, watchdog and real-log round trip."""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace

import numpy as np
import pytest
import torch

from datasets.checkpoints import save_atomic
from datasets.real_log import RealLogWriter, read_real_log
from envs.config_io import to_yaml
from envs.errors import ConfigError, GapbridgeError
from envs.racing.config import EnvConfig
from envs.racing.deploy import Command
from envs.racing.env import RacingEnv
from student.deploy import ExportError, LoopConfig, StudentRuntime, drive
from student.export import closed_loop_parity
from student.loaded import STUDENT_KIND
from student.model import StudentConfig, StudentModel
from student.networks import EncoderConfig
from tests.helpers import racing_spec

pytest.importorskip("onnxruntime")
ENV = EnvConfig(num_envs=1, camera="projective", compile=False)


def export_student(tmp, student_cfg: StudentConfig, parity_steps: int = 200):
    """A small random student saved as a checkpoint and exported; returns (export folder, model, result)."""
    from experiments.export_student import ExportConfig
    from experiments.export_student import main as export

    torch.manual_seed(0)
    env = RacingEnv(ENV)
    spec = racing_spec("discrete", env.action_space.num_choices, 8, 7, 5)
    model = StudentModel(student_cfg, spec)
    ckpt = save_atomic({
        "kind": STUDENT_KIND, "model": model.state_dict(), "student_yaml": to_yaml(student_cfg),
        "env_yaml": to_yaml(ENV), "output_spec": spec.to_dict(), "format_version": 2, "task": "racing",
        "action_space": json.dumps(env.action_space.to_metadata()),
    }, tmp / "student.pt")  # fmt: skip
    result = export(ExportConfig(checkpoint=str(ckpt), out_dir=str(tmp / "out"), parity_steps=parity_steps))
    return tmp / "out", model, result


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small random student exported once for the module."""
    return export_student(tmp_path_factory.mktemp("export"), StudentConfig())


def test_files_metadata_and_bundle(exported):
    out, _, result = exported
    for name in ("student.onnx", "student_stateless.onnx", "model_metadata.json", "export.json", "carfile.tar.gz"):
        assert (out / name).is_file(), name
    meta = json.loads((out / "model_metadata.json").read_text())
    assert meta["sensor"] == ["FRONT_FACING_CAMERA"] and meta["action_space_type"] == "discrete"
    assert meta["training_algorithm"] == "clipped_ppo" and len(meta["action_space"]) == 10
    assert {"steering_angle", "speed", "index"} == set(meta["action_space"][0])
    import onnx

    m = onnx.load(str(out / "student.onnx"))
    props = {p.key: p.value for p in m.metadata_props}
    assert props["gapbridge.image_size"] == "160x120" and json.loads(props["gapbridge.action_table"])[0] == [-30.0, 1.4]
    assert not list(out.glob("*.data")), "single-file ONNX (no external data)"
    with tarfile.open(out / "carfile.tar.gz") as tar:
        assert set(result["files"]) == set(tar.getnames())


def test_closed_loop_parity_including_recurrent_state(exported):
    out, model, result = exported
    for backend, parity in result["parity"].items():
        assert parity["steps"] == 200
        assert parity["max_logit_diff"] < 1e-4, backend
        assert parity["argmax_agreement"] == 1.0, backend
    again = closed_loop_parity(model, out, RacingEnv(replace(ENV, seed=3)), 50)
    assert again["max_logit_diff"] < 1e-4


def test_motion_student_exports_with_its_previous_frame_in_the_state(tmp_path):
    out, model, result = export_student(tmp_path, StudentConfig(encoder=EncoderConfig(motion=True)), parity_steps=60)
    # TCN buffer (28 steps x 32), factor estimator inputs (30 steps x 5), previous frame, seen flag
    assert list(model.init_state(1).shape) == [1, 28 * 32 + 30 * 5 + 120 * 160 + 1]
    for backend, parity in result["parity"].items():
        assert parity["max_logit_diff"] < 1e-4 and parity["argmax_agreement"] == 1.0, backend


def test_a_frozen_teacher_head_student_exports_the_free_heads_interface_in_parity(tmp_path):
    """A student acting through its teacher's frozen trunk exports the inputs and outputs a free-head student does
    (the deployment runtime is unchanged), and the graph carries its recurrent state as the torch student does."""
    import onnx
    import onnxruntime as ort

    from envs.task import get_task
    from student.export import export_stateful, export_stateless, output_names
    from student.teacher_head import teacher_head_spec
    from teacher.config import TeacherPolicyConfig
    from tests.helpers import in_process_teacher

    teacher = in_process_teacher(TeacherPolicyConfig(hidden_dims=(32, 16), dropout=0.3))
    free = StudentConfig(encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16))
    spec = racing_spec("discrete", 10, 8, 7, 5)
    head = teacher_head_spec(teacher, get_task("racing"), teacher.layout)
    frozen = StudentModel(replace(free, head="frozen-teacher"),
                          replace(spec, privileged_dim=teacher.layout.teacher, teacher_head=head))  # fmt: skip
    frozen.adopt_teacher(teacher)
    paths = [export_stateful(m, tmp_path / f"{name}.onnx") for name, m in (("free", StudentModel(free, spec)),
                                                                            ("frozen", frozen))]  # fmt: skip
    io = lambda g: ([i.name for i in g.input], [o.name for o in g.output])  # noqa: E731
    assert io(onnx.load(str(paths[0])).graph) == io(onnx.load(str(paths[1])).graph)
    export_stateless(frozen.eval(), tmp_path / "frozen_stateless.onnx", frames=2)
    session, names = ort.InferenceSession(str(paths[1])), output_names(frozen)
    g = torch.Generator().manual_seed(0)
    state, exported_state = frozen.init_state(1), frozen.init_state(1).numpy()
    with torch.no_grad():
        for _ in range(4):
            cam = torch.randint(0, 256, (1, 1, 120, 160), dtype=torch.uint8, generator=g)
            prev = torch.rand(1, 2, generator=g) * 2.0 - 1.0
            feed = {"camera": cam.float().numpy(), "prev_action": prev.numpy(), "history_in": exported_state}
            result = dict(zip(names, session.run(names, feed)))
            out, _, state = frozen.step(cam, prev, state)
            exported_state = result["history_out"]
            assert np.abs(result["action_logits"] - out.numpy()).max() <= 1e-4
            assert np.abs(exported_state - state.numpy()).max() <= 1e-4
    assert out.abs().max() > 0.05, "logits of order 1: the parity tolerance means something"


def test_the_privileged_head_leaves_the_exported_graphs_as_they_were(tmp_path):
    """The privileged head is a training signal only: a student with it exports the graphs the same student without
    it does (the stateful one byte for byte; the stateless one up to the exporter's numbering of weight names)."""
    import onnx
    from onnx import numpy_helper

    from adaptation.factor_estimator import EstimatorConfig
    from student.export import export_stateful, export_stateless

    cfg = StudentConfig(encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16), estimator=EstimatorConfig(kind="none"))
    spec = racing_spec("discrete", 10, 8, 7, 5)
    graphs = []
    for privileged_dim in (0, 6):
        torch.manual_seed(0)
        model = StudentModel(cfg, replace(spec, privileged_dim=privileged_dim))
        assert (model.privileged_head is None) == (privileged_dim == 0)
        paths = (export_stateful(model, tmp_path / f"{privileged_dim}.onnx"),
                 export_stateless(model, tmp_path / f"{privileged_dim}_stateless.onnx", frames=2))  # fmt: skip
        graphs.append([onnx.load(str(p)).graph for p in paths])
    (plain, plain_stateless), (aux, aux_stateless) = graphs
    assert plain.SerializeToString() == aux.SerializeToString()
    describe = lambda g: ([(n.op_type, len(n.input)) for n in g.node], [o.name for o in g.output])  # noqa: E731
    assert describe(plain_stateless) == describe(aux_stateless) and len(plain_stateless.node) > 10
    weights = [[numpy_helper.to_array(w) for w in g.initializer] for g in (plain_stateless, aux_stateless)]
    assert len(weights[0]) == len(weights[1]) and all(np.array_equal(a, b) for a, b in zip(*weights, strict=True))


def test_odometry_estimator_student_exports_a_motion_input_the_runtime_feeds(tmp_path):
    """The graph takes the odometry's motion; the runtime tracks the frames through the camera export.json names,
    and its estimates match the torch student's fed the same motion. Without the odometry entry it is refused."""
    from adaptation.factor_estimator import EstimatorConfig

    cfg = StudentConfig(estimator=EstimatorConfig(motion="odometry", dilations=(1, 2)))
    out, model, result = export_student(tmp_path, cfg, parity_steps=40)
    info = json.loads((out / "export.json").read_text())
    assert info["odometry"]["dt"] == pytest.approx(ENV.dt) and info["odometry"]["optics"]["hfov_deg"] > 0
    for backend, parity in result["parity"].items():
        assert parity["max_logit_diff"] < 1e-4 and parity["argmax_agreement"] == 1.0, backend
        assert parity["max_estimate_diff"] < 1e-3, backend
    runtime = StudentRuntime(out)
    assert runtime.backend.inputs["motion"] == [1, 3]
    env = RacingEnv(ENV)
    straight = min(range(env.action_space.num_choices), key=lambda i: (abs(env.action_space.choices[i][0]),
                                                                        -env.action_space.choices[i][1]))  # fmt: skip
    obs, moved = env.get_observations(), []
    for _ in range(12):
        runtime.infer(obs["camera"][:1].float().numpy())
        moved.append(runtime.last_motion.copy())
        obs, _, _, _ = env.step(torch.tensor([[float(straight)]]))
    assert not moved[0].any(), "no frame before the first"
    assert any(not np.allclose(m, moved[1]) for m in moved[2:]), "the measured motion changes as the car speeds up"
    runtime.reset()
    runtime.infer(obs["camera"][:1].float().numpy())
    assert not runtime.last_motion.any(), "a reset starts the tracker again"
    info.pop("odometry")
    (out / "export.json").write_text(json.dumps(info))
    with pytest.raises(ExportError, match="odometry"):
        StudentRuntime(out)


def test_stateless_variant_runs_on_stacked_frames(exported):
    import onnxruntime as ort

    out, _, _ = exported
    info = json.loads((out / "export.json").read_text())
    sess = ort.InferenceSession(str(out / "student_stateless.onnx"), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].name == "FRONT_FACING_CAMERA"
    k = info["stateless_frames"]
    frames = np.random.default_rng(0).integers(0, 256, (1, k, 120, 160)).astype(np.float32)
    probs = sess.run(None, {"FRONT_FACING_CAMERA": frames})[0]
    assert probs.shape == (1, 10) and abs(probs.sum() - 1) < 1e-5
    # The same K frames stepped through the torch model from a reset state, with zero previous actions.
    model = exported[1].eval()
    state = model.init_state(1)
    with torch.no_grad():
        for i in range(k):
            logits, _, state = model.step(torch.from_numpy(frames[:, i : i + 1]) / 255.0, torch.zeros(1, 2), state)
    np.testing.assert_allclose(probs, torch.softmax(logits, -1).numpy(), atol=1e-4)


def test_runtime_refuses_broken_exports(exported, tmp_path):
    out, _, _ = exported
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (bad / "model_metadata.json").unlink()
    with pytest.raises(GapbridgeError, match="missing model_metadata.json"):
        StudentRuntime(bad)
    shutil.copy(out / "model_metadata.json", bad / "model_metadata.json")
    meta = json.loads((bad / "model_metadata.json").read_text())
    meta["action_space"] = meta["action_space"][:6]
    (bad / "model_metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match="outputs 10 actions but the action space has 6"):
        StudentRuntime(bad)
    shutil.copy(out / "model_metadata.json", bad / "model_metadata.json")
    info = json.loads((bad / "export.json").read_text())
    info["history_shape"] = [1, 3, 3]
    (bad / "export.json").write_text(json.dumps(info))
    with pytest.raises(ExportError, match="input 'history_in' has shape"):
        StudentRuntime(bad)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += max(0.0, s)


class SlowSource:
    """Frames with scripted delays: a late frame at step 3, then the camera dies after 6 frames."""

    def __init__(self, clock):
        self.clock, self.i = clock, 0

    def read(self):
        self.i += 1
        if self.i > 6:
            self.clock.t += 0.2
            return None
        stamp = self.clock.t - (0.5 if self.i == 3 else 0.0)
        return np.full((120, 160, 3), 100, np.uint8), stamp


def test_watchdog_repeats_late_frames_and_stops_on_camera_loss(exported, tmp_path):
    out, _, _ = exported
    runtime = StudentRuntime(out)
    clock = FakeClock()
    sent: list[Command] = []
    log = RealLogWriter(tmp_path / "log.h5")
    inferred = []
    infer = runtime.infer
    runtime.infer = lambda camera: inferred.append(1) or infer(camera)
    counts = drive(runtime, SlowSource(clock), sent.append, LoopConfig(stale_after=0.5), log, clock, clock.sleep)
    log.close()
    assert counts == {"steps": 6, "late": 1, "stopped": 1, "overruns": 0, "stalls": 0, "max_period_ms": 66.7}
    assert len(inferred) == 5, "the late frame is not run through the network: its command is a repeat"
    assert sent[2].action == sent[1].action and sent[2].steering_deg == sent[1].steering_deg
    assert sent[-1].safe_stop and sent[-1].speed == 0.0
    data = read_real_log(tmp_path / "log.h5")
    assert len(data["time"]) == 6 and data["late"].tolist() == [False, False, True, False, False, False]
    assert data["camera"].shape == (6, 120, 160) and (data["camera"] == 100).all()
    assert any("camera stale" in e for e in data["events"])
    assert np.isfinite(data["estimates"][0]).all()


def test_deploy_loop_drives_the_sim_through_the_export(exported, tmp_path):
    from experiments.run_car import RunCarConfig
    from experiments.run_car import main as run_car

    out, _, _ = exported
    summary = run_car(RunCarConfig(export=str(out), log_out=str(tmp_path / "sim_log.h5"), loop=LoopConfig(max_steps=30),
                                   sim=ENV))  # fmt: skip
    assert summary["steps"] == 30 and summary["stopped"] == 0
    assert len(read_real_log(tmp_path / "sim_log.h5")["time"]) == 30


def test_max_speed_setting_scales_the_command_sent_and_not_the_previous_action(exported):
    out, _, _ = exported
    full, slow = StudentRuntime(out), StudentRuntime(out, max_speed_percent=75.0)
    frame = np.full((1, 1, 120, 160), 90.0, np.float32)
    a, b = full.command(full.infer(frame)), slow.command(slow.infer(frame))
    assert a.action == b.action and a.steering_deg == b.steering_deg
    assert b.speed == pytest.approx(0.75 * a.speed) and min(abs(a.speed - 1.4), abs(a.speed - 2.8)) < 1e-6
    np.testing.assert_array_equal(full.prev_action, slow.prev_action)
    with pytest.raises(ConfigError, match="max_speed_percent"):
        StudentRuntime(out, max_speed_percent=0.0)
