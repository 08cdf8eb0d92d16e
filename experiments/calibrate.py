"""Camera calibration (real to sim): the lens from checkerboard photos, the mount from the board lying on the floor.

    python -m experiments.calibrate camera --images photos/board --floor-images photos/floor --out-dir outputs/cal
    python -m experiments.calibrate camera --render outputs/cal/images --out-dir outputs/cal   # in the reality proxy
    python -m experiments.calibrate camera --render outputs/cal/images --reality.camera-pitch-deg 18
    python -m experiments.calibrate dynamics --log real_log.h5 --out-dir outputs/cal   # dynamics and timing
    python -m experiments.calibrate dynamics --drive proxy --reality.physics bicycle   # the protocol in the proxy
    python -m experiments.train_teacher default --env-file outputs/cal/calibrated.yaml

The lens: OpenCV's fisheye (or pinhole) calibration on every image in `--images` where the board is found (the others
are listed and skipped), as the project's distortion-free model (equidistant fisheye: r = f * theta), whose focal
length gives `optics.hfov_deg`; the fit with OpenCV's distortion terms free is reported beside it. The mount: the
board's pose in each `--floor-images` frame (the car standing on the floor, the board lying flat in front of it)
gives the lens height and its tilt below the horizon, averaged over the frames. `calibrated.yaml` holds the env's
`optics` section (`--env-file` on every script with an env); `report.json` holds the fits, per-image errors, skipped
images and, after `--render`, the true values. A fit that does not converge, or whose reprojection error is above
`--max-rms-px`, writes no config: one line with the residual, exit code 2.

`--render DIR` renders the images in the reality proxy's camera (Genesis; the proxy's lens, mount and sensor from
`--reality.*`) into DIR/board, DIR/floor and DIR/truth.json, then calibrates them. It renders at 640x480, the size
of DeepRacer's camera before the car resizes its frames to 160x120: a real camera is calibrated at that size, and
the field of view does not depend on it.

`dynamics`: from a logged drive (ideally the calibration protocol, `experiments.run_car proxy --protocol
calibration` or `--drive sim|proxy` here), the car's motion (the log's true poses, or the planar visual odometry on
its frames) and the sim parameters whose response to the same commands matches it (`envs.racing.dynamics_calibration`:
gradient descent through the bicycle model at every candidate latency, CMA-ES for deadband and slew rate, bootstrap
spreads). `calibrated.yaml` gets `car:`, `randomization:` and `effects:` sections (nominal values at the fit, ranges
narrowed to the spread), next to an existing file's `optics:`; `dynamics_report.json` holds the fit, spreads,
residuals per protocol segment and, for a generated drive, the true values. A log that cannot identify the dynamics
(too short, no steering or speed variation, timestamps out of order) is refused naming what is missing; a fit that
does not converge writes no config: one line with the residual, exit code 2.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
from rich.table import Table

from envs.camera_calibration import (
    CalibrationError,
    Checkerboard,
    MountFit,
    coverage_deg,
    detect_corners,
    distortion_gap_px,
    fit_lens,
    fit_mount,
    image_paths,
)
from envs.camera_model import CameraConfig
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.calibrated_world import calibrated_sections, report_rows
from envs.racing.calibration_drive import DriveLog, check_drive, motion_from_poses
from envs.racing.config import EnvConfig
from envs.racing.dynamics_calibration import (
    DynamicsFit,
    DynamicsFitConfig,
    FitNotConverged,
    fit_dynamics,
)
from envs.racing.reality import RealityConfig
from experiments.cli import run


@dataclass(frozen=True)
class CameraCalibrationConfig:
    """Camera calibration from checkerboard images: lens, then mount; writes calibrated.yaml and report.json."""

    images: str = ""
    """folder of checkerboard photos taken with the car's camera, the board anywhere in the frame (for the lens)"""
    floor_images: str = ""
    """folder of frames of the car's camera, the car standing on the floor and the board lying flat in front of it
    (for the mount); empty = lens only"""
    render: str = ""
    """render the images in the reality proxy into this folder first (board/, floor/, truth.json) and calibrate them"""
    truth: str = ""
    """JSON of the true values to compare with (as --render writes); empty = truth.json beside --images if present"""
    board: Checkerboard = field(default_factory=Checkerboard)
    """the printed checkerboard"""
    lens: Literal["fisheye", "pinhole"] = "fisheye"
    """lens model to fit (the env's optics.lens)"""
    min_images: int = 6
    """fewest --images that show the board"""
    max_rms_px: float = 0.5
    """no config is written when the lens fit's reprojection error is above this (px)"""
    out_dir: str = "outputs/calibration"
    """where calibrated.yaml and report.json go"""
    reality: RealityConfig = field(default_factory=RealityConfig)
    """--render: the reality proxy whose camera renders the images (lens, camera_pitch_deg, camera_height, sensor)"""
    render_hfov_deg: float = CameraConfig().hfov_deg
    """--render: the proxy lens's field of view (degrees; the env's optics.hfov_deg)"""
    render_size: tuple[int, int] = (640, 480)
    """--render: image width and height (px)"""
    board_views: int = 14
    """--render: board images for the lens"""
    floor_views: int = 6
    """--render: floor frames for the mount"""
    seed: int = 0
    """--render: seed of the view poses and the sensor noise"""

    def __post_init__(self) -> None:
        check_range("min_images", self.min_images, 3, 10_000)
        check_range("max_rms_px", self.max_rms_px, 0.0, 100.0)
        check_range("render_hfov_deg", self.render_hfov_deg, 10.0, 150.0)
        check_range("board_views", self.board_views, 1, 500)
        check_range("floor_views", self.floor_views, 0, 500)


