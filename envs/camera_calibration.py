"""Camera calibration from checkerboard images: the lens (OpenCV's fisheye or pinhole calibration) and the mount
(height and pitch from the board lying flat on the floor), converted to `CameraConfig` fields.

The project's fisheye is pure equidistant (r = f * theta): the lens is fitted twice, once with that model (no
distortion terms: the fit whose field of view is written) and once with OpenCV's k1..k4 free (reported, with how far
its radius curve is from the pure one). The mount needs no board position: height above the floor and tilt below the
horizon are the same wherever the board lies on the floor.

    board = Checkerboard(cols=9, rows=6, square=0.04)
    found, missing, size = detect_corners(paths, board)
    lens = fit_lens(found, board, size, "fisheye")
    mount = fit_mount(floor_found, board, lens)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from envs.errors import ConfigError, GapbridgeError, check_range

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


class CalibrationError(GapbridgeError):
    """A calibration that cannot give a trustworthy result: too few usable images, a fit that did not converge."""


@dataclass(frozen=True)
class Checkerboard:
    """A printed checkerboard: inner corners along its two sides and the square size."""

    cols: int = 9
    """inner corners along the long side"""
    rows: int = 6
    """inner corners along the short side"""
    square: float = 0.04
    """square side (m)"""

    def __post_init__(self) -> None:
        check_range("board.cols", self.cols, 3, 40)
        check_range("board.rows", self.rows, 3, 40)
        check_range("board.square", self.square, 0.002, 0.5)
        if self.cols == self.rows:
            raise ConfigError(f"board.cols = board.rows = {self.cols}: a square board's corner order is ambiguous")

    @property
    def size(self) -> tuple[float, float]:
        """Extent of the squares (m), long side first."""
        return (self.cols + 1) * self.square, (self.rows + 1) * self.square

    def object_points(self) -> np.ndarray:
        """Inner corners in the board frame `(rows * cols, 3)`, row by row, centred on the board, z = 0."""
        return self._grid(self.cols, self.rows)

    def outline(self) -> np.ndarray:
        """Every square corner including the outer border `((rows + 2) * (cols + 2), 3)`."""
        return self._grid(self.cols + 2, self.rows + 2)

    def _grid(self, nx: int, ny: int) -> np.ndarray:
        j, i = np.meshgrid(np.arange(nx), np.arange(ny), indexing="xy")
        x, y = (j - (nx - 1) / 2) * self.square, (i - (ny - 1) / 2) * self.square
        return np.stack([x.ravel(), y.ravel(), np.zeros(x.size)], -1)


def image_paths(folder: str | Path) -> list[Path]:
    """The images in `folder`, sorted; a missing or empty folder is refused by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder of calibration images")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ConfigError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)})")
    return paths


def find_corners(gray: np.ndarray, board: Checkerboard) -> np.ndarray | None:
    """Sub-pixel inner corners `(rows * cols, 2)` of the board in a grayscale image (OpenCV pixel coordinates), or
    None. Tries the sector-based detector, then the same on the image upsampled 2x (small, foreshortened squares of a
    board lying on the floor), then the classic detector with sub-pixel refinement."""
    import cv2

    pattern = (board.cols, board.rows)
    flags = cv2.CALIB_CB_EXHAUSTIVE | cv2.CALIB_CB_ACCURACY
    ok, corners = cv2.findChessboardCornersSB(gray, pattern, flags=flags)
    if ok:
        return corners.reshape(-1, 2).astype(np.float64)
    big = cv2.resize(gray, None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)
    ok, corners = cv2.findChessboardCornersSB(big, pattern, flags=flags)
    if ok:  # pixel centres: x_big = 2 x + 0.5
        return (corners.reshape(-1, 2).astype(np.float64) - 0.5) / 2
    ok, corners = cv2.findChessboardCorners(
        gray, pattern, flags=cv2.CALIB_CB_ADAPTIVE_THRESH | cv2.CALIB_CB_NORMALIZE_IMAGE
    )
    if ok:
        criteria = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 50, 1e-3)
        corners = cv2.cornerSubPix(gray, corners, (5, 5), (-1, -1), criteria)
        return corners.reshape(-1, 2).astype(np.float64)
    return None


