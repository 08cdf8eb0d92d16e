"""`--env-file` on the scripts with an env config: the file's sections over the preset's env, flags over the file,
and one-line refusals naming the key and the file."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from experiments import cli

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Cfg:
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=8))
    steps: int = 1


@dataclass(frozen=True)
class NoEnv:
    steps: int = 1


PRESETS = {"default": ("the default", Cfg()), "smoke": ("a small one", Cfg(steps=2))}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "calibrated.yaml"
    path.write_text(text)
    return str(path)


def test_the_file_goes_over_the_preset_and_the_flags_over_the_file(tmp_path):
    path = write(tmp_path, "# from calibration\noptics:\n  lens: fisheye\n  hfov_deg: 119.5\n  pitch_deg: 15.8\n")
    cfg = cli.parse(PRESETS, "", ["smoke", "--env-file", path])
    assert (cfg.env.optics.lens, cfg.env.optics.hfov_deg, cfg.env.optics.pitch_deg) == ("fisheye", 119.5, 15.8)
    assert cfg.env.optics.height == 0.10 and cfg.env.num_envs == 8 and cfg.steps == 2  # the rest is the preset's
    cfg = cli.parse(PRESETS, "", [f"--env-file={path}", "--env.optics.pitch-deg", "14", "--task", "racing"])
    assert (cfg.env.optics.pitch_deg, cfg.env.optics.hfov_deg, cfg.steps) == (14.0, 119.5, 1)
    path = write(tmp_path, "num_envs: 3\nrandomization:\n  friction: false\n")
    cfg = cli.parse(PRESETS, "", ["--env-file", path])
    assert cfg.env.num_envs == 3 and not cfg.env.randomization.friction and cfg.env.randomization.mass


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optics:\n  fov: 120\n", r"unknown key 'optics\.fov'"),
        ("optic:\n  hfov_deg: 120\n", r"unknown key 'optic'"),
        ("optics:\n  hfov_deg: wide\n", r"optics\.hfov_deg='wide'; expected float"),
        ("optics:\n  hfov_deg: 400\n", r"camera\.hfov_deg=400\.0 is out of range"),
        ("optics:\n  lens: spherical\n", r"env\.optics\.lens: 'spherical' is not one of"),
        ("optics: 3\n", r"'optics' is a section"),
        ("optics: [\n", r"not valid YAML"),
        ("- 1\n", r"expected a mapping of env sections"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key_and_the_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^--env-file {path}: .*{message}"):
        cli.parse(PRESETS, "", ["smoke", "--env-file", path])


def test_a_missing_file_two_files_and_a_script_without_env_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^--env-file nowhere\.yaml: no such file$"):
        cli.parse(PRESETS, "", ["--env-file", "nowhere.yaml"])
    with pytest.raises(ConfigError, match=r"^--env-file needs a YAML file"):
        cli.parse(PRESETS, "", ["smoke", "--env-file"])
    with pytest.raises(ConfigError, match=r"--env-file given as 'a\.yaml' and 'b\.yaml'"):
        cli.split_env_file(["--env-file", "a.yaml", "--env-file=b.yaml"])
    path = write(tmp_path, "num_envs: 3\n")
    with pytest.raises(ConfigError, match=r"this script has no env config"):
        cli.parse({"default": ("no env", NoEnv())}, "", ["--env-file", path])
    assert cli.split_env_file(["smoke", "--steps", "2"]) == ("", ["smoke", "--steps", "2"])


def test_a_script_refuses_a_bad_file_in_one_line_and_documents_the_flag(tmp_path):
    path = write(tmp_path, "optics:\n  fov: 120\n")
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.drive_scripted", "smoke", "--env-file", path], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --env-file {path}: unknown key 'optics.fov' (the env config has no such field)"
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.drive_scripted", "smoke", "--help"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "--env-file FILE" in proc.stdout
