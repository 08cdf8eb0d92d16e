"""`experiments.calibrate dynamics` and `experiments.run_car proxy --protocol calibration` end to end: the protocol log,
the merged calibrated.yaml that --env-file reads, and one-line refusals of a degenerate log and an unconverged fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import yaml

from envs.racing.config import EnvConfig
from experiments import cli

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--fit.adam-iterations", "3", "--fit.refine-iterations", "1", "--fit.cma-generations", "2",
         "--fit.max-latency-ms", "150", "--fit.bootstrap", "2", "--fit.top-latencies", "1"]  # fmt: skip
"""a fit that runs in seconds (what is tested here is the plumbing, not the recovery)"""


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip


def test_proxy_protocol_log_fitted_into_a_calibrated_yaml_beside_the_optics(tmp_path):
    log = tmp_path / "drive.h5"
    proc = run("experiments.run_car", "proxy", "--reality.physics", "bicycle", "--log-out", str(log))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with h5py.File(log, "r") as f:
        assert f.attrs["pose_source"] == "true camera pose" and f["true_pose"].shape == (f.attrs["n_valid"], 3)
        assert json.loads(f.attrs["truth"])["throttle_exponent"] == 1.2  # the proxy's actuation effects
    (tmp_path / "calibrated.yaml").write_text("optics:\n  hfov_deg: 119.0\n")
    proc = run("experiments.calibrate", "dynamics", "--log", str(log), "--out-dir", str(tmp_path), *QUICK,
               "--fit.max-residual", "1000", "--fit.max-restart-spread", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fitted vs true" in proc.stdout
    data = yaml.safe_load((tmp_path / "calibrated.yaml").read_text())
    assert data["optics"] == {"hfov_deg": 119.0} and {"car", "randomization", "effects"} <= set(data)
    report = json.loads((tmp_path / "dynamics_report.json").read_text())
    assert report["written"] and report["truth"]["motor_gain"] > 0 and "small-steering" in report["segment_residuals"]
    env = cli.env_with_file(EnvConfig(), data, str(tmp_path / "calibrated.yaml"))
    assert env.optics.hfov_deg == 119.0 and env.car.motor_time_constant == data["car"]["motor_time_constant"]


def test_degenerate_log_and_unconverged_fit_are_refused_in_one_line(tmp_path):
    log = tmp_path / "drive.h5"
    assert run("experiments.run_car", "proxy", "--reality.physics", "bicycle", "--log-out", str(log)).returncode == 0
    proc = run("experiments.calibrate", "dynamics", "--log", str(log), "--out-dir", str(tmp_path), *QUICK,
               "--fit.max-residual", "0")  # fmt: skip
    assert proc.returncode == 2 and "did not converge" in proc.stderr and "residual" in proc.stderr
    assert not (tmp_path / "calibrated.yaml").exists()
    assert not json.loads((tmp_path / "dynamics_report.json").read_text())["written"]
    proc = run("experiments.calibrate", "dynamics", "--log", str(log), "--min-seconds", "600", *QUICK)
    assert proc.returncode == 2 and "the fit needs at least 600 s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
