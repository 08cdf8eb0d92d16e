"""Planar visual odometry from the calibrated camera: the car's motion between two frames, without the commands.

The camera is rigidly mounted at a calibrated height, pitch and field of view (`envs.camera_model.CameraConfig`), so
every pixel below the horizon sees a known point of the ground plane in the car frame. A candidate motion of the car
between two frames (forward and left displacement of the centre of gravity, yaw change) moves those points into the
previous car frame, where the calibrated lens projects them into the previous image; the motion that makes the
previous image, sampled there, match the current one is the estimate (direct alignment, Gauss-Newton with Huber
weights; the Jacobian is the ground geometry's derivative in closed form, for either lens, times the bilinear image's
slope, all in one `grid_sample` call per iteration). Two things make it converge from the last estimate: the yaw
change is searched first on the pixels above the horizon (distant, so they move with the rotation only), and the
translation is then refined on a lightly blurred and on the sharp image. Walls are not part of the model; the robust
weights treat them as outliers.

The blurred stage is biased toward a shorter forward motion (a blur in pixels is not the same blur on the ground at two
distances), and the sharp stage alone cannot always climb back out of it: the refinement therefore starts from the last
estimate and from it moved forward by each of `forward_starts`, and keeps the motion whose sharp image matches best (the
sharp cost's minimum sits within a few mm of the true motion; the blurred ones do not). The bias grows with the blur,
and more of the ground's few marks helps; hence the defaults: ground within 2 m, a 0.7-px blur, and starts 0, 2 and 6 cm
ahead, each start one more alignment per frame pair (their accuracy against the camera's true pose change and their
cost: `experiments.research.probe_odometry`, docs/results.md#odometry). A wider blur widens the capture range and costs
accuracy; the 6-cm start keeps the range for a lock lost short.

What it measures: every pose change is what the frames show, whatever the car was told, so slip and a weak motor
show through (the history encoder's estimates follow its commands: `adaptation.estimator_fit.estimate_sources`). What
limits it: the ground carries few marks (border lines, a dashed centreline whose 0.3 m period aliases the forward
displacement at the speeds raced), so the estimate is tracked from frame to frame and can lose the lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from envs.camera_model import CameraConfig, pixel_rays
from envs.errors import ConfigError, check_range


@dataclass(frozen=True)
class OdometryConfig:
    """Direct planar alignment of consecutive frames."""

    ground_range: float = 2.0
    """ground pixels used: those that see the ground within this horizontal distance of the lens (m)"""
    yaw_span: float = 0.3
    """yaw change searched around the previous one (rad per frame)"""
    yaw_step: float = 0.004
    """step of the yaw search (rad)"""
    sky_stride: int = 2
    """every n-th pixel above the horizon enters the yaw search"""
    blur: tuple[float, ...] = (0.7, 0.0)
    """Gaussian blur (px) of the refinement stages, coarse to sharp"""
    iterations: int = 6
    """Gauss-Newton iterations per stage"""
    forward_starts: tuple[float, ...] = (0.0, 0.02, 0.06)
    """forward offsets (m) from the last estimate the refinement starts from; the best-matching result is kept"""

    def __post_init__(self) -> None:
        check_range("odometry.ground_range", self.ground_range, 0.2, 10.0)
        check_range("odometry.yaw_span", self.yaw_span, 0.0, 1.5)
        check_range("odometry.yaw_step", self.yaw_step, 1e-4, 0.2)
        check_range("odometry.sky_stride", self.sky_stride, 1, 64)
        check_range("odometry.iterations", self.iterations, 1, 100)
        if not self.blur or min(self.blur) < 0:
            raise ConfigError(f"odometry.blur={self.blur}: give one or more blur widths >= 0")
        if not self.forward_starts or max(abs(x) for x in self.forward_starts) > 0.5:
            raise ConfigError(
                f"odometry.forward_starts={self.forward_starts}: give one or more offsets within 0.5 m of the last "
                "estimate"
            )


def gaussian_blur(img: Tensor, sigma: float) -> Tensor:
    """Separable Gaussian blur of `(B, 1, H, W)` float images (replicated borders); sigma 0 returns the input."""
    if sigma <= 0:
        return img
    half = int(math.ceil(3 * sigma))
    x = torch.arange(-half, half + 1, dtype=img.dtype, device=img.device)
    w = torch.exp(-(x**2) / (2 * sigma * sigma))
    w = w / w.sum()
    img = F.conv2d(F.pad(img, (half, half, 0, 0), mode="replicate"), w.view(1, 1, 1, -1))
    return F.conv2d(F.pad(img, (0, 0, half, half), mode="replicate"), w.view(1, 1, -1, 1))


class PlanarOdometry:
    """Batched frame-to-frame motion of N cars: `(B, 3)` = forward and left displacement of the centre of gravity in
    the previous car frame (m) and the yaw change (rad), from frames `(B, 1, H, W)` (uint8 or float 0-255)."""

    def __init__(self, optics: CameraConfig, cfg: OdometryConfig | None = None) -> None:
        self.optics, self.cfg = optics, cfg or OdometryConfig()
        o = self.optics
        rays = pixel_rays(o).double().reshape(-1, 3)
        horiz = torch.hypot(rays[:, 0], rays[:, 1]).clamp(min=1e-9)
        down = rays[:, 2] < -1e-6
        dist = torch.where(down, o.height / (-rays[:, 2] / horiz).clamp(min=1e-12), torch.inf)
        ground = (dist < self.cfg.ground_range).nonzero(as_tuple=True)[0]
        self.ground_pix = ground
        gxy = rays[ground, :2] / horiz[ground, None] * dist[ground, None]
        gxy[:, 0] += o.forward
        self.ground = gxy.float()  # (Pg, 2) car-frame ground points (centre of gravity at the origin)
        sky = (rays[:, 2] > 0.02).nonzero(as_tuple=True)[0][:: self.cfg.sky_stride]
        self.sky_pix, self.sky = sky, rays[sky].float()  # (Ps,), (Ps, 3) directions
        if len(ground) < 50:
            raise ConfigError(f"odometry: only {len(ground)} pixels see the ground within {self.cfg.ground_range} m")
        p = math.radians(o.pitch_deg)
        self._cos_p, self._sin_p = math.cos(p), math.sin(p)
        half = math.radians(o.hfov_deg) / 2.0
        self._f = (o.width / 2.0) / (math.tan(half) if o.lens == "pinhole" else half)
        coarse = 5 * self.cfg.yaw_step  # coarse to fine: the span in steps of 5, then +-5 steps around the best
        n = math.floor(self.cfg.yaw_span / coarse)
        self._yaw_offsets = (torch.arange(-n, n + 1) * coarse, torch.arange(-5, 6) * self.cfg.yaw_step)

    # ---------------------------------------------------------------------------------------------- geometry
    def project(self, d: Tensor) -> tuple[Tensor, Tensor]:
        """Directions from the lens `(..., 3)` (car axes) -> `grid_sample` coordinates `(..., 2)` and a validity mask
        (in front of the lens and inside the image)."""
        o = self.optics
        fwd = d[..., 0] * self._cos_p - d[..., 2] * self._sin_p
        dn = -d[..., 0] * self._sin_p - d[..., 2] * self._cos_p
        right = -d[..., 1]
        if o.lens == "pinhole":
            scale = self._f / fwd.clamp(min=1e-6)
            u, v = right * scale, dn * scale
            ok = fwd > 1e-3
        else:
            rho = torch.sqrt(right**2 + dn**2).clamp(min=1e-9)
            r = self._f * torch.atan2(rho, fwd)
            u, v = r * right / rho, r * dn / rho
            ok = torch.ones_like(fwd, dtype=torch.bool)
        grid = torch.stack([2.0 * u / o.width, 2.0 * v / o.height_px], -1)
        return grid, ok & (grid.abs() < 0.99).all(-1)

    def _ground_projection(self, motion: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
        """Where the current ground pixels' points were in the previous image under `motion` `(B, 3)`: the
        `grid_sample` coordinates `(B, Pg, 2)`, a validity mask, the points rotated by the yaw change (lens-free car
        axes, `(B, Pg)` each), and the pixel position's derivatives along the previous frame's forward and left axes
        (du/dx, du/dy, dv/dx, dv/dy, in pixels per metre)."""
        o = self.optics
        c, s = torch.cos(motion[:, 2:3]), torch.sin(motion[:, 2:3])
        gx, gy = self.ground[None, :, 0], self.ground[None, :, 1]
        xr, yr = c * gx - s * gy, s * gx + c * gy
        x, y = xr + motion[:, 0:1] - o.forward, yr + motion[:, 1:2]  # from the lens, in the previous car frame
        cp, sp, f = self._cos_p, self._sin_p, self._f
        fwd = x * cp + o.height * sp  # along the optical axis (the point is `height` below the lens)
        dn = o.height * cp - x * sp  # image down
        right = -y
        if o.lens == "pinhole":
            inv = f / fwd.clamp(min=1e-6)
            u, v = right * inv, dn * inv
            jac = (
                -u * cp / fwd.clamp(min=1e-6),
                -inv,
                -f * o.height / fwd.clamp(min=1e-6).square(),
                torch.zeros_like(x),
            )
            ok = fwd > 1e-3
        else:  # equidistant: radius f * theta, theta the angle from the axis
            rho = torch.sqrt(right.square() + dn.square()).clamp(min=1e-9)
            theta = torch.atan2(rho, fwd)
            k = f * theta / rho
            u, v = k * right, k * dn
            q = rho.square() + fwd.square()
            dk_drho = f * (fwd * rho / q - theta) / rho.square()
            dk_dx = -f / q * cp - dk_drho * sp * dn / rho
            dk_dy = -dk_drho * right / rho
            jac = (dk_dx * right, dk_dy * right - k, dk_dx * dn - k * sp, dk_dy * dn)
            ok = torch.ones_like(x, dtype=torch.bool)
        grid = torch.stack([2.0 * u / o.width, 2.0 * v / o.height_px], -1)
        return grid, ok & (grid.abs() < 0.99).all(-1), xr, yr, jac

    def _ground_in_previous(self, prev: Tensor, motion: Tensor) -> tuple[Tensor, Tensor]:
        """The previous image sampled where the current ground pixels' points were: `(B, Pg)` values and mask."""
        grid, ok = self._ground_projection(motion)[:2]
        val = F.grid_sample(prev, grid[:, None], align_corners=False, padding_mode="border")[:, 0, 0]
        return val, ok

    def _ground_with_jacobian(self, prev: Tensor, motion: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`_ground_in_previous` and its Jacobian `(B, Pg, 3)` with respect to the motion: the geometry's derivative
        in closed form, chained with the bilinear image's slope (central differences 0.1 px apart, sampled in the
        same `grid_sample` call)."""
        o = self.optics
        grid, ok, xr, yr, (du_dx, du_dy, dv_dx, dv_dy) = self._ground_projection(motion)
        d = 0.1
        su, sv = 2.0 * d / o.width, 2.0 * d / o.height_px
        offsets = grid.new_tensor([[0.0, 0.0], [su, 0.0], [-su, 0.0], [0.0, sv], [0.0, -sv]])
        smp = F.grid_sample(prev, grid[:, None] + offsets[None, :, None], align_corners=False, padding_mode="border")
        smp = smp[:, 0]  # (B, 5, Pg)
        iu, iv = (smp[:, 1] - smp[:, 2]) / (2 * d), (smp[:, 3] - smp[:, 4]) / (2 * d)
        di_dx, di_dy = iu * du_dx + iv * dv_dx, iu * du_dy + iv * dv_dy
        # d(x, y)/d(forward, left, yaw) = (1, 0), (0, 1), (-yr, xr)
        return smp[:, 0], ok, torch.stack([di_dx, di_dy, di_dy * xr - di_dx * yr], -1)

    # ------------------------------------------------------------------------------------------------ stages
    def yaw_search(self, prev: Tensor, cur: Tensor, center: Tensor) -> Tensor:
        """Yaw change `(B,)` that best maps the pixels above the horizon (rotation only) around `center`: over the
        span in coarse steps, then in fine steps around the best."""
        ref = cur.flatten(1)[:, self.sky_pix][:, None, :]
        for offsets in self._yaw_offsets:
            center = self._best_yaw(prev, ref, center[:, None] + offsets.to(center)[None, :])
        return center

    def _best_yaw(self, prev: Tensor, ref: Tensor, psi: Tensor) -> Tensor:
        """The candidate of `psi` `(B, K)` with the least mean absolute difference on the sky pixels."""
        c, s = torch.cos(psi)[..., None], torch.sin(psi)[..., None]
        r = self.sky
        d = torch.stack(
            [c * r[:, 0] - s * r[:, 1], s * r[:, 0] + c * r[:, 1], r[:, 2].expand(psi.shape + r[:, 2].shape)], -1
        )
        grid, ok = self.project(d)
        val = F.grid_sample(prev, grid, align_corners=False, padding_mode="border")[:, 0]  # (B, K, Ps)
        cost = ((val - ref).abs().clamp(max=30.0) * ok).sum(-1) / ok.sum(-1).clamp(min=1)
        return psi.gather(1, cost.argmin(1, keepdim=True))[:, 0]

    def refine(self, prev: Tensor, cur: Tensor, motion: Tensor) -> Tensor:
        """Gauss-Newton on the ground pixels from `motion`, blurred stage by stage (Huber weights, the Jacobian in
        closed form). `motion` may hold several starts per frame pair, start-major: `k * B` rows for `B` pairs."""
        eye = torch.eye(3, dtype=motion.dtype, device=motion.device)
        starts = len(motion) // len(prev)
        for sigma in self.cfg.blur:
            pb, cb = gaussian_blur(prev, sigma), gaussian_blur(cur, sigma)
            if starts > 1:
                pb, cb = pb.repeat(starts, 1, 1, 1), cb.repeat(starts, 1, 1, 1)
            ref = cb.flatten(1)[:, self.ground_pix]
            for _ in range(self.cfg.iterations):
                base, ok, jac = self._ground_with_jacobian(pb, motion)
                r = base - ref
                okf = ok.float()
                scale = 1.4826 * (r.abs() * okf).median(dim=1, keepdim=True).values  # masked pixels count as 0
                k = (1.345 * scale).clamp(min=1.0)
                w = okf * torch.clamp(k / r.abs().clamp(min=1e-6), max=1.0)
                jtw = jac.transpose(1, 2) * w[:, None]
                a = jtw @ jac
                a = a + 1e-3 * torch.diag_embed(a.diagonal(dim1=1, dim2=2)) + 1e-6 * eye
                motion = motion - torch.linalg.solve(a, (jtw @ r[..., None])[..., 0])
        return motion

    def alignment_cost(self, prev: Tensor, cur: Tensor, motion: Tensor) -> Tensor:
        """Mean absolute difference `(B,)` (clamped at 30 grey levels) between the sharp current ground pixels and the
        previous image sampled where `motion` puts them."""
        val, ok = self._ground_in_previous(prev, motion)
        diff = (val - cur.flatten(1)[:, self.ground_pix]).abs().clamp(max=30.0)
        return (diff * ok).sum(1) / ok.sum(1).clamp(min=1)

    @torch.no_grad()
    def step(self, prev: Tensor, cur: Tensor, last: Tensor) -> Tensor:
        """Motion `(B, 3)` between `prev` and `cur`, tracked from the last estimate `last` `(B, 3)` (zeros at rest):
        refined from each of `forward_starts` (all in one batch), the best-matching kept."""
        prev, cur = prev.float(), cur.float()
        init = last.float().clone()
        init[:, 2] = self.yaw_search(prev, cur, init[:, 2])
        k, b = len(self.cfg.forward_starts), len(init)
        inits = init.repeat(k, 1)  # start-major: rows [i * b, (i + 1) * b) start `forward_starts[i]` ahead
        inits[:, 0] += torch.tensor(self.cfg.forward_starts, dtype=init.dtype, device=init.device).repeat_interleave(b)
        if k == 1:
            return self.refine(prev, cur, inits)
        motions = self.refine(prev, cur, inits)
        cost = self.alignment_cost(prev.repeat(k, 1, 1, 1), cur.repeat(k, 1, 1, 1), motions).reshape(k, b)
        return motions.reshape(k, b, 3)[cost.argmin(0), torch.arange(b)]

    @staticmethod
    def body_velocity(motion: Tensor, dt: float) -> Tensor:
        """Frame motions `(..., 3)` -> body-frame speed, lateral speed (m/s) and yaw rate (rad/s) at mid-interval."""
        c, s = torch.cos(-motion[..., 2] / 2), torch.sin(-motion[..., 2] / 2)
        vx = c * motion[..., 0] - s * motion[..., 1]
        vy = s * motion[..., 0] + c * motion[..., 1]
        return torch.stack([vx, vy, motion[..., 2]], -1) / dt


def pose_change(before: Tensor, after: Tensor) -> Tensor:
    """Planar poses `(..., 3)` (x, y, yaw of the centre of gravity) -> the motion between them `(..., 3)` as
    `PlanarOdometry` measures it: forward and left displacement in the first pose's frame and the yaw change."""
    d = after[..., :2] - before[..., :2]
    c, s = torch.cos(before[..., 2]), torch.sin(before[..., 2])
    dyaw = torch.remainder(after[..., 2] - before[..., 2] + math.pi, 2 * math.pi) - math.pi
    return torch.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1], dyaw], -1)


