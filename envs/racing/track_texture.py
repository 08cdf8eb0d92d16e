"""Raster scene of a track for cameras: ground texture, barrier-wall distance field, background panorama.

The ground texture has two channels sampled bilinearly: `track` (1 on asphalt) and `line` (1 on the white border
lines and the dashed centerline). A camera turns them into luma with per-env material colors, so visual
randomization costs nothing extra here. Row 0 of every grid is the smallest y.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy.spatial import cKDTree
from torch import Tensor

from envs.errors import ConfigError, check_range
from envs.racing.track import Track


@dataclass(frozen=True)
class SceneConfig:
    """What the track looks like: markings, barriers and the surrounding room."""

    texel: float = 0.01
    """ground texture resolution (m per texel)"""
    margin: float = 2.0
    """ground texture extends this far beyond the track (m)"""
    border_line_width: float = 0.05
    """white border lines, inside each edge (m)"""
    center_line_width: float = 0.03
    """dashed centerline width (m); 0 = none"""
    dash_length: float = 0.15
    """centerline dash length (m); the gaps have the same length"""
    walls: bool = True
    """barrier walls around the track"""
    wall_offset: float = 0.4
    """distance from the track edge to the barrier (m)"""
    wall_height: float = 0.25
    """barrier height (m)"""
    room_seed: int = 7
    """seed of the background panorama (objects around the room)"""
    floor: Literal["grass", "office"] = "grass"
    """what surrounds the track: a green mat, or an office floor (speckled carpet inside, tiles outside)
    (genesis camera)"""
    clutter: int = 24
    """boxes and people-sized objects beyond the barriers (genesis camera)"""
    light_azimuth_deg: float = 45.0
    """direction the directional light comes from (degrees from +x; genesis camera)"""
    light_elevation_deg: float = 35.0
    """directional light elevation above the horizon (degrees; genesis camera)"""
    light_intensity: float = 1.0
    """directional light intensity (genesis camera)"""
    ambient: float = 0.45
    """ambient light level (genesis camera)"""
    shadow_strength: float = 0.0
    """barrier shadows baked into the floor, cast by the directional light: luma loss in the shadow (genesis
    camera; the software rasterizer has no shadow maps)"""
    glare_patches: int = 0
    """bright patches of reflected sunlight on the floor (genesis camera)"""
    glare_strength: float = 0.6
    """how far a glare patch pushes the floor toward white at its centre (genesis camera)"""

    def __post_init__(self) -> None:
        if self.floor not in ("grass", "office"):
            raise ConfigError(f"scene.floor={self.floor!r}; use 'grass' or 'office'")
        check_range("scene.clutter", self.clutter, 0, 1000)
        check_range("scene.light_elevation_deg", self.light_elevation_deg, 5.0, 90.0)
        check_range("scene.light_intensity", self.light_intensity, 0.0, 10.0)
        check_range("scene.ambient", self.ambient, 0.0, 1.0)
        check_range("scene.shadow_strength", self.shadow_strength, 0.0, 1.0)
        check_range("scene.glare_patches", self.glare_patches, 0, 200)
        check_range("scene.glare_strength", self.glare_strength, 0.0, 1.0)
        check_range("scene.texel", self.texel, 0.002, 0.1)
        check_range("scene.margin", self.margin, 0.2, 20.0)
        check_range("scene.border_line_width", self.border_line_width, 0.0, 0.3)
        check_range("scene.center_line_width", self.center_line_width, 0.0, 0.3)
        check_range("scene.dash_length", self.dash_length, 0.01, 5.0)
        check_range("scene.wall_offset", self.wall_offset, 0.0, 10.0)
        check_range("scene.wall_height", self.wall_height, 0.01, 5.0)


def _smooth_step(edge_distance: np.ndarray, soft: float) -> np.ndarray:
    """1 inside (negative distance), 0 outside, linear over `soft` metres around the edge (antialiasing)."""
    return np.clip(0.5 - edge_distance / soft, 0.0, 1.0)


class TrackScene:
    """Tensors a camera samples: `texture (1, 2, H, W)`, `wall_sdf (1, 1, H, W)`, `panorama (P,)` and their frames."""

    def __init__(self, track: Track, cfg: SceneConfig, device: str | torch.device = "cpu") -> None:
        self.track, self.cfg, self.device = track, cfg, torch.device(device)
        pts = track.dense_np
        lo = pts.min(axis=0) - track.half_width_np.max() - cfg.margin
        hi = pts.max(axis=0) + track.half_width_np.max() + cfg.margin
        self.origin = lo
        # Even sizes, so the 2x coarser barrier grid covers exactly the same extent.
        self.shape = tuple(2 * int(np.ceil((hi[k] - lo[k]) / (2 * cfg.texel))) for k in (1, 0))
        self.extent = np.array([self.shape[1] * cfg.texel, self.shape[0] * cfg.texel])  # (width_x, height_y) in m
        track_mask, line_mask, wall_dist = self._rasterize()
        tex = np.stack([track_mask, line_mask])[None].astype(np.float32)
        self.texture = torch.as_tensor(tex, device=self.device)
        # The barrier distance field is smooth, so a 2x coarser grid is as accurate and stays in cache.
        sdf = torch.as_tensor(wall_dist[None, None].astype(np.float32), device=self.device)
        self.wall_sdf = torch.nn.functional.avg_pool2d(sdf, 2)
        self.sdf_texel = 2 * cfg.texel
        self.panorama = self._panorama()

    def _rasterize(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cfg, track = self.cfg, self.track
        # A 1 cm centerline so nearest-point distances are accurate to well under a texel.
        s_fine = np.arange(0.0, track.length, 0.01)
        xy, _, hw = (a.cpu().numpy() for a in track.interpolate(torch.as_tensor(s_fine, dtype=torch.float32)))
        tree = cKDTree(xy.astype(np.float64))
        h, w = self.shape
        gx = self.origin[0] + (np.arange(w) + 0.5) * cfg.texel
        gy = self.origin[1] + (np.arange(h) + 0.5) * cfg.texel
        px, py = np.meshgrid(gx, gy)  # (H, W), row 0 = smallest y
        query = np.stack([px.ravel(), py.ravel()], axis=1)
        dist, idx = tree.query(query, workers=-1)
        dist, idx = dist.reshape(h, w), idx.reshape(h, w)
        half = hw[idx]
        soft = cfg.texel
        track_mask = _smooth_step(dist - half, soft)
        border = _smooth_step(np.abs(dist - (half - 0.5 * cfg.border_line_width)) - 0.5 * cfg.border_line_width, soft)
        line = border * (cfg.border_line_width > 0)
        if cfg.center_line_width > 0:
            dash_on = np.remainder(s_fine[idx], 2.0 * cfg.dash_length) < cfg.dash_length
            center = _smooth_step(dist - 0.5 * cfg.center_line_width, soft) * dash_on
            line = np.maximum(line, center)
        wall_level = half + cfg.wall_offset
        # w - d: positive on the track side of the barrier (the set d == w), negative beyond it. Its magnitude is a
        # lower bound of the distance to the barrier, so sphere tracing with it never steps through a wall.
        wall_dist = (wall_level - dist) if cfg.walls else np.full_like(dist, 1e3)
        return track_mask, line * track_mask, wall_dist

    def _panorama(self, bins: int = 720) -> Tensor:
        """A seeded 360° strip of room objects (panels, people, doors) as luma gains around 1."""
        rng = np.random.default_rng(self.cfg.room_seed)
        strip = np.ones(bins)
        for _ in range(40):
            start, width = rng.integers(0, bins), rng.integers(4, 40)
            strip[np.arange(start, start + width) % bins] *= rng.uniform(0.55, 1.25)
        return torch.as_tensor(strip.astype(np.float32), device=self.device)

    def to_grid(self, xy: Tensor) -> Tensor:
        """World points `(..., 2)` to grid_sample's normalized coordinates (align_corners=False)."""
        origin = torch.as_tensor(self.origin, dtype=xy.dtype, device=xy.device)
        extent = torch.as_tensor(self.extent, dtype=xy.dtype, device=xy.device)
        return (xy - origin) / extent * 2.0 - 1.0

    def image(self) -> np.ndarray:
        """The nominal ground luma as an `(H, W)` uint8 image (row 0 = smallest y), e.g. for plots."""
        from envs.racing.randomization import NOMINAL_LUMA

        tex = self.texture[0].cpu().numpy()
        luma = NOMINAL_LUMA["ground"] + tex[0] * (NOMINAL_LUMA["asphalt"] - NOMINAL_LUMA["ground"])
        luma = luma + tex[1] * (NOMINAL_LUMA["line"] - NOMINAL_LUMA["asphalt"])
        return np.clip(luma, 0, 255).astype(np.uint8)

    def rgb_image(self) -> np.ndarray:
        """A colored `(H, W, 3)` uint8 texture, row 0 = largest y: dark asphalt, white lines, green ground; or, with
        `floor=office`, speckled carpet and tiles; with baked barrier shadows and glare patches when configured."""
        cfg = self.cfg
        tex = self.texture[0].cpu().numpy()
        rng = np.random.default_rng(cfg.room_seed + 1)
        if cfg.floor == "office":
            speckle = rng.normal(0.0, 12.0, (*tex.shape[-2:], 1))
            ground = np.array([185, 180, 170]) + 0.5 * speckle  # pale tiles outside the tape
            asphalt = np.array([95, 92, 100]) + speckle  # carpet
        else:
            ground, asphalt = np.array([70, 125, 60]), np.array([55, 55, 60])
        line = np.array([235, 235, 235])
        rgb = ground + tex[0][..., None] * (asphalt - ground)
        rgb = rgb + tex[1][..., None] * (line - asphalt)
        if cfg.shadow_strength > 0 and cfg.walls:
            rgb = rgb * (1.0 - cfg.shadow_strength * self._barrier_shadow())[..., None]
        for _ in range(cfg.glare_patches):
            rgb = rgb + self._glare(rng)[..., None] * (255.0 - rgb)
        return np.clip(rgb, 0, 255).astype(np.uint8)[::-1].copy()

    def _barrier_shadow(self) -> np.ndarray:
        """`(H, W)` mask of floor shaded by the barriers: the wall line swept away from the light over the shadow
        length wall_height / tan(elevation)."""
        cfg = self.cfg
        h, w = self.shape
        sdf = torch.nn.functional.interpolate(self.wall_sdf, size=(h, w), mode="bilinear")[0, 0].cpu().numpy()
        wall = (np.abs(sdf) < cfg.texel).astype(np.float32)
        length = cfg.wall_height / math.tan(math.radians(cfg.light_elevation_deg))
        az = math.radians(cfg.light_azimuth_deg)
        shadow = np.zeros_like(wall)
        steps = max(1, int(length / cfg.texel))
        for k in range(steps + 1):
            dx, dy = int(round(-math.cos(az) * k)), int(round(-math.sin(az) * k))
            shadow = np.maximum(shadow, np.roll(wall, (dy, dx), axis=(0, 1)))
        return shadow

    def _glare(self, rng: np.random.Generator) -> np.ndarray:
        """`(H, W)` weight of one soft elliptical patch of sunlight somewhere on the track."""
        cfg = self.cfg
        h, w = self.shape
        centre = self.track.dense_np[rng.integers(len(self.track.dense_np))] + rng.normal(0.0, 0.2, 2)
        a, b, ang = rng.uniform(0.2, 0.6), rng.uniform(0.08, 0.25), rng.uniform(0, math.pi)
        gx = self.origin[0] + (np.arange(w) + 0.5) * cfg.texel - centre[0]
        gy = self.origin[1] + (np.arange(h) + 0.5) * cfg.texel - centre[1]
        px, py = np.meshgrid(gx, gy)
        u = (px * math.cos(ang) + py * math.sin(ang)) / a
        v = (-px * math.sin(ang) + py * math.cos(ang)) / b
        return cfg.glare_strength * np.exp(-2.0 * (u * u + v * v))
