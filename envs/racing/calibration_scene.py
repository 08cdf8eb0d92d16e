"""Checkerboard calibration images rendered in the reality proxy's camera: a printed checkerboard lying on a grey
floor, seen by the proxy's lens through the same Genesis path as `GenesisCamera` (a pinhole rasterization resampled
into the equidistant fisheye frame, then the proxy's sensor defects), so that camera calibration can be run and
checked without a car.

Two kinds of views, both of the board on the floor (board frame = world frame: board centre at the origin, z up):
- board views: the camera held freely around the board at distances, tilts and rolls that put the board anywhere in
  the frame, periphery included (for the intrinsics);
- floor views: the camera on the car's mount (height, forward offset, pitch) with the car standing on the floor at
  known poses in front of the board (for the mount's pitch and height).

Poses use the OpenCV camera convention (x right, y down, z forward) as 4x4 camera-to-world transforms.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from envs.camera_calibration import Checkerboard
from envs.camera_model import CameraConfig
from envs.errors import ConfigError
from envs.genesis_import import GenesisConfig, init_genesis
from envs.racing.camera_genesis import (
    _MSAA,
    FISHEYE_MAX_OFF_AXIS_DEG,
    LUMA,
    _limit_msaa_samples,
    fisheye_render,
    mount_transform,
)
from envs.racing.sensor import SensorConfig, SensorModel

GL_FROM_CV = np.diag([1.0, -1.0, -1.0, 1.0])
"""camera axes OpenCV (x right, y down, z forward) -> OpenGL (x right, y up, z backward)"""
TEXELS_PER_SQUARE = 80
"""texture resolution of the printed sheet"""


def board_texture(
    board: Checkerboard, px_per_square: int = TEXELS_PER_SQUARE, margin_squares: float = 1.0
) -> np.ndarray:
    """RGB uint8 image of the printed sheet: black and white squares on a white margin (printer black and paper
    white, not 0 and 255)."""
    n_x, n_y = board.cols + 1, board.rows + 1
    m = int(round(margin_squares * px_per_square))
    j = np.arange(n_x * px_per_square) // px_per_square
    i = np.arange(n_y * px_per_square) // px_per_square
    squares = np.where((i[:, None] + j[None, :]) % 2 == 0, 25, 235).astype(np.uint8)
    sheet = np.full((n_y * px_per_square + 2 * m, n_x * px_per_square + 2 * m), 235, np.uint8)
    sheet[m : m + squares.shape[0], m : m + squares.shape[1]] = squares
    return np.repeat(sheet[..., None], 3, -1)


def project_equidistant(cfg: CameraConfig, points_cam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates `(M, 2)` (OpenCV convention: pixel centres at integers) of camera-frame points `(M, 3)`
    through `cfg`'s lens, and their angle off the optical axis `(M,)` (radians)."""
    x, y, z = points_cam[:, 0], points_cam[:, 1], points_cam[:, 2]
    rho = np.hypot(x, y)
    theta = np.arctan2(rho, z)
    half = math.radians(cfg.hfov_deg) / 2
    if cfg.lens == "fisheye":
        f = (cfg.width / 2) / half
        r = f * theta
    else:
        f = (cfg.width / 2) / math.tan(half)
        r = f * np.tan(np.minimum(theta, math.radians(89.9)))
    scale = np.where(rho > 1e-12, r / np.maximum(rho, 1e-12), 0.0)
    uv = np.stack([cfg.width / 2 - 0.5 + scale * x, cfg.height_px / 2 - 0.5 + scale * y], -1)
    return uv, theta


def _in_frame(cfg: CameraConfig, points: np.ndarray, pose: np.ndarray, margin: float, min_span: float) -> bool:
    """Whether every board point `(M, 3)` is imaged at least `margin` px inside the frame, and the points span at
    least `min_span` of the image width."""
    pts = (points - pose[:3, 3]) @ pose[:3, :3]  # world -> camera: R^T (p - c)
    if (pts[:, 2] <= 0.02).any():
        return False
    uv, theta = project_equidistant(cfg, pts)
    inside = (uv[:, 0] >= margin) & (uv[:, 0] <= cfg.width - 1 - margin)
    inside &= (uv[:, 1] >= margin) & (uv[:, 1] <= cfg.height_px - 1 - margin)
    span = (uv.max(0) - uv.min(0)).max() / cfg.width
    return bool(inside.all() and (theta < math.radians(FISHEYE_MAX_OFF_AXIS_DEG - 2)).all() and span >= min_span)