class OdometryTracker:
    """Online odometry of N cars, one frame per control step, as `track_episodes` tracks recorded episodes: each
    car's previous frame and last motion; at an episode's first frame (and after `reset`) the velocities are zeros and
    the tracker starts again from rest."""

    def __init__(self, odometry: PlanarOdometry, dt: float, num_envs: int, device: torch.device | str = "cpu") -> None:
        self.odometry, self.dt = odometry, dt
        self.resize(num_envs, device)

    def resize(self, num_envs: int, device: torch.device | str = "cpu") -> None:
        hgt, wid = self.odometry.optics.height_px, self.odometry.optics.width
        self.previous = torch.zeros(num_envs, 1, hgt, wid, device=device)
        self.last = torch.zeros(num_envs, 3, device=device)
        self.seen = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.measured = torch.zeros(num_envs, dtype=torch.bool, device=device)

    @torch.no_grad()
    def update(self, frames: Tensor) -> Tensor:
        """This step's frames `(N, 1, H, W)` (uint8 or float 0-255) -> body velocities `(N, 3)` (speed, lateral speed,
        yaw rate) between each car's previous frame and this one; zeros for cars without a previous frame. Only those
        with one are aligned; `measured` marks them."""
        frames = frames.float()
        out = torch.zeros(len(frames), 3, device=frames.device)
        self.measured = self.seen.clone()
        live = self.seen.nonzero(as_tuple=True)[0]
        if len(live):
            motion = self.odometry.step(self.previous[live], frames[live], self.last[live])
            self.last[live] = motion
            out[live] = self.odometry.body_velocity(motion, self.dt)
        self.previous.copy_(frames)
        self.seen.fill_(True)
        return out

    def estimator_inputs(self, frames: Tensor) -> Tensor:
        """`update`, normalized as the factor estimator reads its motion inputs, and zeros (not the normalized zero
        velocity) where nothing came before, as its training worlds have them at each episode's first step."""
        from adaptation.factor_estimator import normalize_velocities

        velocities = self.update(frames)
        return normalize_velocities(velocities) * self.measured[:, None]

    def reset(self, dones: Tensor) -> None:
        """Forget the cars whose episode ended (their next frame starts a new episode)."""
        done = dones.to(self.seen.device).bool()
        self.seen[done] = False
        self.last[done] = 0.0


