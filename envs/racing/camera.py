"""Cameras: `(N, 1, 120, 160)` uint8 grayscale frames, exactly what the car's front camera would deliver.

`ProjectiveCamera` is a batched torch ray caster. Every pixel's ray is fixed in the car frame (the camera is rigidly
mounted), so the ground point a pixel sees is precomputed once; per frame, one batched affine map plus one
`grid_sample` gives the ground. Barriers are found by sphere tracing a 2-D distance field along one ray per azimuth
bin; a pixel shows the wall when its ray reaches the wall's horizontal distance before the ground and below the wall
top. Above the horizon is a room panorama indexed by world azimuth. Pinhole and equidistant fisheye lenses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from envs.camera_model import CameraConfig, pixel_rays
from envs.errors import ConfigError
from envs.racing.randomization import VisualSample
from envs.racing.track_texture import TrackScene


class ProjectiveCamera:
    """Batched torch renderer of the track scene from N car poses.

    Internally images are pixel-major `(P, N)` so per-pixel tables broadcast along rows and per-azimuth values
    spread to pixels by row gathers; one transpose at the end gives `(N, 1, H, W)`.
    """

    name = "projective"

    def __init__(self, scene: TrackScene, cfg: CameraConfig, device: str | torch.device = "cpu") -> None:
        self.scene, self.cfg, self.device = scene, cfg, torch.device(device)
        rays = pixel_rays(cfg).to(self.device).reshape(-1, 3)  # (P, 3)
        horiz = torch.hypot(rays[:, 0], rays[:, 1]).clamp(min=1e-6)
        down = rays[:, 2] < -1e-6
        slope = rays[:, 2] / horiz  # height change per horizontal metre
        ground_dist = torch.where(down, cfg.height / (-slope).clamp(min=1e-9), torch.inf)  # horizontal distance
        self.ground_idx = down.nonzero(as_tuple=True)[0]  # pixels that see the ground
        self.sky_idx = (~down).nonzero(as_tuple=True)[0]
        gxy = torch.stack([rays[:, 0], rays[:, 1]], -1) / horiz[:, None] * ground_dist.clamp(max=1e3)[:, None]
        gxy = gxy[self.ground_idx]
        gxy[:, 0] += cfg.forward
        self.ground_h = torch.cat([gxy, torch.ones_like(gxy[:, :1])], dim=1)  # (Pg, 3) homogeneous car-frame points
        # A barrier at horizontal distance D is visible in a pixel when wall_near <= D < wall_far.
        wall_h = scene.cfg.wall_height
        rise = wall_h - cfg.height
        far_up = torch.where(slope > 1e-9, rise / slope.clamp(min=1e-9), torch.inf if rise >= 0 else 0.0)
        self.wall_far = torch.where(down, ground_dist, far_up)[:, None]  # (P, 1)
        near = torch.where(down & (rise < 0), -rise / (-slope).clamp(min=1e-9), 0.0)
        self.wall_near = near[:, None] if rise < 0 else None
        azimuth = torch.atan2(rays[:, 1], rays[:, 0])
        lo, hi = float(azimuth.min()), float(azimuth.max())
        self.bin_azimuth = torch.linspace(lo, hi, cfg.wall_bins, device=self.device)  # (B,)
        pixel_bin = ((azimuth - lo) / max(hi - lo, 1e-9) * (cfg.wall_bins - 1)).round().long()  # (P,)
        self.sky_shade = (1.0 - 0.25 * rays[self.sky_idx, 2].clamp(min=0.0))[:, None]  # (Ps, 1)
        # Internally pixels are ordered sky first, then ground, so each part is one contiguous block of rows; the
        # finished uint8 frame is put back into image order with one row gather.
        order = torch.cat([self.sky_idx, self.ground_idx])
        self.image_order = torch.argsort(order)
        self.pixel_bin = pixel_bin[order]
        self.wall_far = self.wall_far[order]
        self.wall_near = self.wall_near[order] if self.wall_near is not None else None
        self.n_sky = len(self.sky_idx)

    # --------------------------------------------------------------------------------------------------- walls
    def _wall_distance(self, cam_x: Tensor, cam_y: Tensor, yaw: Tensor) -> tuple[Tensor, Tensor]:
        """Horizontal distance `(B, N)` to the barrier along each azimuth bin (inf if none) and hit points.

        Sphere tracing on the signed barrier distance field; every few iterations the rays still marching are
        compacted, so the long tail of grazing rays costs little."""
        cfg, scene = self.cfg, self.scene
        ang = self.bin_azimuth[:, None] + yaw[None, :]  # (B, N)
        dx, dy = torch.cos(ang), torch.sin(ang)
        # Grid coordinates are affine in t: g(t) = g0 + t * gd, so each iteration is one fused multiply-add.
        scale = torch.as_tensor(2.0 / scene.extent, dtype=dx.dtype, device=self.device)
        g0 = scene.to_grid(torch.stack([cam_x, cam_y], -1))[None, :, :].expand(ang.shape[0], -1, -1).reshape(-1, 2)
        gd = (torch.stack([dx, dy], -1) * scale).reshape(-1, 2)
        t = torch.zeros(g0.shape[0], device=self.device)
        d = torch.zeros_like(t)
        eps = 0.5 * scene.sdf_texel
        idx = torch.arange(t.shape[0], device=self.device)
        t_sub, d_sub, g0_sub, gd_sub = t, d, g0, gd
        for i in range(cfg.march_steps):
            if i > 0 and i % 4 == 0:  # write back and keep only the rays still marching
                t[idx], d[idx] = t_sub, d_sub
                keep = (d_sub > eps) & (t_sub < cfg.max_distance)
                idx = idx[keep]
                t_sub, d_sub, g0_sub, gd_sub = t[idx], d[idx], g0[idx], gd[idx]
                if idx.numel() == 0:
                    break
            t_sub = t_sub + torch.where((d_sub > eps) & (t_sub < cfg.max_distance), d_sub, 0.0)
            grid = torch.addcmul(g0_sub, t_sub.unsqueeze(-1), gd_sub)
            d_sub = F.grid_sample(scene.wall_sdf, grid.reshape(1, -1, 1, 2), padding_mode="border", align_corners=False)
            d_sub = d_sub.reshape(-1)
        t[idx], d[idx] = t_sub, d_sub
        t, d = t.reshape(ang.shape), d.reshape(ang.shape)
        hit = (d <= 2 * eps) & (t < cfg.max_distance)
        hx = cam_x[None, :] + t * dx
        hy = cam_y[None, :] + t * dy
        return torch.where(hit, t, torch.inf), torch.stack([hx, hy], -1)

    # -------------------------------------------------------------------------------------------------- render
    @torch.no_grad()
    def render(self, x: Tensor, y: Tensor, yaw: Tensor, visuals: VisualSample) -> Tensor:
        """Frames `(N, 1, H, W)` uint8 from car poses `(N,)` (centre of gravity, world frame).

        Rendered in chunks of `cfg.chunk` envs so the per-pixel intermediates stay cache-sized on a CPU."""
        n, step = x.shape[0], self.cfg.chunk if self.device.type == "cpu" else x.shape[0]
        walls = self._walls(x, y, yaw, visuals) if self.scene.cfg.walls else None  # per azimuth bin: all envs at once
        if n <= step:
            return self._render(x, y, yaw, visuals, walls)
        out = torch.empty(n, 1, self.cfg.height_px, self.cfg.width, dtype=torch.uint8, device=self.device)
        for i in range(0, n, step):
            sl = slice(i, i + step)
            part = VisualSample(*(getattr(visuals, f)[sl] for f in VisualSample.__dataclass_fields__))
            part_walls = (walls[0][:, sl], walls[1][:, sl]) if walls is not None else None
            out[sl] = self._render(x[sl], y[sl], yaw[sl], part, part_walls)
        return out

    def _walls(self, x: Tensor, y: Tensor, yaw: Tensor, v: VisualSample) -> tuple[Tensor, Tensor]:
        """Barrier distance and luma per azimuth bin, `(B, N)` each."""
        c, s = torch.cos(yaw), torch.sin(yaw)
        dist, hit_xy = self._wall_distance(x + self.cfg.forward * c, y + self.cfg.forward * s, yaw)
        stripe = torch.remainder(torch.floor((hit_xy[..., 0] + hit_xy[..., 1]) / 0.3), 2.0)
        return dist, v.wall * (0.88 + 0.24 * stripe)

    def _render(self, x: Tensor, y: Tensor, yaw: Tensor, visuals: VisualSample, walls) -> Tensor:
        n, cfg, scene, v = x.shape[0], self.cfg, self.scene, visuals
        c, s = torch.cos(yaw), torch.sin(yaw)
        # Car-frame ground points (gx, gy, 1) -> grid coordinates with one GEMM: (Pg, 3) @ (3, N * 2).
        sx, sy = 2.0 / float(scene.extent[0]), 2.0 / float(scene.extent[1])
        ox, oy = float(scene.origin[0]), float(scene.origin[1])
        m = torch.stack(
            [
                torch.stack([c * sx, s * sy], -1),
                torch.stack([-s * sx, c * sy], -1),
                torch.stack([(x - ox) * sx - 1.0, (y - oy) * sy - 1.0], -1),
            ],
            dim=0,
        )  # (3, N, 2)
        grid = torch.mm(self.ground_h, m.reshape(3, n * 2)).reshape(1, -1, n, 2)  # (1, Pg, N, 2)
        tex = F.grid_sample(scene.texture, grid, align_corners=False)[0]  # (2, Pg, N)
        ground = torch.addcmul(v.ground, tex[0], v.asphalt - v.ground)
        ground = torch.addcmul(ground, tex[1], v.line - v.asphalt)

        # Background: room panorama by world azimuth per bin, spread to the sky pixels.
        pano = scene.panorama
        world_az = torch.remainder(self.bin_azimuth[:, None] + yaw[None, :], 2 * math.pi)
        sky_bins = pano[(world_az * (pano.shape[0] / (2 * math.pi))).long().clamp(max=pano.shape[0] - 1)] * v.sky
        luma = torch.empty(self.pixel_bin.shape[0], n, device=self.device)
        luma[self.n_sky :] = ground
        torch.mul(sky_bins[self.pixel_bin[: self.n_sky]], self.sky_shade, out=luma[: self.n_sky])

        if walls is not None:
            dist, wall = walls  # (B, N)
            d_pix = dist[self.pixel_bin]  # (P, N)
            visible = d_pix < self.wall_far
            if self.wall_near is not None:
                visible &= d_pix >= self.wall_near
            luma = torch.where(visible, wall[self.pixel_bin], luma)

        frames = (luma * v.brightness).clamp_(0.0, 255.0).to(torch.uint8).index_select(0, self.image_order)
        return frames.t().reshape(n, 1, cfg.height_px, cfg.width)


def make_camera(kind: str, scene: TrackScene, cfg: CameraConfig, device: str | torch.device) -> ProjectiveCamera:
    if kind == "projective":
        return ProjectiveCamera(scene, cfg, device)
    raise ConfigError(f"env.camera={kind!r}; available: 'projective' (and 'none' to switch the camera off)")
