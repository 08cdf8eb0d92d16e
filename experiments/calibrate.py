"""Camera calibration (real to sim): the lens from checkerboard photos, the mount from the board lying on the floor.

    python -m experiments.calibrate camera --images photos/board --floor-images photos/floor --out-dir outputs/cal
    python -m experiments.calibrate camera --render outputs/cal/images --out-dir outputs/cal   # in the reality proxy
    python -m experiments.calibrate camera --render outputs/cal/images --reality.camera-pitch-deg 18
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
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from rich.table import Table

from envs.camera_calibration import (
    CalibrationError,
    Checkerboard,
    LensFit,
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


def lens_summary(fit: LensFit) -> dict:
    return {
        "hfov_deg": fit.hfov_deg, "edge_hfov_deg": fit.edge_hfov_deg(), "rms_px": fit.rms_px,
        "principal_point": list(fit.principal_point), "fy_over_fx": float(fit.K[1, 1] / fit.K[0, 0]),
        "K": fit.K.tolist(), "D": fit.D.tolist(), "per_image_px": fit.per_image_px,
    }  # fmt: skip


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


def main(cfg: CameraCalibrationConfig) -> dict:
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
        "lens_fit": lens_summary(lens), "lens_fit_free_distortion": lens_summary(free),
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


PRESETS = {
    "camera": ("lens and mount from checkerboard images (--images, --floor-images), or rendered ones (--render)",
               CameraCalibrationConfig()),
    "smoke": ("render a few images in the reality proxy and calibrate them", CameraCalibrationConfig(
        render="outputs/calibration-smoke/images", out_dir="outputs/calibration-smoke", board_views=10,
        floor_views=3)),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