def track_episodes(
    odometry: PlanarOdometry, camera: Tensor, episode: Tensor, step: Tensor, dt: float, chunk: int = 64
) -> Tensor:
    """Body velocities `(N, 3)` (speed, lateral speed, yaw rate) of every recorded row, tracked through each episode
    from its first step (zeros there: no frame before it; the tracker starts from rest). Rows of an episode must be
    in step order; episodes are tracked `chunk` at a time, all of a chunk's steps in one batch."""
    out = torch.zeros(len(episode), 3)
    ids, inverse = torch.unique(episode, return_inverse=True)
    order = torch.argsort(inverse * (int(step.max()) + 1) + step, stable=True)
    counts = torch.bincount(inverse, minlength=len(ids))
    starts = torch.cumsum(counts, 0) - counts
    for lo in range(0, len(ids), chunk):
        eps = torch.arange(lo, min(lo + chunk, len(ids)))
        length, first = counts[eps], starts[eps]
        last = torch.zeros(len(eps), 3)
        for t in range(1, int(length.max())):
            live = (length > t).nonzero(as_tuple=True)[0]
            rows_now = order[first[live] + t]
            rows_before = order[first[live] + t - 1]
            motion = odometry.step(camera[rows_before], camera[rows_now], last[live])
            last[live] = motion
            out[rows_now] = odometry.body_velocity(motion, dt)
    return out
