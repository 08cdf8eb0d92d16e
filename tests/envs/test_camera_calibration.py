"""Camera calibration: the fits on synthetic corners (no rendering), then rendered in the reality proxy (one Genesis
render in a subprocess for the module) and calibrated: lens, mount, skipped images, refusals, the calibrated env."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from envs.camera_calibration import CalibrationError, Checkerboard, fit_lens, fit_mount, mount_from_pose
from envs.camera_model import CameraConfig
from envs.racing.calibration_scene import (
    board_view_poses,
    car_camera_pose,
    floor_view_poses,
    project_equidistant,
)

ROOT = Path(__file__).resolve().parents[2]
BOARD = Checkerboard()
CAMERA = CameraConfig(lens="fisheye", hfov_deg=120.0, pitch_deg=16.0, height=0.102, width=640, height_px=480)


def synthetic_corners(poses: list[np.ndarray], noise: float = 0.0, seed: int = 0) -> dict[str, np.ndarray]:
    """The board's corners as CAMERA images them from camera-to-world `poses`, with Gaussian pixel noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, pose in enumerate(poses):
        pts = (BOARD.object_points() - pose[:3, 3]) @ pose[:3, :3]
        uv, _ = project_equidistant(CAMERA, pts)
        out[f"view_{k:02d}.png"] = uv + noise * rng.standard_normal(uv.shape)
    return out


def test_mount_from_a_hand_built_pose():
    """A camera 0.1 m above the floor looking 20 degrees down, level: board pose -> (0.1, 20, 0)."""
    p = math.radians(20.0)
    forward, right = np.array([math.cos(p), 0.0, -math.sin(p)]), np.array([0.0, -1.0, 0.0])
    cam_to_world = np.stack([right, np.cross(forward, right), forward], 1)  # columns: x right, y down, z forward
    centre = np.array([-0.3, 0.05, 0.1])
    rot = cam_to_world.T
    height, pitch, roll = mount_from_pose(rot, -rot @ centre)
    assert (height, pitch, roll) == pytest.approx((0.1, 20.0, 0.0), abs=1e-9)


def test_the_fits_recover_a_pure_equidistant_lens_and_its_mount_from_exact_corners():
    found = synthetic_corners(board_view_poses(CAMERA, BOARD, 10, seed=3), noise=0.05)
    lens = fit_lens(found, BOARD, (640, 480), "fisheye")
    assert lens.hfov_deg == pytest.approx(120.0, abs=0.2)
    assert lens.principal_point == pytest.approx((319.5, 239.5), abs=0.2)
    assert 0.05 < lens.rms_px < 0.08  # the added noise: 0.05 px per coordinate, 0.07 px per corner
    free = fit_lens(found, BOARD, (640, 480), "fisheye", distortion=True)
    assert np.abs(free.D).max() < 0.02
    floors = [car_camera_pose(CAMERA, *car) for car in floor_view_poses(CAMERA, BOARD, 3)]
    mount = fit_mount(synthetic_corners(floors), BOARD, lens)
    assert mount.height == pytest.approx(0.102, abs=5e-4)  # through the fitted lens, itself off by the noise
    assert (mount.pitch_deg, mount.roll_deg) == pytest.approx((16.0, 0.0), abs=0.05)


def test_a_fit_that_opencv_gives_up_on_raises_calibration_error():
    """Corners that no camera sees (a view collapsed to one point) cannot be fitted."""
    found = synthetic_corners(board_view_poses(CAMERA, BOARD, 4))
    found["view_00.png"] = np.full_like(found["view_00.png"], 100.0)
    with pytest.raises(CalibrationError, match="did not converge"):
        fit_lens(found, BOARD, (640, 480), "fisheye")