def detect_corners(paths: list[Path], board: Checkerboard) -> tuple[dict[str, np.ndarray], list[str], tuple[int, int]]:
    """Corners of every image where the board is found (name -> `(M, 2)`), the names of the others, and the image
    size `(W, H)`; an unreadable image, or one of another size than the first, is refused by name."""
    import cv2

    found: dict[str, np.ndarray] = {}
    missing: list[str] = []
    size: tuple[int, int] | None = None
    for path in paths:
        gray = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
        if gray is None:
            raise ConfigError(f"{path}: not a readable image")
        this = (gray.shape[1], gray.shape[0])
        if size is None:
            size = this
        elif this != size:
            raise ConfigError(f"{path}: {this[0]}x{this[1]}, but the other images are {size[0]}x{size[1]}")
        corners = find_corners(gray, board)
        if corners is None:
            missing.append(path.name)
        else:
            found[path.name] = corners
    assert size is not None
    return found, missing, size


@dataclass(frozen=True)
class LensFit:
    """A fitted lens: camera matrix, distortion, and its reprojection error over the images."""

    lens: Literal["fisheye", "pinhole"]
    size: tuple[int, int]
    """image size (W, H) of the calibration images"""
    K: np.ndarray  # (3, 3)
    D: np.ndarray  # fisheye (4,) k1..k4; pinhole (5,) k1, k2, p1, p2, k3
    rms_px: float
    """reprojection error over all corners (px)"""
    per_image_px: dict[str, float] = field(default_factory=dict)
    """reprojection error per image (px)"""

    @property
    def hfov_deg(self) -> float:
        """Horizontal field of view of the distortion-free model with this focal length (the `CameraConfig` one)."""
        w, fx = self.size[0], float(self.K[0, 0])
        if self.lens == "fisheye":
            return math.degrees(w / fx)
        return math.degrees(2 * math.atan(w / 2 / fx))

    @property
    def principal_point(self) -> tuple[float, float]:
        return float(self.K[0, 2]), float(self.K[1, 2])

    def undistort(self, corners: np.ndarray) -> np.ndarray:
        """Normalized image coordinates `(M, 2)` (unit focal length) of pixel coordinates `(M, 2)`."""
        import cv2

        pts = corners.reshape(-1, 1, 2)
        if self.lens == "fisheye":
            return cv2.fisheye.undistortPoints(pts, self.K, self.D).reshape(-1, 2)
        return cv2.undistortPoints(pts, self.K, self.D).reshape(-1, 2)

    def radius(self, theta: np.ndarray) -> np.ndarray:
        """Image radius (px, along x) of rays `theta` (radians) off the axis."""
        fx = float(self.K[0, 0])
        if self.lens == "fisheye":
            k = np.asarray(self.D, dtype=np.float64).ravel()
            return fx * theta * (1 + k[0] * theta**2 + k[1] * theta**4 + k[2] * theta**6 + k[3] * theta**8)
        k = np.asarray(self.D, dtype=np.float64).ravel()
        t2 = np.tan(theta) ** 2
        return fx * np.tan(theta) * (1 + k[0] * t2 + k[1] * t2**2 + k[4] * t2**3)

    def edge_hfov_deg(self) -> float:
        """Horizontal field of view through the fitted distortion: twice the angle imaged at the image edge."""
        theta = np.linspace(0.0, math.radians(89.0 if self.lens == "pinhole" else 110.0), 20001)
        r = self.radius(theta)
        half = self.size[0] / 2
        reach = np.nonzero(r >= half)[0]
        return math.degrees(2 * float(theta[reach[0]] if len(reach) else theta[-1]))

    def summary(self) -> dict:
        """The fit as JSON-ready numbers (the report's)."""
        return {
            "hfov_deg": self.hfov_deg, "edge_hfov_deg": self.edge_hfov_deg(), "rms_px": self.rms_px,
            "principal_point": list(self.principal_point), "fy_over_fx": float(self.K[1, 1] / self.K[0, 0]),
            "K": self.K.tolist(), "D": self.D.tolist(), "per_image_px": self.per_image_px,
        }  # fmt: skip