def render_images(cfg: CameraCalibrationConfig, console) -> CameraCalibrationConfig:
    """Render the board and floor images in the proxy's camera into `cfg.render`; the config reading them (and
    fitting the proxy's lens model)."""
    import cv2

    from envs.racing.calibration_scene import render_calibration_set

    proxy = cfg.reality.resolved()
    optics = CameraConfig(
        lens=proxy.lens, hfov_deg=cfg.render_hfov_deg, pitch_deg=proxy.camera_pitch_deg, height=proxy.camera_height,
        width=cfg.render_size[0], height_px=cfg.render_size[1],
    )  # fmt: skip
    t0 = time.time()
    boards, floors, truth = render_calibration_set(
        optics, cfg.board, cfg.board_views, cfg.floor_views, proxy.sensor, seed=cfg.seed
    )
    root = Path(cfg.render)
    for sub, images in (("board", boards), ("floor", floors)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for name, image in images.items():
            cv2.imwrite(str(root / sub / name), image)
    write_text_atomic(root / "truth.json", json.dumps(truth, indent=2))
    console.print(
        f"rendered {len(boards)} board and {len(floors)} floor images into {root} in {time.time() - t0:.1f} s"
    )
    floor = str(root / "floor") if floors else ""
    return replace(cfg, images=str(root / "board"), floor_images=floor, truth=str(root / "truth.json"), lens=proxy.lens)


def comparison_table(fields: dict[str, float], extra: dict[str, float], truth: dict | None) -> Table:
    table = Table(title="camera calibration" + (" (fitted vs true)" if truth else ""))
    for col in ("quantity", "fitted", *(("true", "error") if truth else ())):
        table.add_column(col)
    for key, value in {**fields, **extra}.items():
        if isinstance(value, str):
            table.add_row(key, value, *((str(truth.get(key, "")), "") if truth else ()))
            continue
        row = [key, f"{value:.4g}"]
        if truth:
            true = truth.get(key)
            if isinstance(true, list):  # the principal point: distance (px)
                row += [f"({true[0]:.1f}, {true[1]:.1f})", ""]
            else:
                row += ["" if true is None else f"{true:.4g}", "" if true is None else f"{value - true:+.3g}"]
        table.add_row(*row)
    return table


def detect_all(cfg: CameraCalibrationConfig, console) -> tuple[dict, list[str], tuple[int, int], dict, list[str]]:
    """The board's corners in the lens images and in the floor frames (found, skipped, image size, floor found,
    floor skipped); images without the board are printed; too few lens images are refused naming the skipped ones."""
    paths = image_paths(cfg.images)
    found, missing, size = detect_corners(paths, cfg.board)
    pattern = f"{cfg.board.cols}x{cfg.board.rows}"
    if missing:
        console.print(f"[yellow]no {pattern} board found in {len(missing)} image(s), skipped:[/] {', '.join(missing)}")
    if len(found) < cfg.min_images:
        skipped = f"; skipped: {', '.join(missing)}" if missing else ""
        raise CalibrationError(
            f"{cfg.images}: {len(found)} of {len(paths)} images show the {pattern} board, need --min-images "
            f"{cfg.min_images}{skipped}"
        )
    floor_found, floor_missing = {}, []
    if cfg.floor_images:
        floor_found, floor_missing, floor_size = detect_corners(image_paths(cfg.floor_images), cfg.board)
        if floor_size != size:
            raise ConfigError(f"{cfg.floor_images}: {floor_size[0]}x{floor_size[1]} images, the lens images are "
                              f"{size[0]}x{size[1]}")  # fmt: skip
        if floor_missing:
            console.print(f"[yellow]no board found in {len(floor_missing)} floor frame(s), skipped:[/] "
                          f"{', '.join(floor_missing)}")  # fmt: skip
    return found, missing, size, floor_found, floor_missing


def main_camera(cfg: CameraCalibrationConfig) -> dict:
    console = make_console()
    if cfg.render:
        cfg = render_images(cfg, console)
    if not cfg.images:
        raise ConfigError(
            "give --images DIR (checkerboard photos), or --render DIR to render them in the reality proxy"
        )
    t0 = time.time()
    found, missing, size, floor_found, floor_missing = detect_all(cfg, console)
    t_detect = time.time() - t0
    lens = fit_lens(found, cfg.board, size, cfg.lens)
    free = fit_lens(found, cfg.board, size, cfg.lens, distortion=True)
    mount: MountFit | None = fit_mount(floor_found, cfg.board, lens) if cfg.floor_images else None
    t_fit = time.time() - t0 - t_detect
    optics = {"lens": cfg.lens, "hfov_deg": round(lens.hfov_deg, 3)}
    if mount is not None:
        optics |= {"pitch_deg": round(mount.pitch_deg, 3), "height": round(mount.height, 5)}
    CameraConfig(**optics)  # the env accepts these values
    truth_path = Path(cfg.truth) if cfg.truth else Path(cfg.images).parent / "truth.json"
    truth = json.loads(truth_path.read_text()) if truth_path.is_file() else None
    extra = {"rms_px": lens.rms_px, "hfov_deg_free_distortion": free.edge_hfov_deg(),
             "distortion_gap_px": distortion_gap_px(lens, free, found),
             "corner_coverage_deg": coverage_deg(lens, found)}  # fmt: skip
    if mount is not None:
        extra["roll_deg"] = mount.roll_deg
    converged = lens.rms_px <= cfg.max_rms_px
    report = {
        "optics": optics, "written": converged, "image_size": list(size), "board": asdict(cfg.board),
        "images": {"folder": cfg.images, "used": sorted(found), "skipped": missing},
        "floor_images": {"folder": cfg.floor_images, "used": sorted(floor_found), "skipped": floor_missing},
        "lens_fit": lens.summary(), "lens_fit_free_distortion": free.summary(),
        "distortion_gap_px": extra["distortion_gap_px"], "corner_coverage_deg": extra["corner_coverage_deg"],
        "mount_fit": None if mount is None else {
            "height": mount.height, "pitch_deg": mount.pitch_deg, "roll_deg": mount.roll_deg,
            "spread": mount.spread, "per_frame": mount.per_frame,
        },
        "truth": truth, "seconds": {"detect": t_detect, "fit": t_fit},
    }  # fmt: skip
    if truth:
        report["error"] = {k: v - truth[k] for k, v in {**optics, **extra}.items() if isinstance(truth.get(k), float)}
    out = Path(cfg.out_dir)
    write_text_atomic(out / "report.json", json.dumps(report, indent=2))
    shown = {**optics, "principal_point_x": lens.principal_point[0], "principal_point_y": lens.principal_point[1]}
    if truth:
        truth = {
            **truth,
            "principal_point_x": truth["principal_point"][0],
            "principal_point_y": truth["principal_point"][1],
        }
    console.print(comparison_table(shown, extra, truth))
    console.print(f"{len(found)} board images, {len(floor_found)} floor frames; detection {t_detect:.1f} s, fit "
                  f"{t_fit:.2f} s; report: {out / 'report.json'}")  # fmt: skip
    if not converged:
        raise CalibrationError(
            f"the {cfg.lens} lens fit's reprojection error is {lens.rms_px:.3f} px, above --max-rms-px "
            f"{cfg.max_rms_px}: no calibrated.yaml written (report: {out / 'report.json'})"
        )
    header = f"# camera calibration of {cfg.images} ({len(found)} images, reprojection error {lens.rms_px:.3f} px)\n"
    import yaml

    write_text_atomic(out / "calibrated.yaml", header + yaml.safe_dump({"optics": optics}, sort_keys=False))
    console.print(f"wrote {out / 'calibrated.yaml'} (use it with --env-file)")
    return report


@dataclass(frozen=True)
class DynamicsCalibrationConfig:
    """Dynamics and timing from a logged drive: the sim parameters whose response to its commands matches its
    motion; writes calibrated.yaml (merged with the camera's) and dynamics_report.json."""

    log: str = ""
    """real log (HDF5) of the drive, ideally the calibration protocol; with --drive, where the generated one goes"""
    drive: Literal["", "sim", "proxy"] = ""
    """drive the calibration protocol first: in the training sim's dynamics (`env`, the car drawn by its
    randomization) or the reality proxy's (`reality`); the log then carries the true poses and parameters"""
    motion: Literal["auto", "poses", "odometry"] = "auto"
    """where the car's motion comes from: the log's true poses (a generated drive) or the planar visual odometry on
    its frames (with the env's optics); auto = poses when the log has them"""
    camera_latency_ms: float = -1.0
    """the camera's latency (ms): the log shows action + camera latency, the action latency is the rest; -1 = the
    env's nominal camera latency"""
    widen: float = 2.0
    """randomization ranges: this many bootstrap spreads either side of the fit"""
    jitter_ms: float = 30.0
    """the latency jitter the calibrated world draws every control step (`effects.latency_jitter_ms`; the `transfer`
    preset's; 0 = none): the log shows its mean inside the loop latency, so the action latency written is the rest"""
    min_seconds: float = 30.0
    """shortest log accepted (s)"""
    out_dir: str = "outputs/calibration"
    """where calibrated.yaml and dynamics_report.json go (an existing calibrated.yaml keeps its other sections)"""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=1))
    """the training world the calibration is for (car, control rate, optics for the odometry)"""
    reality: RealityConfig = field(default_factory=RealityConfig)
    """--drive proxy: the reality proxy whose dynamics drive the protocol"""
    fit: DynamicsFitConfig = field(default_factory=DynamicsFitConfig)
    seed: int = 0
    """--drive: seed of the car's parameters"""
    threads: int = 1
    """torch CPU threads of the fit (its batches are small: more threads mostly wait on each other)"""

    def __post_init__(self) -> None:
        check_range("camera_latency_ms", self.camera_latency_ms, -1.0, 500.0)
        check_range("threads", self.threads, 1, 256)
        check_range("widen", self.widen, 0.5, 10.0)
        check_range("jitter_ms", self.jitter_ms, 0.0, 200.0)
        check_range("min_seconds", self.min_seconds, 1.0, 3600.0)


