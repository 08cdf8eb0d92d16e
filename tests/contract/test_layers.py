"""The import layers of `pyproject.toml` hold (`lint-imports`), and they do catch a lower layer importing an upper
one, the pipeline a task, or one task another: the same contracts, run on a small tree with such imports, fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, config: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(cwd), "PATH": str(LINT.parent)}
    command = [str(LINT), "--config", str(config), "--no-cache"]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_project_keeps_its_layers():
    result = lint(ROOT, ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Layers import downward only KEPT" in result.stdout
    assert "never a particular task KEPT" in result.stdout
    assert "Tasks share only what envs/ holds for every task KEPT" in result.stdout


def test_the_contracts_catch_an_upward_import_and_a_task_import(tmp_path):
    for package in (
        "envs",
        "envs/racing",
        "envs/bimanual",
        "datasets",
        "adaptation",
        "teacher",
        "student",
        "experiments",
    ):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "student" / "model.py").write_text("X = 1\n")
    (tmp_path / "envs" / "racing" / "env.py").write_text("Y = 2\n")
    (tmp_path / "envs" / "task.py").write_text("from student.model import X\n")  # upward
    (tmp_path / "teacher" / "policy.py").write_text("from envs.racing.env import Y\n")  # a particular task
    (tmp_path / "envs" / "bimanual" / "scene.py").write_text("from envs.racing.env import Y\n")  # another task
    config = tmp_path / "pyproject.toml"
    text = (ROOT / "pyproject.toml").read_text()
    config.write_text(text[text.index("[tool.importlinter]") :])
    result = lint(tmp_path, config)
    assert result.returncode != 0
    assert "envs.task -> student.model" in result.stdout
    assert "teacher.policy -> envs.racing.env" in result.stdout
    assert "envs.bimanual.scene -> envs.racing.env" in result.stdout
