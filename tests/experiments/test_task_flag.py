"""`--task` on every experiments/ script: its help, unknown and unserved tasks refused in one line, stages given it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

import envs.task as task_registry
from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from envs.task import TaskMismatchError, UnknownTaskError, get_task
from experiments import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for folder in ("experiments", "experiments/research")
    for path in (ROOT / folder).glob("*.py")
    if path.stem not in ("__init__", "cli")
)

# Runs each script's `__main__` in one process (imports are paid once): `--help`, a preset's `--help` and
# `--task nonsense`, each as (exit code, stdout, stderr).
CHILD = """
import contextlib, importlib, io, json, runpy, sys
results = {}
for module in sys.argv[1:]:
    preset = next(iter(importlib.import_module(module).PRESETS))
    for case, args in (("help", ["--help"]), ("preset", ["--task=racing", preset, "--help"]),
                       ("nonsense", [preset, "--task", "nonsense"])):
        out, err, code = io.StringIO(), io.StringIO(), None
        sys.argv = [module, *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exit:
                code = exit.code
        results[f"{module} {case}"] = (code, out.getvalue(), err.getvalue())
print(json.dumps(results))
"""


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def test_every_script_documents_task_and_refuses_an_unknown_one_in_one_line():
    assert "experiments.train_teacher" in SCRIPTS and "experiments.research.probe_student" in SCRIPTS
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *SCRIPTS], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for module in SCRIPTS:
        for case in ("help", "preset"):
            code, out, err = results[f"{module} {case}"]
            assert code == 0, f"{module} {case}: {err[-2000:]}"
            assert "--task NAME" in out and "known tasks: bimanual-handover, bimanual-lift, racing" in out, (
                f"{module} {case}: {out[:2000]}"
            )
        code, out, err = results[f"{module} nonsense"]
        assert code == 2 and "Traceback" not in err, f"{module}: {err[-2000:]}"
        assert err.strip().splitlines() == [
            "error: unknown task 'nonsense'; known tasks: bimanual-handover, bimanual-lift, racing"
        ], err


def test_task_racing_runs_a_script_as_before(tmp_path):
    """`--task racing` anywhere on the line is the default; an unknown one exits 2 in one line from a real process."""
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.drive_scripted", "smoke", "--task", "racing", "--out-dir", str(tmp_path)],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["oval"]["metrics"]["lap_completion"] == 1.0
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.drive_scripted", "--task=nonsense", "smoke"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: unknown task 'nonsense'; known tasks: bimanual-handover, bimanual-lift, racing"
    ]


@dataclass(frozen=True)
class Cfg:
    env: EnvConfig = field(default_factory=EnvConfig)
    steps: int = 1


PRESETS = {"default": ("the default", Cfg()), "smoke": ("a small one", Cfg(steps=2))}


def test_task_is_taken_out_anywhere_and_defaults_to_racing():
    assert cli.split_task(["smoke", "--steps", "3"]) == ("racing", ["smoke", "--steps", "3"])
    assert cli.split_task(["--task", "racing", "smoke"]) == ("racing", ["smoke"])
    assert cli.split_task(["smoke", "--task=racing", "--steps", "3"]) == ("racing", ["smoke", "--steps", "3"])
    assert cli.split_task(["--task", "racing", "--task=racing"]) == ("racing", [])
    with pytest.raises(UnknownTaskError, match=r"^unknown task 'nonsense'; known tasks: .*racing"):
        cli.split_task(["smoke", "--task", "nonsense"])
    with pytest.raises(ConfigError, match=r"--task needs a task name; known tasks: .*racing"):
        cli.split_task(["smoke", "--task"])
    with pytest.raises(ConfigError, match=r"--task needs a task name"):
        cli.split_task(["--task", "--steps", "3"])


def test_presets_are_chosen_by_task_and_flat_presets_are_racing_s():
    by_task = {"racing": PRESETS}
    assert cli.parse_task(by_task, "", ["--task", "racing", "smoke"]) == ("racing", Cfg(steps=2))
    assert cli.parse_task(by_task, "", ["--steps", "5"]) == ("racing", Cfg(steps=5))
    assert cli.parse(PRESETS, "", ["smoke", "--task=racing", "--steps", "4"]) == Cfg(steps=4)


def test_a_task_the_script_has_no_presets_for_is_refused_naming_its_tasks(monkeypatch):
    monkeypatch.setitem(task_registry._REGISTRY, "other", replace(get_task("racing"), name="other"))
    with pytest.raises(ConfigError, match=r"^--task other: this script has no presets for it; its tasks: racing$"):
        cli.parse_task({"racing": PRESETS}, "", ["--task", "other", "smoke"])


def test_a_config_of_another_task_s_env_is_refused_naming_both(monkeypatch):
    monkeypatch.setitem(task_registry._REGISTRY, "other", replace(get_task("racing"), name="other"))
    with pytest.raises(TaskMismatchError, match=r"made for task 'racing', used with task 'other'"):
        cli.parse_task({"racing": PRESETS, "other": PRESETS}, "", ["--task", "other"])


def test_run_gives_main_the_task_and_refuses_in_one_line(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(sys, "argv", ["script", "smoke", "--task", "racing"])
    cli.run(lambda cfg: seen.append((cli.current_task(), cfg)), {"racing": PRESETS}, "a script")
    assert seen == [("racing", Cfg(steps=2))]
    monkeypatch.setattr(sys, "argv", ["script", "--task", "nonsense"])
    with pytest.raises(SystemExit) as exit:
        cli.run(lambda cfg: None, {"racing": PRESETS}, "a script")
    assert exit.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # other tests may have registered tasks in this process
    assert line.startswith("error: unknown task 'nonsense'; known tasks: ") and "racing" in line


def test_the_demo_gives_every_stage_its_task(tmp_path, monkeypatch):
    from experiments import demo

    launched = []
    checkpoints = {"experiments.train_teacher": ("teacher", "iter_000001.pt"),
                   "experiments.distill_student": ("student", "round_001.pt")}  # fmt: skip

    def fake_stage(stage: str, module: str, args: list[str]) -> None:
        launched.append((module, args))
        folder, name = checkpoints.get(module, (None, None))
        if folder:
            (tmp_path / folder / "checkpoints").mkdir(parents=True)
            (tmp_path / folder / "checkpoints" / name).write_bytes(b"")
        if module == "experiments.select_checkpoint":
            raise cli.StageFailed(stage, module, 3)  # the last stage: stop before the results are read back

    monkeypatch.setattr(demo, "run_stage", fake_stage)
    with pytest.raises(cli.StageFailed):
        demo.main(replace(demo.PRESETS["smoke"][1], out_dir=str(tmp_path)))
    assert len(launched) == 6
    assert all(args[-2:] == ["--task", "racing"] for _, args in launched), launched


def test_every_ablation_variant_is_given_the_task_and_older_records_ran_racing(tmp_path):
    from experiments.ablate import VARIANTS, AblateConfig, recorded_command, variant_command

    cfg = AblateConfig(stage="student", teacher="teacher.pt", out_dir=str(tmp_path))
    for name in VARIANTS["student"]:
        assert variant_command(cfg, name)[-2:] == ["--task", "racing"]
    args = variant_command(cfg, "base")
    record = tmp_path / "command.json"
    record.write_text(json.dumps({"module": "experiments.distill_student", "args": args[:-2]}))
    assert recorded_command(record) == {"module": "experiments.distill_student", "args": args}
    assert recorded_command(tmp_path / "none.json") is None