def generate_drive(cfg: DynamicsCalibrationConfig, console) -> str:
    """Drive the calibration protocol on the bench (training sim or proxy dynamics) and write it as a real log."""
    from datasets.drive_log import write_scripted_log
    from envs.racing.calibration_drive import calibration_protocol, drive_protocol
    from envs.racing.reality import reality_env_config

    env = cfg.env if cfg.drive == "sim" else reality_env_config(cfg.env, cfg.reality, part="dynamics")
    env = replace(env, randomization=replace(env.randomization, action_noise=False))
    protocol = calibration_protocol(env.control_hz)
    t0 = time.time()
    drive = drive_protocol(env, protocol, seed=cfg.seed)
    path = cfg.log or str(Path(cfg.out_dir) / f"protocol_{cfg.drive}.h5")
    write_scripted_log(
        path, drive.time, drive.steering_deg, drive.speed, [(row, name) for row, name, _ in protocol.segments],
        true_pose=drive.camera_pose, truth=drive.truth, attrs={"protocol": "calibration", "drive": cfg.drive},
    )  # fmt: skip
    console.print(f"drove the calibration protocol ({protocol.seconds:.0f} s) in the {cfg.drive} "
                  f"({env.physics} physics) in {time.time() - t0:.1f} s: {path}")  # fmt: skip
    return path


