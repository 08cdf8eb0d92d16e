"""A rigidly mounted, calibrated camera: its lens (pinhole or equidistant fisheye), field of view, mounting height,
pitch and forward offset, and the fixed ray of every pixel in the body frame (+x forward, +y left, +z up). Renderers
cast these rays; the visual odometry projects the ground through them; calibration fits them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from envs.errors import ConfigError, check_range

IMAGE_HEIGHT, IMAGE_WIDTH = 120, 160


@dataclass(frozen=True)
class CameraConfig:
    """Calibrated camera mount and lens (DeepRacer: one front camera, 15° down, wide lens, 160x120 after resize)."""

    height: float = 0.10
    """lens height above the ground (m)"""
    forward: float = 0.08
    """lens position ahead of the centre of gravity (m)"""
    pitch_deg: float = 15.0
    """downward tilt (degrees)"""
    hfov_deg: float = 120.0
    """horizontal field of view (degrees)"""
    lens: Literal["pinhole", "fisheye"] = "pinhole"
    """pinhole, or equidistant fisheye (angle from the axis proportional to pixel radius)"""
    width: int = IMAGE_WIDTH
    """image width (px)"""
    height_px: int = IMAGE_HEIGHT
    """image height (px)"""
    wall_bins: int = 320
    """azimuth bins for barrier ray casting"""
    march_steps: int = 48
    """sphere-tracing iterations per barrier ray"""
    max_distance: float = 12.0
    """barrier rays stop here (m)"""
    chunk: int = 64
    """envs rendered together on a CPU (keeps per-pixel buffers in cache)"""

    def __post_init__(self) -> None:
        check_range("camera.height", self.height, 0.01, 2.0)
        check_range("camera.forward", self.forward, -0.5, 0.5)
        check_range("camera.pitch_deg", self.pitch_deg, -45.0, 80.0)
        limit = 170.0 if self.lens == "fisheye" else 150.0
        check_range("camera.hfov_deg", self.hfov_deg, 10.0, limit)
        if self.lens not in ("pinhole", "fisheye"):
            raise ConfigError(f"camera.lens={self.lens!r}; use 'pinhole' or 'fisheye'")
        check_range("camera.width", self.width, 8, 4096)
        check_range("camera.height_px", self.height_px, 8, 4096)
        check_range("camera.wall_bins", self.wall_bins, 8, 4096)
        check_range("camera.march_steps", self.march_steps, 1, 256)
        check_range("camera.chunk", self.chunk, 1, 1_000_000)


def pixel_rays(cfg: CameraConfig) -> Tensor:
    """Unit ray per pixel in the car frame (+x forward, +y left, +z up): `(H, W, 3)`."""
    w, h = cfg.width, cfg.height_px
    u = torch.arange(w, dtype=torch.float64) + 0.5 - w / 2.0
    v = torch.arange(h, dtype=torch.float64) + 0.5 - h / 2.0
    vv, uu = torch.meshgrid(v, u, indexing="ij")  # image coordinates: u right, v down, from the centre
    half_fov = math.radians(cfg.hfov_deg) / 2.0
    if cfg.lens == "pinhole":
        f = (w / 2.0) / math.tan(half_fov)
        right, down, fwd = uu / f, vv / f, torch.ones_like(uu)
    else:
        f = (w / 2.0) / half_fov  # equidistant: theta = r / f
        r = torch.sqrt(uu**2 + vv**2).clamp(min=1e-9)
        theta = r / f
        right, down, fwd = torch.sin(theta) * uu / r, torch.sin(theta) * vv / r, torch.cos(theta)
    p = math.radians(cfg.pitch_deg)
    # Camera axes in the car frame after pitching down by p: forward (cos p, 0, -sin p), right (0, -1, 0),
    # down (-sin p, 0, -cos p).
    x = fwd * math.cos(p) - down * math.sin(p)
    y = -right
    z = -fwd * math.sin(p) - down * math.cos(p)
    rays = torch.stack([x, y, z], dim=-1)
    return (rays / rays.norm(dim=-1, keepdim=True)).float()


def project_point(cfg: CameraConfig, point_car: tuple[float, float, float]) -> tuple[float, float]:
    """Pinhole projection of a car-frame point to (column, row) pixel coordinates; the inverse of `pixel_rays`."""
    if cfg.lens != "pinhole":
        raise ConfigError("project_point supports the pinhole lens only")
    px, py, pz = point_car[0] - cfg.forward, point_car[1], point_car[2] - cfg.height
    p = math.radians(cfg.pitch_deg)
    fwd = px * math.cos(p) - pz * math.sin(p)
    down = -px * math.sin(p) - pz * math.cos(p)
    right = -py
    f = (cfg.width / 2.0) / math.tan(math.radians(cfg.hfov_deg) / 2.0)
    return cfg.width / 2.0 + f * right / fwd, cfg.height_px / 2.0 + f * down / fwd


def preprocess(frame: np.ndarray) -> np.ndarray:
    """Any camera image -> `(1, 1, 120, 160)` float32 raw 0-255 grayscale, as the car preprocesses."""
    import cv2

    if frame.ndim == 3 and frame.shape[2] == 3:
        frame = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
    elif frame.ndim == 3:
        frame = frame[..., 0]
    if frame.shape != (120, 160):
        frame = cv2.resize(frame, (160, 120), interpolation=cv2.INTER_AREA)
    return frame.astype(np.float32)[None, None]