def _rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rotation that takes unit vector `a` to unit vector `b` (Rodrigues)."""
    v, c = np.cross(a, b), float(np.dot(a, b))
    if np.linalg.norm(v) < 1e-12:
        return np.eye(3) if c > 0 else np.diag([1.0, -1.0, -1.0])
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + k + k @ k / (1 + c)


def board_view_poses(cfg: CameraConfig, board: Checkerboard, n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` camera poses (4x4, camera-to-world, OpenCV axes) that see the whole board: views from up to 50 degrees off
    the board's normal, any roll, with the board's centre spread from the image centre to the periphery and over
    all directions, so that the views together cover the frame."""
    rng = np.random.default_rng(seed)
    diag = float(np.hypot(*board.size))
    half_fov = math.radians(cfg.hfov_deg) / 2
    poses: list[np.ndarray] = []
    for k in range(n):
        reach = (k % 3) / 2  # board centre near the middle, half-way out, near the edge of the frame, in turn
        phi0 = 2 * math.pi * k / n
        for attempt in range(3000):
            reach_now = reach * (1 - attempt / 3000)  # where the aim cannot be met, the board moves inwards
            alpha, beta = rng.uniform(0, math.radians(50)), rng.uniform(0, 2 * math.pi)
            dist = diag * rng.uniform(0.45, 1.0)
            centre = dist * np.array(
                [math.sin(alpha) * math.cos(beta), math.sin(alpha) * math.sin(beta), math.cos(alpha)]
            )
            look = -centre / dist
            ref = np.array([1.0, 0.0, 0.0]) if abs(look[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
            x0 = np.cross(ref, look)
            x0 /= np.linalg.norm(x0)
            r0 = np.stack([x0, np.cross(look, x0), look], 1)
            theta = half_fov * rng.uniform(max(0.0, 0.6 * reach_now - 0.1), 0.6 * reach_now + 0.15)
            phi = phi0 + rng.uniform(-0.4, 0.4)
            u = np.array([math.sin(theta) * math.cos(phi), math.sin(theta) * math.sin(phi), math.cos(theta)])
            roll = rng.uniform(-math.pi, math.pi)
            rz = np.array([[math.cos(roll), -math.sin(roll), 0], [math.sin(roll), math.cos(roll), 0], [0, 0, 1]])
            pose = np.eye(4)
            pose[:3, :3] = r0 @ rz @ _rotation_between(u, np.array([0.0, 0.0, 1.0]))
            pose[:3, 3] = centre
            if _in_frame(cfg, board.outline(), pose, margin=0.03 * cfg.width, min_span=0.3):
                poses.append(pose)
                break
        else:
            raise ConfigError(f"no view shows the whole {board.cols}x{board.rows} board in this lens; check the board")
    return poses


def car_camera_pose(cfg: CameraConfig, x: float, y: float, yaw: float) -> np.ndarray:
    """Camera pose (4x4, camera-to-world, OpenCV axes) of the car's camera with the car standing at `(x, y, yaw)`
    on the floor: the proxy's mount (`mount_transform`) on the car's floor frame."""
    car = np.eye(4)
    car[:2, :2] = [[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]]
    car[:2, 3] = (x, y)
    return car @ mount_transform(cfg) @ GL_FROM_CV


def floor_view_poses(cfg: CameraConfig, board: Checkerboard, n: int, seed: int = 0) -> list[tuple[float, float, float]]:
    """`n` car poses `(x, y, yaw)` in front of the board lying on the floor, its long side across, each showing the
    whole board: the board straight ahead or a little to the side, the car turned up to 12 degrees."""
    rng = np.random.default_rng(seed + 1)
    out: list[tuple[float, float, float]] = []
    for _ in range(n):
        for attempt in range(2000):
            yaw = math.pi / 2 + rng.uniform(-0.2, 0.2)  # facing +y: the board's long side (x) across
            gap = rng.uniform(0.03, 0.08) + attempt * 5e-4  # a narrower lens needs the board further out
            ahead = cfg.forward + gap + board.size[1] / 2  # board centre ahead of the car
            side = rng.uniform(-0.03, 0.03)
            x = -(math.cos(yaw) * ahead - math.sin(yaw) * side)
            y = -(math.sin(yaw) * ahead + math.cos(yaw) * side)
            pose = car_camera_pose(cfg, x, y, yaw)
            if _in_frame(cfg, board.object_points(), pose, margin=0.04 * cfg.width, min_span=0.2):
                out.append((x, y, yaw))
                break
        else:
            raise ConfigError("the board on the floor is not in view of the mounted camera; check the mount and board")
    return out


class CheckerboardScene:
    """A render-only Genesis scene: a grey floor and the checkerboard sheet on it, seen through `cfg`'s lens."""

    def __init__(
        self,
        cfg: CameraConfig,
        board: Checkerboard,
        sensor: SensorConfig | None = None,
        genesis: GenesisConfig | None = None,
        msaa_samples: int = 4,
        seed: int = 0,
    ) -> None:
        genesis = genesis or GenesisConfig()
        self.cfg, self.board = cfg, board
        self.sensor = SensorModel(sensor or SensorConfig(), cfg.height_px, cfg.width)
        self.generator = torch.Generator().manual_seed(seed)
        vfov = 2 * math.degrees(math.atan(math.tan(math.radians(cfg.hfov_deg) / 2) * cfg.height_px / cfg.width))
        res, self.warp = (cfg.width, cfg.height_px), None
        if cfg.lens == "fisheye":
            res, vfov, self.warp = fisheye_render(cfg, genesis.fisheye_scale)
            self.visible = (self.warp.abs() <= 1.0 + 1e-6).all(-1).unsqueeze(1)
        gs = init_genesis(torch.device("cpu"), genesis)
        _limit_msaa_samples()
        self.msaa_samples = msaa_samples
        self.scene = gs.Scene(
            show_viewer=False,
            vis_options=gs.options.VisOptions(
                shadow=False, plane_reflection=False, show_world_frame=False, background_color=(0.6, 0.6, 0.6),
                ambient_light=(0.55, 0.55, 0.55),
                lights=[{"type": "directional", "dir": (-0.3, -0.2, -1.0), "color": (1.0, 1.0, 1.0), "intensity": 2.0}],
            ),
            rigid_options=gs.options.RigidOptions(enable_collision=False, gravity=(0.0, 0.0, 0.0)),
        )  # fmt: skip
        self.scene.add_entity(
            gs.morphs.Plane(pos=(0.0, 0.0, -0.002), plane_size=(4.0, 4.0), tile_size=(4.0, 4.0), collision=False),
            surface=gs.surfaces.Default(color=(0.42, 0.42, 0.42)),
        )  # the floor, a little below the sheet
        sheet = board_texture(board)
        size = (sheet.shape[1] * board.square / TEXELS_PER_SQUARE, sheet.shape[0] * board.square / TEXELS_PER_SQUARE)
        self.scene.add_entity(
            gs.morphs.Plane(pos=(0.0, 0.0, 0.0), plane_size=size, tile_size=size, collision=False),
            surface=gs.surfaces.Default(diffuse_texture=gs.textures.ImageTexture(image_array=sheet)),
        )
        self.camera = self.scene.add_camera(res=res, fov=vfov, near=0.01, far=20.0, GUI=False)
        self.scene.build()

    def render(self, pose: np.ndarray) -> np.ndarray:
        """Grayscale image `(H, W)` uint8 from a camera pose (4x4, camera-to-world, OpenCV axes)."""
        self.camera.set_pose(transform=pose @ GL_FROM_CV)
        _MSAA["samples"] = self.msaa_samples  # read when the camera's framebuffer is created (its first render)
        rgb = self.camera.render(rgb=True, force_render=True)[0]
        luma = (torch.as_tensor(np.ascontiguousarray(rgb)).float() @ LUMA)[None, None]  # (1, 1, H, W)
        if self.warp is not None:
            luma = torch.nn.functional.grid_sample(luma, self.warp, "bilinear", "border", align_corners=False)
            luma = luma * self.visible
        frame = self.sensor.apply(luma.clamp(0, 255), self.generator)
        return frame[0, 0].numpy()

    def close(self) -> None:
        try:
            self.scene.destroy()
        except Exception:
            pass


def render_calibration_set(
    cfg: CameraConfig,
    board: Checkerboard,
    board_views: int,
    floor_views: int,
    sensor: SensorConfig | None = None,
    genesis: GenesisConfig | None = None,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """Board views and floor views `name -> (H, W) uint8` in `cfg`'s camera, and the true values they were rendered
    with (lens, field of view, mount, principal point, board, car poses of the floor views)."""
    free = board_view_poses(cfg, board, board_views, seed)
    cars = floor_view_poses(cfg, board, floor_views, seed)
    scene = CheckerboardScene(cfg, board, sensor, genesis, seed=seed)
    try:
        board_images = {f"board_{k:02d}.png": scene.render(pose) for k, pose in enumerate(free)}
        floor_images = {f"floor_{k:02d}.png": scene.render(car_camera_pose(cfg, *car)) for k, car in enumerate(cars)}
    finally:
        scene.close()
    truth = {
        "lens": cfg.lens, "hfov_deg": cfg.hfov_deg, "pitch_deg": cfg.pitch_deg, "height": cfg.height,
        "forward": cfg.forward, "roll_deg": 0.0, "width": cfg.width, "height_px": cfg.height_px,
        "principal_point": [cfg.width / 2 - 0.5, cfg.height_px / 2 - 0.5],
        "board": {"cols": board.cols, "rows": board.rows, "square": board.square},
        "floor_car_poses": {name: list(car) for name, car in zip(floor_images, cars)},
    }  # fmt: skip
    return board_images, floor_images, truth