def odometry_motion(frames: np.ndarray, env: EnvConfig, dt: float) -> np.ndarray:
    """Frame-to-frame motion `(T-1, 3)` of a log's frames through the planar visual odometry (env optics)."""
    import torch

    from adaptation.odometry import OdometryConfig, PlanarOdometry

    odometry = PlanarOdometry(env.optics, OdometryConfig())
    images = torch.as_tensor(frames, dtype=torch.float32)[:, None]
    out = np.zeros((len(frames) - 1, 3))
    last = torch.zeros(1, 3)
    for k in range(len(frames) - 1):
        last = odometry.step(images[k : k + 1], images[k + 1 : k + 2], last)
        out[k] = last[0].numpy()
    return out


def load_drive(cfg: DynamicsCalibrationConfig, path: str, console) -> DriveLog:
    """A real log as the fit reads it: commands (a safe stop's speed as 0), motion from the true poses or the
    odometry, segments from the log's events (10-s blocks without)."""
    from datasets.drive_log import read_drive_log

    data = read_drive_log(path)
    t = np.asarray(data["time"], np.float64)
    speed = np.where(data["safe_stop"], 0.0, data["speed"]).astype(np.float64)
    use_poses = cfg.motion == "poses" or (cfg.motion == "auto" and "true_pose" in data)
    if use_poses:
        if "true_pose" not in data:
            raise ConfigError(f"--motion poses: {path} has no true poses (only a generated drive has them)")
        motion, source = motion_from_poses(np.asarray(data["true_pose"])), data["pose_source"]
    else:
        if data["frames"] == "blank":
            raise ConfigError(f"{path}: its frames are blank (a drive without a camera); use --motion poses")
        t0 = time.time()
        motion, source = odometry_motion(data["camera"], cfg.env, 1.0 / cfg.env.control_hz), "visual odometry"
        console.print(f"odometry over {len(t)} frames in {time.time() - t0:.1f} s")
    blocks = np.searchsorted(t - t[0], np.arange(0.0, t[-1] - t[0], 10.0))
    segments = data["segments"] or [(int(r), f"{10 * i}-{10 * i + 10} s") for i, r in enumerate(blocks)]
    starts = np.array([r for r, _ in segments])
    segment = np.clip(np.searchsorted(starts, np.arange(len(t)), side="right") - 1, 0, None)
    return DriveLog(t, np.asarray(data["steering_deg"], np.float64), speed, motion, source, segment,
                    tuple(name for _, name in segments), data["truth"])  # fmt: skip