_CV_FLAGS = {
    "fisheye-pure": ("RECOMPUTE_EXTRINSIC", "FIX_SKEW", "FIX_K1", "FIX_K2", "FIX_K3", "FIX_K4"),
    "fisheye-free": ("RECOMPUTE_EXTRINSIC", "FIX_SKEW"),
    "pinhole-pure": ("FIX_K1", "FIX_K2", "FIX_K3", "ZERO_TANGENT_DIST"),
    "pinhole-free": (),
}


def fit_lens(
    found: dict[str, np.ndarray],
    board: Checkerboard,
    size: tuple[int, int],
    lens: Literal["fisheye", "pinhole"],
    distortion: bool = False,
) -> LensFit:
    """Fit the lens to the detected corners of several images: the project's model (`distortion=False`: equidistant
    fisheye or pinhole with no distortion terms) or OpenCV's with its distortion terms free. A fit that OpenCV gives
    up on, or whose error is not finite, raises `CalibrationError`."""
    import cv2

    names = list(found)
    obj = board.object_points()
    objs = [obj.reshape(1, -1, 3).astype(np.float64) for _ in names]
    imgs = [found[n].reshape(1, -1, 2).astype(np.float64) for n in names]
    key = f"{lens}-{'free' if distortion else 'pure'}"
    criteria = (cv2.TERM_CRITERIA_COUNT + cv2.TERM_CRITERIA_EPS, 200, 1e-12)
    try:
        if lens == "fisheye":
            flags = sum(getattr(cv2.fisheye, f"CALIB_{f}") for f in _CV_FLAGS[key])
            _, K, D, rvecs, tvecs = cv2.fisheye.calibrate(objs, imgs, size, None, None, flags=flags, criteria=criteria)
        else:
            flags = sum(getattr(cv2, f"CALIB_{f}") for f in _CV_FLAGS[key])
            objs = [o.reshape(-1, 3).astype(np.float32) for o in objs]
            imgs = [i.reshape(-1, 1, 2).astype(np.float32) for i in imgs]
            _, K, D, rvecs, tvecs = cv2.calibrateCamera(objs, imgs, size, None, None, flags=flags, criteria=criteria)
    except cv2.error as err:
        message = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise CalibrationError(f"the {lens} fit did not converge ({message})") from None
    per_image, total, count = {}, 0.0, 0
    for name, o, rvec, tvec in zip(names, objs, rvecs, tvecs):
        if lens == "fisheye":
            proj, _ = cv2.fisheye.projectPoints(o, rvec, tvec, K, D)
        else:
            proj, _ = cv2.projectPoints(o, rvec, tvec, K, D)
        err2 = ((proj.reshape(-1, 2) - found[name]) ** 2).sum(-1)
        per_image[name] = float(np.sqrt(err2.mean()))
        total, count = total + float(err2.sum()), count + len(err2)
    rms = math.sqrt(total / count)
    if not math.isfinite(rms):
        raise CalibrationError(f"the {lens} fit did not converge (residual {rms})")
    return LensFit(lens, size, np.asarray(K, np.float64), np.asarray(D, np.float64).ravel(), rms, per_image)


def coverage_deg(fit: LensFit, found: dict[str, np.ndarray]) -> float:
    """The largest angle off the optical axis (degrees) at which a detected corner lies: beyond it a fitted
    distortion is an extrapolation."""
    centre = np.asarray(fit.principal_point)
    reach = max(float(np.linalg.norm(c - centre, axis=1).max()) for c in found.values())
    fx = float(fit.K[0, 0])
    return math.degrees(reach / fx if fit.lens == "fisheye" else math.atan(reach / fx))


