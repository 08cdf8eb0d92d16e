"""The bimanual-lift camera student end to end through the scripts: `train_teacher smoke` and `distill_student smoke`
with `--task bimanual-lift` in subprocesses (one teacher and one student shared by the module), then `evaluate` and
`export_student` in this process (success by third of each factor; torch parity and one-core latency), and the
exported graph driving the sim in the 20 Hz deployment loop; a teacher or student of another task is refused in one
line naming both tasks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import envs.task as task_registry
import experiments.cli as cli
from envs.bimanual.task import BimanualEvalConfig
from envs.errors import ConfigError
from envs.task import get_task
from student.deploy import BoxCommands, ExportError, StudentRuntime
from student.export import closed_loop_parity
from student.loaded import load_student
from student.sim_deploy import drive_sim
from student.task_evaluation import physical_factors, score_by_factor

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[2]
TASK = ["--task", "bimanual-lift"]


def script(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def lift_teacher(tmp_path_factory) -> Path:
    """`train_teacher smoke --task bimanual-lift`: a teacher checkpoint of the arm task."""
    run_dir = tmp_path_factory.mktemp("lift_teacher")
    proc = script("experiments.train_teacher", "smoke", *TASK, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir / "teacher.pt"


@pytest.fixture(scope="module")
def lift_student(lift_teacher, tmp_path_factory) -> Path:
    """`distill_student smoke --task bimanual-lift` from that teacher: the student's run directory."""
    run_dir = tmp_path_factory.mktemp("lift_student")
    proc = script(
        "experiments.distill_student", "smoke", *TASK, "--teacher", str(lift_teacher), "--run-dir", str(run_dir)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_distill_smoke_trains_the_arm_student_from_the_task_contract(lift_student):
    task = get_task("bimanual-lift")
    summary = json.loads((lift_student / "eval.json").read_text())
    assert summary["rounds"] == 2 and summary["samples"] > 0
    for who in ("student", "teacher"):
        assert 0.0 <= summary[who]["success"] <= 1.0 and summary[who]["episodes"] == 2
        assert summary[who]["success_ci_low"] <= summary[who]["success"] <= summary[who]["success_ci_high"]
    assert {"object_mass", "friction", "com_shift"} <= set(summary["by_factor"]["student"])
    assert "object_size" not in summary["by_factor"]["student"], "a factor that does not vary has no thirds"
    assert "action_latency_acc" in next(iter(summary["estimation"].values()))
    assert (lift_student / "student_camera.png").is_file()
    student = load_student(lift_student / "checkpoints" / "round_002.pt")
    spec, history = student.model.spec, student.model.history
    assert student.task is task and spec.image_hw == (96, 96) and spec.kind == "continuous"
    assert spec.estimates == task.estimates and spec.action_columns == task.previous_action_dim == 10
    assert spec.proprio_dim > spec.action_columns, "the arm student reads the whole proprio group"
    # the history encoder estimates the arm's factors and latency, nothing of racing's
    assert history.estimate_head.out_features == len(task.estimates.regressions) == 5
    assert list(history.latency_heads) == ["action_latency"]


def test_evaluate_reports_success_by_factor_third_and_refuses_a_missing_proxy(lift_student, tmp_path, monkeypatch):
    from experiments.evaluate import BIMANUAL_PRESETS
    from experiments.evaluate import main as evaluate

    ckpt = str(lift_student / "checkpoints" / "round_002.pt")
    smoke = replace(BIMANUAL_PRESETS["smoke"][1], checkpoint=ckpt, out_dir=str(tmp_path))
    with task_flag("bimanual-lift"):
        with monkeypatch.context() as patch:  # the task as registered before it had a reality proxy
            patch.setitem(task_registry._REGISTRY, "bimanual-lift", replace(get_task("bimanual-lift"),
                                                                            reality_env_config=None))  # fmt: skip
            with pytest.raises(ConfigError, match=r"^--world proxy: task 'bimanual-lift' has no reality proxy yet"):
                evaluate(replace(smoke, world="proxy"))
        evaluate(smoke)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["task"] == "bimanual-lift" and len(result["episodes"]) == 2 and len(result["worlds"]) == 2
    assert {"success", "success_ci_low", "success_ci_high"} <= set(result["metrics"])
    assert result["by_factor"] and all(len(rows) == 2 for rows in result["by_factor"].values())  # 2 bins of one
    assert result["estimation"], "a student's estimates are scored by time since reset"


def test_evaluate_in_the_reality_proxy_records_its_world(lift_student, tmp_path):
    """`evaluate proxy --task bimanual-lift`: the episodes run in the proxy's world (its fixed mass and friction, not
    the training draw), and eval.json names the variant and part."""
    from envs.bimanual.reality import ArmRealityConfig
    from experiments.evaluate import BIMANUAL_PRESETS
    from experiments.evaluate import main as evaluate

    ckpt = str(lift_student / "checkpoints" / "round_002.pt")
    cfg = replace(BIMANUAL_PRESETS["proxy"][1], checkpoint=ckpt, out_dir=str(tmp_path),
                  eval=BimanualEvalConfig(episodes=2), reality=ArmRealityConfig(variant="heavy-slippery"),
                  estimation=False)  # fmt: skip
    with task_flag("bimanual-lift"):
        evaluate(cfg)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["world"] == "proxy" and result["reality"]["variant"] == "heavy-slippery"
    assert result["reality"]["part"] == "all" and len(result["episodes"]) == 2
    frictions = {round(w["friction"], 6) for w in result["worlds"]}
    assert frictions == {round(result["reality"]["friction"], 6)}, "every episode in the proxy's friction"


def test_export_parity_latency_and_the_20hz_sim_loop(lift_student, tmp_path):
    from experiments.export_student import ExportConfig
    from experiments.export_student import main as export

    ckpt = lift_student / "checkpoints" / "round_002.pt"
    out = tmp_path / "export"
    with task_flag("bimanual-lift"):
        result = export(ExportConfig(checkpoint=str(ckpt), out_dir=str(out), stateless=False, openvino=False,
                                     parity_steps=0, latency_steps=50))  # fmt: skip
    info = json.loads((out / "export.json").read_text())
    assert info["image_hw"] == [96, 96] and info["control_hz"] == 20.0 and info["previous_action_dim"] == 10
    assert result["latency"]["median_ms"] < 5.0
    student = load_student(ckpt)
    env = student.task.make_env(student.task.student_env_config(student.env_cfg, 1, None))
    parity = closed_loop_parity(student.model, out, env, steps=25)
    assert parity["max_logit_diff"] <= 1e-4 and parity["max_estimate_diff"] <= 1e-4, parity
    runtime = StudentRuntime(out)
    with pytest.raises(ExportError, match="proprio readings besides the previous action"):
        runtime.infer(np.zeros((1, 1, 96, 96), np.float32))
    clock = FakeClock()
    counts = drive_sim(runtime, env, steps=30, clock=clock, sleep=clock.sleep)
    assert counts["rate_hz"] == 20.0 and counts["steps"] == counts["sim_steps"] == 30
    assert counts["stopped"] == counts["overruns"] == counts["safe_stops"] == 0
    assert counts["max_period_ms"] == pytest.approx(50.0, abs=0.1)


def test_the_default_arm_student_exports_with_its_per_step_time(lift_student, tmp_path):
    """The `default` preset's architecture (random weights: the time per step does not depend on them), exported with
    its per-step time on one core measured (the figure is a benchmark's, not a test's: only its report is checked)."""
    from datasets.checkpoints import load_checkpoint, save_atomic
    from envs.config_io import to_yaml
    from experiments.distill_student import BIMANUAL_STUDENT
    from experiments.export_student import ExportConfig
    from experiments.export_student import main as export
    from student.model import StudentModel

    data = load_checkpoint(lift_student / "checkpoints" / "round_002.pt")
    model = StudentModel(BIMANUAL_STUDENT, load_student(lift_student / "checkpoints" / "round_002.pt").model.spec)
    assert model.cfg.context == 40, "the history encoder spans 2 s at 20 Hz"
    data.update(model=model.state_dict(), student_yaml=to_yaml(BIMANUAL_STUDENT))
    ckpt = save_atomic(data, tmp_path / "default.pt")
    with task_flag("bimanual-lift"):
        result = export(ExportConfig(checkpoint=str(ckpt), out_dir=str(tmp_path / "out"), stateless=False,
                                     openvino=False, parity_steps=0, latency_steps=200))  # fmt: skip
    latency = result["latency"]
    assert 0.0 < latency["median_ms"] <= latency["p99_ms"] and latency["steps"] == 200, latency


@contextlib.contextmanager
def task_flag(task: str):
    """`--task` as a script's `main` sees it (`current_task()`), for calling a script's `main` in this process."""
    cli._current_task = task
    try:
        yield
    finally:
        cli._current_task = cli.DEFAULT_TASK


class FakeClock:
    """Time that moves only when the loop sleeps: every control period is exactly the rate's."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


# Runs each script's `__main__` in one process (imports paid once): the cases that must be refused in one line.
CHILD = """
import contextlib, io, json, runpy, sys
results = []
for args in json.loads(sys.argv[1]):
    err, code = io.StringIO(), None
    sys.argv = args
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(args[0], run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code
    results.append((code, err.getvalue()))
print(json.dumps(results))
"""


def test_a_policy_of_another_task_is_refused_in_one_line_naming_both(lift_teacher, lift_student, teacher_path):
    racing_teacher, lift = str(teacher_path), str(lift_student / "checkpoints" / "round_002.pt")
    cases = [
        (["experiments.distill_student", "smoke", *TASK, "--teacher", racing_teacher],
         f"error: --teacher {racing_teacher}: made for task 'racing', used with task 'bimanual-lift'"),
        (["experiments.distill_student", "smoke", "--teacher", str(lift_teacher)],
         f"error: --teacher {lift_teacher}: made for task 'bimanual-lift', used with task 'racing'"),
        (["experiments.export_student", "default", "--checkpoint", lift],
         f"error: --checkpoint {lift}: made for task 'bimanual-lift', used with task 'racing'"),
        (["experiments.evaluate", "default", "--checkpoint", lift],
         f"error: --checkpoint {lift}: made for task 'bimanual-lift', used with task 'racing'"),
        (["experiments.evaluate", "default", *TASK, "--checkpoint", racing_teacher],
         f"error: --checkpoint {racing_teacher}: made for task 'racing', used with task 'bimanual-lift'"),
    ]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([args for args, _ in cases])], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (code, err), (args, line) in zip(json.loads(proc.stdout.strip().splitlines()[-1]), cases):
        assert code == 2 and "Traceback" not in err, (args, err[-2000:])
        assert [x for x in err.strip().splitlines() if "[Genesis]" not in x] == [line], (args, err)


def test_box_commands_clamp_to_the_box_and_stop_at_its_centre():
    commands = BoxCommands({"kind": "continuous", "dim": 3, "low": -1.0, "high": 1.0})
    command, previous = commands.command(np.array([[0.5, -2.0, 3.0]], np.float32))
    assert np.array_equal(command.action, [[0.5, -1.0, 1.0]]) and np.array_equal(previous, command.action)
    assert not command.safe_stop and commands.stop().safe_stop and not commands.stop().action.any()
    with pytest.raises(ExportError, match="'discrete' action space; the task must register one"):
        BoxCommands({"kind": "discrete"})


def test_worlds_map_back_to_physical_units_and_score_by_thirds():
    task = get_task("bimanual-lift")
    lo, hi = task.factor_bounds["object_mass"]
    factors = torch.zeros(6, len(task.factor_names))
    factors[:, 0] = torch.tensor([-1.0, 1.0, 0.0, -0.5, 0.5, 0.2])  # object_mass, normalized
    worlds = physical_factors(task, factors)
    assert worlds[0]["object_mass"] == pytest.approx(lo) and worlds[1]["object_mass"] == pytest.approx(hi)
    assert worlds[2]["object_mass"] == pytest.approx((lo + hi) / 2)

    class Record:
        def __init__(self, success: bool) -> None:
            self.success = success

    records = [Record(s) for s in (True, False, True, True, False, False)]
    by_factor = score_by_factor(task, records, worlds)
    assert list(by_factor) == ["object_mass"], "only the factor that varies"
    # sorted by mass: -1 (win), -0.5 (win) | 0 (win), 0.2 (loss) | 0.5 (loss), 1 (loss)
    assert [row["success"] for row in by_factor["object_mass"]] == [1.0, 0.5, 0.0]
    assert [row["episodes"] for row in by_factor["object_mass"]] == [2.0, 2.0, 2.0]
    assert by_factor["object_mass"][0]["lo"] == pytest.approx(lo)


def test_estimates_are_scored_after_the_object_has_been_held():
    """Rows that carry the time the object has been held get `held` bins beside the time-since-reset ones: a student
    that knows the factors only once the object hangs from the grippers is exact there and guesses before."""
    from envs.task import get_task
    from student.task_evaluation import HELD_SECONDS, estimation_by_time, estimation_table

    task, gen = get_task("bimanual-lift"), torch.Generator().manual_seed(0)
    spec, n, steps, hz = task.estimates, 16, 120, 20.0
    truth = torch.zeros(n, len(spec.targets))
    truth[:, spec.column("action_latency")] = torch.randint(0, 3, (n,), generator=gen) * 0.01
    for name in spec.regressions:
        centre, scale = spec.scale[name]
        truth[:, spec.column(name)] = centre + scale * (2 * torch.rand(n, generator=gen) - 1)
    lifted = torch.randint(20, 60, (n,), generator=gen)  # the step each env's bar is first held
    rows = []
    for t in range(steps):
        held = (t - lifted).clamp(min=0).float() / hz
        guess = spec.normalize(truth) + torch.randn(n, len(spec.regressions), generator=gen)  # a wild guess
        known = (held >= HELD_SECONDS)[:, None]
        estimates = torch.where(known, spec.normalize(truth), guess)
        logits = torch.nn.functional.one_hot(torch.round(truth[:, 0] / 0.01).long(), 3).float() * 10.0
        rows.append(({"estimates": estimates, "action_latency_logits": logits}, truth, torch.full((n,), t / hz), held))
    by_time = estimation_by_time(task, rows, 0.01, 5)
    after, before = by_time[f"held ≥{HELD_SECONDS:g}s"], by_time[f"held 0-{HELD_SECONDS:g}s"]
    assert after["object_mass_r2"] > 0.99 and before["object_mass_r2"] < 0.5
    assert after["samples"] == int((steps - lifted - round(HELD_SECONDS * hz)).clamp(min=0).sum())
    assert after["action_latency_r2"] > 0.99 and "0-0.5s" in by_time
    assert "held" not in "".join(estimation_by_time(task, [r[:3] for r in rows], 0.01, 5)), "no held time: no bins"
    assert "action_latency R²" in [c.header for c in estimation_table(by_time, task, "t").columns]