def dynamics_table(fit: DynamicsFit) -> Table:
    truth = fit.truth is not None
    table = Table(title="dynamics calibration" + (" (fitted vs true)" if truth else ""))
    for col in ("quantity", "fitted", "± spread", *(("true", "error") if truth else ())):
        table.add_column(col)
    for name, value, spread, true in report_rows(fit):
        row = [name, f"{value:.4g}", f"{spread:.2g}"]
        if truth:
            row += ["" if true is None else f"{true:.4g}", "" if true is None else f"{value - true:+.3g}"]
        table.add_row(*row)
    return table


def write_calibrated(cfg: DynamicsCalibrationConfig, fit: DynamicsFit, camera_ms: float, console) -> dict:
    """calibrated.yaml: the dynamics sections over an existing file's (its optics kept), checked by loading it into
    the env config as --env-file does."""
    import yaml

    from experiments.cli import env_with_file

    sections, notes = calibrated_sections(fit, camera_ms, cfg.env.dt_physics, cfg.widen, cfg.jitter_ms)
    path = Path(cfg.out_dir) / "calibrated.yaml"
    merged = yaml.safe_load(path.read_text()) if path.is_file() else {}
    merged = merged if isinstance(merged, dict) else {}
    for key, section in sections.items():
        merged[key] = {**merged.get(key, {}), **section}
    env_with_file(cfg.env, merged, str(path))  # refuses values the env would not accept
    header = (f"# dynamics calibration of {cfg.log or 'a generated drive'} ({fit.windows} windows, residual "
              f"{fit.residual:.3f}, loop latency {fit.latency_ms:.0f} ms)\n")  # fmt: skip
    write_text_atomic(path, header + yaml.safe_dump(merged, sort_keys=False))
    for note in notes:
        console.print(f"[yellow]{note}[/]")
    console.print(f"wrote {path} (use it with --env-file)")
    return {"sections": sections, "notes": notes}