def distortion_gap_px(pure: LensFit, free: LensFit, found: dict[str, np.ndarray]) -> float:
    """Largest difference (px) between the two fits' image radius over the angles the detected corners cover: how far
    the lens is from the distortion-free model where the images constrain it."""
    theta = np.linspace(0.0, math.radians(coverage_deg(pure, found)), 2001)
    return float(np.abs(free.radius(theta) - pure.radius(theta)).max())


@dataclass(frozen=True)
class MountFit:
    """The camera's mount from frames of the board lying on the floor: per frame and averaged."""

    height: float
    """lens height above the floor (m), mean over the frames"""
    pitch_deg: float
    """tilt of the optical axis below the horizon (degrees), mean over the frames"""
    roll_deg: float
    """rotation about the optical axis (degrees; 0 = image rows level), mean over the frames"""
    per_frame: dict[str, dict[str, float]]
    """name -> height, pitch_deg, roll_deg, rms_px of each frame"""

    @property
    def spread(self) -> dict[str, float]:
        """Standard deviation over the frames of height, pitch_deg and roll_deg."""
        keys = ("height", "pitch_deg", "roll_deg")
        return {k: float(np.std([f[k] for f in self.per_frame.values()])) for k in keys}


def board_pose(corners: np.ndarray, board: Checkerboard, lens: LensFit) -> tuple[np.ndarray, np.ndarray, float]:
    """Rotation `(3, 3)` and translation `(3,)` of the board in the camera frame (x_cam = R x_board + t) from its
    corners in one image, and the reprojection error (px) of that pose through the lens."""
    import cv2

    norm = lens.undistort(corners)
    obj = board.object_points().astype(np.float64)
    ok, rvec, tvec = cv2.solvePnP(obj, norm.reshape(-1, 1, 2), np.eye(3), None, flags=cv2.SOLVEPNP_IPPE)
    if not ok:
        raise CalibrationError("the board's pose could not be solved")
    _, rvec, tvec = cv2.solvePnP(obj, norm.reshape(-1, 1, 2), np.eye(3), None, rvec, tvec, True, cv2.SOLVEPNP_ITERATIVE)
    if lens.lens == "fisheye":
        proj, _ = cv2.fisheye.projectPoints(obj.reshape(1, -1, 3), rvec, tvec, lens.K, lens.D)
    else:
        proj, _ = cv2.projectPoints(obj, rvec, tvec, lens.K, lens.D)
    rms = float(np.sqrt(((proj.reshape(-1, 2) - corners) ** 2).sum(-1).mean()))
    return cv2.Rodrigues(rvec)[0], tvec.ravel(), rms


def mount_from_pose(rot: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """Height (m), pitch (degrees below the horizon) and roll (degrees) of a camera seeing the floor board at pose
    `(rot, t)`: the board's plane is the floor, its normal taken on the camera's side."""
    centre = -rot.T @ t  # camera centre in the board frame
    up = np.array([0.0, 0.0, 1.0 if centre[2] >= 0 else -1.0])
    axis = rot.T @ np.array([0.0, 0.0, 1.0])  # optical axis in the board frame
    right = rot.T @ np.array([1.0, 0.0, 0.0])
    pitch = math.degrees(math.asin(float(np.clip(-axis @ up, -1, 1))))
    roll = math.degrees(math.asin(float(np.clip(right @ up, -1, 1))))
    return abs(float(centre[2])), pitch, roll


def fit_mount(found: dict[str, np.ndarray], board: Checkerboard, lens: LensFit) -> MountFit:
    """Height, pitch and roll of the camera from frames of the board lying flat on the floor, averaged over them."""
    if not found:
        raise CalibrationError("no floor frame shows the board: the mount cannot be fitted")
    per_frame = {}
    for name, corners in found.items():
        rot, t, rms = board_pose(corners, board, lens)
        height, pitch, roll = mount_from_pose(rot, t)
        per_frame[name] = {"height": height, "pitch_deg": pitch, "roll_deg": roll, "rms_px": rms}
    mean = {k: float(np.mean([f[k] for f in per_frame.values()])) for k in ("height", "pitch_deg", "roll_deg")}
    return MountFit(mean["height"], mean["pitch_deg"], mean["roll_deg"], per_frame)
