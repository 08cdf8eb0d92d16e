"""How the camera over the two-arm table sees the cell: its pose, the light, the table, clutter, lens and sensor.

The constants are the training look, shared by both renderers. `CameraLook` changes it (its defaults are the training
look): the camera's misregistration (a shift and a small turn about its own axes, so the image comes from elsewhere
than where training renders it, while the controller and the task keep their frames), the light's direction and
strength and the ambient light, the table's colour and a procedural grain on it, a few static boxes of clutter on the
table outside the object's area (render-only: the task's physics never sees them), the lens's radial distortion and
the sensor's noise. The functions here are pure: the camera's turn, the table's grain, where the clutter stands, the
lens's sampling grid and the noise, each a function of its parameters (the noise of a passed-in generator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from envs.errors import ConfigError, check_range

CAMERA_POS = (0.0, -1.1, 0.9)
"""camera position in the world (m)"""
CAMERA_LOOKAT = (0.0, 0.0, 0.1)
"""the point the camera looks at (m)"""
CAMERA_UP = (0.0, 0.0, 1.0)
CAMERA_FOV = 55.0
"""vertical field of view (degrees)"""
BACKGROUND = 0.6
"""grey level of what lies beyond the table (the Genesis scene's background colour too)"""
LIGHT = (0.3, -0.5, 1.0)
"""direction toward the light: above the table, on the camera's side"""
AMBIENT, DIFFUSE = 0.35, 0.75
"""Lambertian shading: luma = albedo * (AMBIENT + DIFFUSE * max(0, n . light))"""
TABLE_COLOR = (0.55, 0.45, 0.35)
"""RGB of the table top, in both renderers"""
OBJECT_COLOR = (0.9, 0.9, 0.9)
"""RGB of the object, in both renderers"""
CLUTTER_BAND = (0.22, 0.38)
"""clutter stands this far from the table's centre line in |y| (m): off the object's area and the arms' path"""


@dataclass(frozen=True)
class CameraLook:
    """How the camera sees the cell; every default is the training look."""

    camera_shift: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """where the camera truly is, relative to where training renders it from (m, world x y z)"""
    camera_rotation_deg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """how the camera is truly turned about its own axes (pan about its up axis, tilt about its right axis, roll about
    its view axis; degrees)"""
    light: tuple[float, float, float] = LIGHT
    """direction toward the light (world; normalized)"""
    light_intensity: float = 1.0
    """strength of the light relative to training's"""
    ambient: float = AMBIENT
    """ambient light (the ray caster's grey fraction; the rasterizer's ambient colour scales with it)"""
    table_color: tuple[float, float, float] = TABLE_COLOR
    """RGB of the table top"""
    table_texture: float = 0.0
    """contrast of a procedural grain on the table (0: a plain table)"""
    background: float = BACKGROUND
    """grey level beyond the table"""
    clutter: int = 0
    """static boxes on the table beside the work area (render-only)"""
    clutter_seed: int = 0
    """where the clutter stands, its sizes and greys"""
    distortion: float = 0.0
    """radial lens distortion k1 (r_distorted = r (1 + k1 r^2), r = 1 at the image's half-side; negative: barrel)"""
    noise: float = 0.0
    """standard deviation of the sensor's per-pixel noise (grey levels)"""

    def __post_init__(self) -> None:
        for i, v in enumerate(self.camera_shift):
            check_range(f"look.camera_shift[{i}]", v, -0.2, 0.2)
        for i, v in enumerate(self.camera_rotation_deg):
            check_range(f"look.camera_rotation_deg[{i}]", v, -15.0, 15.0)
        if sum(v * v for v in self.light) < 1e-6 or self.light[2] <= 0.0:
            raise ConfigError(f"look.light={self.light!r} must point upward (z > 0)")
        check_range("look.light_intensity", self.light_intensity, 0.0, 3.0)
        check_range("look.ambient", self.ambient, 0.0, 1.0)
        for i, v in enumerate(self.table_color):
            check_range(f"look.table_color[{i}]", v, 0.0, 1.0)
        check_range("look.table_texture", self.table_texture, 0.0, 0.8)
        check_range("look.background", self.background, 0.0, 1.0)
        check_range("look.clutter", self.clutter, 0, 16)
        check_range("look.distortion", self.distortion, -0.4, 0.4)
        check_range("look.noise", self.noise, 0.0, 30.0)

    @property
    def diffuse(self) -> float:
        """the light's diffuse share of the shading"""
        return DIFFUSE * self.light_intensity


@dataclass(frozen=True)
class LookJitter:
    """Ranges a camera student's training look is drawn from (domain randomization of the render): the envs fall into
    `groups` (env i in group i mod groups), and at every full reset each group draws its own look around the base
    look; all zero (the default), the base look stays. Render-only: the task and its physics never see it."""

    camera_shift: float = 0.0
    """largest shift of the camera along each world axis (m)"""
    camera_rotation_deg: float = 0.0
    """largest turn of the camera about each of its axes (degrees)"""
    light_xy: float = 0.0
    """largest change of the light direction's x and y (its z stays)"""
    light_intensity: tuple[float, float] = (1.0, 1.0)
    """range of the light's strength relative to training's"""
    ambient: tuple[float, float] = (AMBIENT, AMBIENT)
    """range of the ambient light"""
    table_color: float = 0.0
    """largest change of each channel of the table's colour"""
    table_texture: float = 0.0
    """largest contrast of the table's grain"""
    background: float = 0.0
    """largest change of the grey beyond the table"""
    clutter: int = 0
    """most static boxes of clutter (each look draws 0 to this many, at its own places)"""
    groups: int = 4
    """looks drawn at a full reset (envs share them round-robin)"""

    def __post_init__(self) -> None:
        check_range("look_jitter.camera_shift", self.camera_shift, 0.0, 0.1)
        check_range("look_jitter.camera_rotation_deg", self.camera_rotation_deg, 0.0, 10.0)
        check_range("look_jitter.light_xy", self.light_xy, 0.0, 2.0)
        for name in ("light_intensity", "ambient"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi <= (3.0 if name == "light_intensity" else 1.0):
                raise ConfigError(f"look_jitter.{name}={(lo, hi)!r}: need 0 <= low <= high (<= 3 and <= 1)")
        check_range("look_jitter.table_color", self.table_color, 0.0, 0.5)
        check_range("look_jitter.table_texture", self.table_texture, 0.0, 0.8)
        check_range("look_jitter.background", self.background, 0.0, 0.5)
        check_range("look_jitter.clutter", self.clutter, 0, 16)
        check_range("look_jitter.groups", self.groups, 1, 64)

    @property
    def active(self) -> bool:
        return self != LookJitter(groups=self.groups)

    def draw(self, base: CameraLook, generator: torch.Generator) -> CameraLook:
        """One look drawn around `base` from `generator`."""
        u = torch.rand(20, generator=generator, dtype=torch.float64).tolist()
        sym = lambda x, k: (2.0 * u[k] - 1.0) * x  # noqa: E731
        span = lambda r, k: r[0] + (r[1] - r[0]) * u[k]  # noqa: E731
        return CameraLook(
            camera_shift=tuple(v + sym(self.camera_shift, i) for i, v in enumerate(base.camera_shift)),
            camera_rotation_deg=tuple(v + sym(self.camera_rotation_deg, 3 + i)
                                      for i, v in enumerate(base.camera_rotation_deg)),
            light=(base.light[0] + sym(self.light_xy, 6), base.light[1] + sym(self.light_xy, 7), base.light[2]),
            light_intensity=base.light_intensity * span(self.light_intensity, 8),
            ambient=span(self.ambient, 9) if self.ambient != (AMBIENT, AMBIENT) else base.ambient,
            table_color=tuple(min(1.0, max(0.0, v + sym(self.table_color, 10 + i)))
                              for i, v in enumerate(base.table_color)),
            table_texture=max(base.table_texture, self.table_texture * u[13]),
            background=min(1.0, max(0.0, base.background + sym(self.background, 14))),
            clutter=max(base.clutter, int(u[15] * (self.clutter + 1))) if self.clutter else base.clutter,
            clutter_seed=int(u[16] * 2**31) if self.clutter else base.clutter_seed,
            distortion=base.distortion, noise=base.noise,
        )  # fmt: skip


TRAINING_JITTER = LookJitter(
    camera_shift=0.02,
    camera_rotation_deg=1.5,
    light_xy=0.3,
    light_intensity=(0.75, 1.3),
    ambient=(0.25, 0.45),
    table_color=0.08,
    table_texture=0.2,
    background=0.12,
    clutter=5,
)
"""the look a camera student trains under: the camera a couple of centimetres and degrees off, the light's direction
and strength, the table and the background, and some clutter"""


def camera_rotation(rotation_deg: tuple[float, float, float]) -> Tensor:
    """`(3, 3)` float64 rotation of camera-frame vectors (x right, y up, z backward) by pan about y, tilt about x and
    roll about z (degrees), applied in that order; exactly the identity for zero angles."""
    pan, tilt, roll = (math.radians(a) for a in rotation_deg)

    def rot(axis: int, a: float) -> Tensor:
        m = torch.eye(3, dtype=torch.float64)
        i, j = [k for k in range(3) if k != axis]
        c, s = math.cos(a), math.sin(a)
        m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
        return m

    return rot(1, pan) @ rot(0, tilt) @ rot(2, roll)


def camera_frame(pos, lookat, up) -> Tensor:
    """`(3, 3)` float64 rows: the camera's x (right), y (up) and z (backward) axes in the world (OpenGL convention)."""
    p, look, u = (torch.tensor(v, dtype=torch.float64) for v in (pos, lookat, up))
    z = (p - look) / (p - look).norm()
    x = torch.linalg.cross(u, z, dim=0)
    x = x / x.norm()
    return torch.stack([x, torch.linalg.cross(z, x, dim=0), z], 0)


def camera_pose(look: CameraLook) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """`(pos, lookat, up)` of the camera as it truly stands under `look` (training's constants when unchanged)."""
    if look.camera_shift == (0.0, 0.0, 0.0) and look.camera_rotation_deg == (0.0, 0.0, 0.0):
        return CAMERA_POS, CAMERA_LOOKAT, CAMERA_UP
    frame = camera_frame(CAMERA_POS, CAMERA_LOOKAT, CAMERA_UP)
    turned = camera_rotation(look.camera_rotation_deg).T @ frame  # rows: the turned axes in the world
    pos = torch.tensor(CAMERA_POS, dtype=torch.float64) + torch.tensor(look.camera_shift, dtype=torch.float64)
    distance = (torch.tensor(CAMERA_POS, dtype=torch.float64) - torch.tensor(CAMERA_LOOKAT, dtype=torch.float64)).norm()
    lookat = pos - distance * turned[2]
    return tuple(pos.tolist()), tuple(lookat.tolist()), tuple(turned[1].tolist())


def table_grain(xy: Tensor, contrast: float, seed: int = 0) -> Tensor:
    """`(...,)` albedo factor of the table at world points `xy (..., 2)`: planks along x with a wavy grain and a
    per-plank shade, `1 ± contrast` at most; exactly 1 for zero contrast."""
    if contrast == 0.0:
        return torch.ones(xy.shape[:-1], dtype=xy.dtype, device=xy.device)
    g = torch.Generator().manual_seed(seed)
    shades = (torch.rand(64, generator=g) * 2.0 - 1.0).to(xy.device, xy.dtype)
    plank = torch.floor(xy[..., 1] / 0.09).long() % 64
    grain = torch.sin(2 * math.pi * (xy[..., 1] / 0.012 + 0.6 * torch.sin(2 * math.pi * xy[..., 0] / 0.31)))
    return 1.0 + contrast * (0.6 * shades[plank] + 0.4 * grain)


def clutter_boxes(count: int, seed: int, table_size: tuple[float, float]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`count` static boxes on the table: centres `(K, 3)`, axes `(K, 3, 3)` (columns; a yaw about z), half extents
    `(K, 3)` and albedos `(K,)`, in the bands of `CLUTTER_BAND` in |y| (both sides of the work area)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(count, 8, generator=g)
    half = torch.stack([0.015 + 0.03 * u[:, 0], 0.015 + 0.03 * u[:, 1], 0.01 + 0.035 * u[:, 2]], -1)
    sx = table_size[0] / 2 - 0.06
    side = torch.where(u[:, 3] < 0.5, -1.0, 1.0)
    y = side * (CLUTTER_BAND[0] + (CLUTTER_BAND[1] - CLUTTER_BAND[0]) * u[:, 4])
    centre = torch.stack([sx * (2.0 * u[:, 5] - 1.0), y, half[:, 2]], -1)
    yaw = math.pi * u[:, 6]
    c, s, zero, one = torch.cos(yaw), torch.sin(yaw), torch.zeros(count), torch.ones(count)
    axes = torch.stack([torch.stack([c, -s, zero], -1), torch.stack([s, c, zero], -1),
                        torch.stack([zero, zero, one], -1)], -2)  # fmt: skip
    return centre, axes, half, 0.15 + 0.75 * u[:, 7]


def lens_grid(res: int, k1: float) -> Tensor:
    """`(1, res, res, 2)` sampling grid (`grid_sample`, align_corners=False) of a radial lens: the distorted image's
    pixel at normalized radius r shows the pinhole image at r (1 - k1 r^2), to first order the inverse of
    r_distorted = r (1 + k1 r^2) (negative k1: barrel, the image's edges pulled toward its centre)."""
    c = (torch.arange(res, dtype=torch.float64) + 0.5) / res * 2.0 - 1.0
    row, col = torch.meshgrid(c, c, indexing="ij")
    scale = 1.0 - k1 * (row * row + col * col)
    return torch.stack([col * scale, row * scale], -1)[None].float()


def distort(images: Tensor, grid: Tensor) -> Tensor:
    """`(N, 1, H, W)` uint8 images resampled through a `lens_grid` (bilinear; outside the frame: the border pixel)."""
    out = F.grid_sample(images.float(), grid.expand(images.shape[0], -1, -1, -1).to(images.device),
                        mode="bilinear", padding_mode="border", align_corners=False)  # fmt: skip
    return out.round().clamp_(0, 255).to(torch.uint8)


def sensor_noise(images: Tensor, std: float, generator: torch.Generator | None) -> Tensor:
    """`(N, 1, H, W)` uint8 images with Gaussian noise of `std` grey levels drawn from `generator` (CPU)."""
    noise = torch.randn(images.shape, generator=generator) * std
    return (images.float() + noise.to(images.device)).round().clamp_(0, 255).to(torch.uint8)