def main_dynamics(cfg: DynamicsCalibrationConfig) -> dict:
    import torch

    torch.set_num_threads(cfg.threads)
    console = make_console()
    path = generate_drive(cfg, console) if cfg.drive else cfg.log
    if not path:
        raise ConfigError("give --log FILE (a real log), or --drive sim|proxy to drive the calibration protocol")
    cfg = replace(cfg, log=path)
    log = load_drive(cfg, path, console)
    check = check_drive(log, cfg.env.control_hz, cfg.min_seconds)
    for flag in check.flags:
        console.print(f"[yellow]{flag}[/]")
    camera_ms = cfg.camera_latency_ms if cfg.camera_latency_ms >= 0 else cfg.env.randomization.nominal_camera_latency_ms
    out = Path(cfg.out_dir)
    try:
        fit = fit_dynamics(log, check, cfg.env.car, cfg.env.control_hz, cfg.fit)
    except FitNotConverged as err:
        write_text_atomic(out / "dynamics_report.json", json.dumps({**asdict(err.fit), "written": False}, indent=2))
        console.print(dynamics_table(err.fit))
        raise
    console.print(dynamics_table(fit))
    console.print(f"{fit.windows} windows, motion from the {log.motion_source}; residual {fit.residual:.3f}; fit "
                  f"{fit.seconds:.1f} s")  # fmt: skip
    report = {**asdict(fit), "written": True, "log": path, "camera_latency_ms": camera_ms}
    report |= write_calibrated(cfg, fit, camera_ms, console)
    write_text_atomic(out / "dynamics_report.json", json.dumps(report, indent=2, default=str))
    return report


def main(cfg: CameraCalibrationConfig | DynamicsCalibrationConfig) -> dict:
    if isinstance(cfg, DynamicsCalibrationConfig):
        return main_dynamics(cfg)
    return main_camera(cfg)


PRESETS = {
    "camera": ("lens and mount from checkerboard images (--images, --floor-images), or rendered ones (--render)",
               CameraCalibrationConfig()),
    "smoke": ("render a few images in the reality proxy and calibrate them", CameraCalibrationConfig(
        render="outputs/calibration-smoke/images", out_dir="outputs/calibration-smoke", board_views=10,
        floor_views=3)),
    "dynamics": ("dynamics and timing from a logged drive (--log), or the calibration protocol driven first "
                 "(--drive sim|proxy)", DynamicsCalibrationConfig()),
    "dynamics-smoke": ("the calibration protocol in the training sim's dynamics, fitted from its true poses",
                       DynamicsCalibrationConfig(drive="sim", out_dir="outputs/calibration-smoke")),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