# --- rendered in the reality proxy (Genesis), calibrated by experiments.calibrate ----------------------------------


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """`calibrate smoke --render` with a proxy camera that is not the default one: (images folder, output folder)."""
    root = tmp_path_factory.mktemp("calibration")
    proc = run(
        "experiments.calibrate", "smoke", "--render", str(root / "images"), "--out-dir", str(root / "out"),
        "--reality.camera-pitch-deg", "18", "--reality.camera-height", "0.095",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return root / "images", root / "out"


@pytest.mark.genesis
def test_render_then_calibrate_recovers_the_proxy_camera(calibrated):
    images, out = calibrated
    report = json.loads((out / "report.json").read_text())
    truth = json.loads((images / "truth.json").read_text())
    assert (truth["pitch_deg"], truth["height"], truth["hfov_deg"]) == (18.0, 0.095, 120.0)
    assert report["lens_fit"]["rms_px"] <= 0.5
    assert abs(report["optics"]["hfov_deg"] - 120.0) <= 3.0
    assert abs(report["optics"]["pitch_deg"] - 18.0) <= 1.0
    assert abs(report["optics"]["height"] - 0.095) <= 0.005
    assert report["images"]["skipped"] == [] and len(report["images"]["used"]) == 10
    assert report["floor_images"]["used"], report["floor_images"]
    written = yaml.safe_load((out / "calibrated.yaml").read_text())
    assert written == {"optics": report["optics"]} and written["optics"]["lens"] == "fisheye"


@pytest.mark.genesis
def test_images_without_a_board_are_listed_and_skipped(calibrated, tmp_path):
    from experiments import calibrate

    images, _ = calibrated
    folder = tmp_path / "board"
    folder.mkdir()
    for name in sorted(p.name for p in (images / "board").iterdir())[:6]:
        shutil.copy(images / "board" / name, folder / name)
    import cv2

    cv2.imwrite(str(folder / "blank.png"), np.full((480, 640), 128, np.uint8))
    cv2.imwrite(str(folder / "noise.png"), np.random.default_rng(0).integers(0, 255, (480, 640), dtype=np.uint8))
    cfg = replace(calibrate.PRESETS["camera"][1], images=str(folder), out_dir=str(tmp_path / "out"))
    report = calibrate.main(cfg)
    assert report["images"]["skipped"] == ["blank.png", "noise.png"] and len(report["images"]["used"]) == 6
    assert report["truth"] is None and (tmp_path / "out" / "calibrated.yaml").exists()
    assert set(report["optics"]) == {"lens", "hfov_deg"}  # no floor frames: the lens only


@pytest.mark.genesis
def test_too_few_images_and_a_residual_above_the_limit_are_refused_in_one_line(calibrated, tmp_path):
    images, _ = calibrated
    folder = tmp_path / "few"
    folder.mkdir()
    for name in sorted(p.name for p in (images / "board").iterdir())[:3]:
        shutil.copy(images / "board" / name, folder / name)
    import cv2

    cv2.imwrite(str(folder / "blank.png"), np.full((480, 640), 128, np.uint8))
    proc = run("experiments.calibrate", "camera", "--images", str(folder), "--out-dir", str(tmp_path / "o1"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "3 of 4 images show the 9x6 board, need --min-images 6; skipped: blank.png" in line
    assert not (tmp_path / "o1" / "calibrated.yaml").exists()
    from experiments import calibrate

    cfg = replace(calibrate.PRESETS["camera"][1], images=str(images / "board"), out_dir=str(tmp_path / "o2"))
    with pytest.raises(CalibrationError, match=r"reprojection error is 0\.\d+ px, above --max-rms-px 0.01: no calib"):
        calibrate.main(replace(cfg, max_rms_px=0.01))
    assert not (tmp_path / "o2" / "calibrated.yaml").exists() and (tmp_path / "o2" / "report.json").exists()


@pytest.mark.genesis
def test_a_calibrated_yaml_sets_the_optics_of_a_training_run(calibrated, tmp_path):
    _, out = calibrated
    optics = yaml.safe_load((out / "calibrated.yaml").read_text())["optics"]
    proc = run(
        "experiments.train_teacher", "smoke", "--env-file", str(out / "calibrated.yaml"), "--run-dir", str(tmp_path),
        "--trainer.iterations", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["env"]["optics"]
    assert {k: recorded[k] for k in optics} == optics
    assert recorded["width"] == 160 and recorded["forward"] == CameraConfig().forward  # the rest stays the preset's
