"""Closed-loop race tracks: arc-length parametrization, batched projection, lookahead, DeepRacer route files.

A track is a closed centerline polyline plus a width per vertex. Internally the centerline is resampled (periodic
centripetal Catmull-Rom) to a dense, nearly uniform polyline so projection, interpolation and curvature are cheap and
smooth; the original waypoints are kept for DeepRacer's `waypoints` reward parameter.

Conventions: arc length `s` increases along the file's (forward) direction; the signed lateral offset is positive
to the left of the forward direction; headings are radians in the world frame, counter-clockwise from +x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from envs.errors import TrackFileError

GRAVITY = 9.81


def wrap_angle(angle: Tensor) -> Tensor:
    """Wrap radians to [-pi, pi)."""
    return torch.remainder(angle + math.pi, 2.0 * math.pi) - math.pi


@dataclass
class TrackProjection:
    """Projection of N poses onto the centerline (all tensors `(N,)`)."""

    segment: Tensor  # long, index of the dense segment the point projects to
    s: Tensor  # arc length along the forward direction, in [0, length)
    offset: Tensor  # signed lateral offset, + left of the forward direction
    heading_error: Tensor  # heading minus the forward tangent, wrapped
    half_width: Tensor  # half the track width at the projection


def _drop_repeats(points: np.ndarray, widths: np.ndarray, tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    nxt = np.roll(points, -1, axis=0)
    keep = np.linalg.norm(nxt - points, axis=1) > tol
    return points[keep], widths[keep]


def _segments_intersect(points: np.ndarray) -> tuple[int, int] | None:
    """First pair (i, j) of non-adjacent closed-polyline segments that cross, else None. O(M^2), vectorized."""
    a = points
    b = np.roll(points, -1, axis=0)
    m = len(points)
    i, j = np.triu_indices(m, k=2)
    adjacent = (i == 0) & (j == m - 1)
    i, j = i[~adjacent], j[~adjacent]

    def orient(p, q, r):
        return (q[:, 0] - p[:, 0]) * (r[:, 1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (r[:, 0] - p[:, 0])

    d1 = orient(a[i], b[i], a[j])
    d2 = orient(a[i], b[i], b[j])
    d3 = orient(a[j], b[j], a[i])
    d4 = orient(a[j], b[j], b[i])
    cross = (d1 * d2 < 0) & (d3 * d4 < 0)
    if not cross.any():
        return None
    k = int(np.argmax(cross))
    return int(i[k]), int(j[k])


def validate_centerline(points: np.ndarray, widths: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Check a closed centerline and its widths; return them with consecutive repeated points removed."""
    points = np.asarray(points, dtype=np.float64)
    widths = np.broadcast_to(np.asarray(widths, dtype=np.float64), (len(points),)).copy()
    if points.ndim != 2 or points.shape[1] != 2:
        raise TrackFileError(f"{source}: centerline must have shape (M, 2), got {points.shape}")
    if not np.isfinite(points).all():
        raise TrackFileError(f"{source}: centerline contains NaN or inf")
    if not np.isfinite(widths).all() or (widths <= 0).any():
        bad = int(np.argmax(~np.isfinite(widths) | (widths <= 0)))
        raise TrackFileError(f"{source}: track width must be positive and finite (row {bad} has {float(widths[bad])})")
    points, widths = _drop_repeats(points, widths)
    if len(points) < 4:
        raise TrackFileError(f"{source}: centerline too short: {len(points)} distinct points, need at least 4")
    length = float(np.linalg.norm(np.roll(points, -1, axis=0) - points, axis=1).sum())
    if length < 2.0:
        raise TrackFileError(f"{source}: centerline too short: loop length {length:.3f} m, need at least 2 m")
    crossing = _segments_intersect(points)
    if crossing is not None:
        raise TrackFileError(f"{source}: centerline is self-intersecting (segments {crossing[0]} and {crossing[1]})")
    return points, widths


def _catmull_rom_closed(points: np.ndarray, values: np.ndarray, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Densify a closed polyline with centripetal Catmull-Rom; `values` (M,) are interpolated linearly."""
    p0, p1, p2, p3 = (np.roll(points, k, axis=0) for k in (1, 0, -1, -2))

    def knot(a, b):
        return np.sqrt(np.linalg.norm(b - a, axis=1)) + 1e-9

    t01, t12, t23 = knot(p0, p1), knot(p1, p2), knot(p2, p3)
    u = np.linspace(0.0, 1.0, samples, endpoint=False)[None, :, None]  # (1, S, 1)
    # Tangents at p1 and p2 (Barry-Goldman form written as Hermite tangents), per segment.
    m1 = (p1 - p0) / t01[:, None] - (p2 - p0) / (t01 + t12)[:, None] + (p2 - p1) / t12[:, None]
    m2 = (p2 - p1) / t12[:, None] - (p3 - p1) / (t12 + t23)[:, None] + (p3 - p2) / t23[:, None]
    m1, m2 = m1 * t12[:, None], m2 * t12[:, None]
    h00 = 2 * u**3 - 3 * u**2 + 1
    h10 = u**3 - 2 * u**2 + u
    h01 = -2 * u**3 + 3 * u**2
    h11 = u**3 - u**2
    curve = h00 * p1[:, None] + h10 * m1[:, None] + h01 * p2[:, None] + h11 * m2[:, None]
    vals = values[:, None] * (1 - u[..., 0]) + np.roll(values, -1)[:, None] * u[..., 0]
    return curve.reshape(-1, 2), vals.reshape(-1)


def _resample_uniform(points: np.ndarray, values: np.ndarray, spacing: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Points equally spaced in arc length along a (densely sampled) closed curve, and the curve's length."""
    seg = np.linalg.norm(np.roll(points, -1, axis=0) - points, axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    length = cum[-1]
    count = max(int(round(length / spacing)), 16)
    s = np.linspace(0.0, length, count, endpoint=False)
    closed = np.concatenate([points, points[:1]])
    closed_vals = np.concatenate([values, values[:1]])
    x = np.interp(s, cum, closed[:, 0])
    y = np.interp(s, cum, closed[:, 1])
    v = np.interp(s, cum, closed_vals)
    return np.stack([x, y], axis=1), v, float(length)


def _periodic_smooth(values: np.ndarray, window: int) -> np.ndarray:
    if window <= 1:
        return values
    kernel = np.ones(window) / window
    padded = np.concatenate([values[-window:], values, values[:window]])
    return np.convolve(padded, kernel, mode="same")[window:-window]


class Track:
    """A closed race track with batched geometry queries (torch) and a minimum-time lap model."""

    def __init__(
        self,
        centerline: np.ndarray,
        width: float | np.ndarray,
        name: str = "track",
        spacing: float = 0.1,
        device: str | torch.device = "cpu",
        source: str | None = None,
    ) -> None:
        points, widths = validate_centerline(centerline, width, source or name)
        self.name = name
        self.waypoints = points  # (M, 2) original waypoints, forward order, no repeated closing point
        self.waypoint_widths = widths
        self.device = torch.device(device)
        dense, dense_w = _catmull_rom_closed(points, widths, samples=32)
        dense, dense_w, curve_length = _resample_uniform(dense, dense_w, spacing)
        self._build_tables(dense, dense_w, curve_length)

    # ----------------------------------------------------------------------------------------------- construction
    def _build_tables(self, dense: np.ndarray, widths: np.ndarray, curve_length: float) -> None:
        """Lookup tables. Arc length is parametrized uniformly: vertex i sits at s = i * ds, ds = length / K."""
        nxt = np.roll(dense, -1, axis=0)
        seg = nxt - dense
        seg_len = np.linalg.norm(seg, axis=1)
        seg_heading = np.arctan2(seg[:, 1], seg[:, 0])
        turn = np.angle(np.exp(1j * (seg_heading - np.roll(seg_heading, 1))))
        vertex_heading = seg_heading - 0.5 * turn  # tangent at each vertex: mean of neighbouring segments
        d_heading = np.angle(np.exp(1j * (np.roll(vertex_heading, -1) - vertex_heading)))
        self.length = float(curve_length)
        self.ds = self.length / len(dense)
        # Curvature is smoothed over ~0.15 m: digitized route files are noisy at the waypoint scale.
        kappa = _periodic_smooth(turn / self.ds, window=max(1, int(round(0.15 / self.ds))))
        self.spacing = self.ds
        self.signed_area = 0.5 * float(np.sum(dense[:, 0] * nxt[:, 1] - nxt[:, 0] * dense[:, 1]))
        self.dense_np = dense
        self.curvature_np = kappa
        self.half_width_np = 0.5 * widths
        self.vertex_heading_np = vertex_heading
        t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float32), device=self.device)  # noqa: E731
        hw = 0.5 * widths
        # Segment geometry for projection: x, y, dx, dy, 1 / |d|^2.
        self.seg_table = t(
            np.stack([dense[:, 0], dense[:, 1], seg[:, 0], seg[:, 1], 1 / np.maximum(seg_len**2, 1e-12)], 1)
        )
        # Per-vertex values and their increments to the next vertex, for linear interpolation along s.
        self.interp_table = t(
            np.stack(
                [dense[:, 0], dense[:, 1], seg[:, 0], seg[:, 1], vertex_heading, d_heading, hw, np.roll(hw, -1) - hw], 1
            )
        )
        self.xy = t(dense)  # (K, 2)
        self.seg_vec = t(seg)
        self.seg_len = t(seg_len)
        self.inv_len2 = t(1.0 / np.maximum(seg_len**2, 1e-12))
        self.vertex_heading = t(vertex_heading)
        self.half_width = t(hw)
        self.curvature = t(kappa)

    @property
    def num_points(self) -> int:
        return int(self.xy.shape[0])

    @property
    def is_counter_clockwise(self) -> bool:
        return self.signed_area > 0

    @property
    def min_width(self) -> float:
        return float(2.0 * self.half_width_np.min())

    def to(self, device: str | torch.device) -> Track:
        """Return a copy of this track with its tables on `device`."""
        return Track(self.waypoints, self.waypoint_widths, self.name, self.spacing, device)

    # ------------------------------------------------------------------------------------------------- geometry
    def borders(self, extra: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Left and right border polylines (dense, forward order), offset by `extra` metres beyond the edge."""
        n = np.stack([-np.sin(self.vertex_heading_np), np.cos(self.vertex_heading_np)], 1)
        hw = (self.half_width_np + extra)[:, None]
        return self.dense_np + hw * n, self.dense_np - hw * n

    def interpolate(self, s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Centerline point `(..., 2)`, tangent heading and half width at arc lengths `s` (wrapped into the loop)."""
        u = torch.remainder(s, self.length) / self.ds
        idx = u.long().clamp_(0, self.num_points - 1)
        t = (u - idx).unsqueeze(-1)
        row = self.interp_table[idx]  # (..., 8)
        xy = row[..., 0:2] + t * row[..., 2:4]
        heading = row[..., 4] + t[..., 0] * row[..., 5]
        hw = row[..., 6] + t[..., 0] * row[..., 7]
        return xy, wrap_angle(heading), hw

    def nearest_segment(self, xy: Tensor, chunk: int = 1024) -> Tensor:
        """Index of the nearest dense segment for each point of `(N, 2)`, searching the whole loop."""
        out = []
        for start in range(0, xy.shape[0], chunk):
            p = xy[start : start + chunk, None, :]  # (n, 1, 2)
            rel = p - self.xy[None]  # (n, K, 2)
            t = ((rel * self.seg_vec[None]).sum(-1) * self.inv_len2[None]).clamp(0.0, 1.0)
            dist2 = (rel - t[..., None] * self.seg_vec[None]).square().sum(-1)
            out.append(dist2.argmin(dim=1))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=xy.device)

    def project(self, xy: Tensor, heading: Tensor, hint: Tensor | None = None, window: int = 6) -> TrackProjection:
        """Project `(N, 2)` positions and `(N,)` headings onto the centerline.

        With `hint` (the previous segment index per env) only `window` segments either side are searched, which is
        what the env does every step; without it the whole loop is searched.
        """
        if hint is None:
            hint, window = self.nearest_segment(xy), 1
        offsets = torch.arange(-window, window + 1, device=xy.device)
        cand = torch.remainder(hint[:, None] + offsets, self.num_points)  # (N, W)
        geo = self.seg_table[cand]  # (N, W, 5)
        rx, ry = xy[:, 0:1] - geo[..., 0], xy[:, 1:2] - geo[..., 1]
        t = ((rx * geo[..., 2] + ry * geo[..., 3]) * geo[..., 4]).clamp_(0.0, 1.0)
        ex, ey = rx - t * geo[..., 2], ry - t * geo[..., 3]
        best = (ex * ex + ey * ey).argmin(dim=1, keepdim=True)
        seg = cand.gather(1, best).squeeze(1)
        t = t.gather(1, best).squeeze(1)
        g = geo.gather(1, best.unsqueeze(-1).expand(-1, 1, 5)).squeeze(1)
        rx, ry = rx.gather(1, best).squeeze(1), ry.gather(1, best).squeeze(1)
        offset = (g[:, 2] * ry - g[:, 3] * rx) * torch.sqrt(g[:, 4])
        row = self.interp_table[seg]
        tangent = row[:, 4] + t * row[:, 5]
        half_width = row[:, 6] + t * row[:, 7]
        s = (seg.to(t.dtype) + t) * self.ds
        return TrackProjection(seg, s, offset, wrap_angle(heading - tangent), half_width)

    def lookahead(
        self, xy: Tensor, heading: Tensor, s: Tensor, direction: Tensor, count: int, spacing: float
    ) -> Tensor:
        """The next `count` centerline points ahead along the travel direction, in the car frame: `(N, count, 2)`.

        `direction` is +1 (forward) or -1 (reversed) per env; the car frame has +x forward and +y left.
        """
        steps = torch.arange(1, count + 1, device=xy.device, dtype=xy.dtype) * spacing
        query = s[:, None] + direction[:, None] * steps[None, :]  # (N, count)
        points, _, _ = self.interpolate(query)
        rel = points - xy[:, None, :]
        c, si = torch.cos(heading)[:, None], torch.sin(heading)[:, None]
        return torch.stack([c * rel[..., 0] + si * rel[..., 1], -si * rel[..., 0] + c * rel[..., 1]], dim=-1)

    # ------------------------------------------------------------------------------------------- lap-time model
    def speed_profile(
        self, mu: float, a_accel: float, a_brake: float, v_max: float, reverse: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Minimum-time (quasi-steady-state) speed profile along the centerline: (speeds (K,), segment lengths (K,)).

        The curvature limit sqrt(mu g / kappa) caps the speed; a forward pass limits acceleration and a backward pass
        limits braking, both inside the friction circle (longitudinal grip shrinks as lateral grip is used).
        """
        kappa = np.abs(self.curvature_np)
        ds = np.full(self.num_points, self.ds)
        if reverse:
            kappa, ds = kappa[::-1].copy(), np.roll(ds[::-1], -1)
        grip = mu * GRAVITY
        v_lim = np.minimum(v_max, np.sqrt(grip / np.maximum(kappa, 1e-9)))
        start = int(np.argmin(v_lim))  # the binding corner: the profile there is exactly v_lim
        v_lim, ds_r = np.roll(v_lim, -start), np.roll(ds, -start)
        m = len(v_lim)

        def limited(v: float, a: float, k: float, d: float) -> float:
            lateral = min(1.0, v * v * k / grip)
            a_avail = min(a, grip) * math.sqrt(max(0.0, 1.0 - lateral * lateral))
            return math.sqrt(v * v + 2.0 * a_avail * d)

        k_r = np.roll(kappa, -start)
        v = v_lim.copy()
        for i in range(m - 1):
            v[i + 1] = min(v[i + 1], limited(v[i], a_accel, k_r[i], ds_r[i]))
        v_end = v[0]
        for i in range(m - 1, -1, -1):
            v_next = v_end if i == m - 1 else v[i + 1]
            v[i] = min(v[i], limited(v_next, a_brake, k_r[i], ds_r[i]))
        return np.roll(v, start), np.roll(ds_r, start)

    def optimal_lap_time(
        self, mu: float = 1.0, a_accel: float = 4.0, a_brake: float = 6.0, v_max: float = 4.0, reverse: bool = False
    ) -> float:
        """Minimum-time flying lap along the centerline (seconds) for friction `mu` and the car's limits."""
        if mu <= 0 or a_accel <= 0 or a_brake <= 0 or v_max <= 0:
            raise ValueError("optimal_lap_time needs mu, a_accel, a_brake and v_max > 0")
        v, ds = self.speed_profile(mu, a_accel, a_brake, v_max, reverse)
        v_next = np.roll(v, -1)
        return float(np.sum(2.0 * ds / (v + v_next)))

    # -------------------------------------------------------------------------------------- DeepRacer route files
    @classmethod
    def from_deepracer_npy(cls, path: str | Path, name: str | None = None, **kwargs) -> Track:
        """Load a DeepRacer route file: `(M, 6)` rows `[cx, cy, ix, iy, ox, oy]`, closed when first row == last."""
        path = Path(path)
        try:
            data = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise TrackFileError(f"{path}: track file not found") from None
        except (ValueError, OSError) as err:
            raise TrackFileError(f"{path}: not a readable .npy array ({err})") from None
        if data.ndim != 2 or data.shape[1] != 6:
            raise TrackFileError(f"{path}: expected shape (M, 6) = [cx, cy, ix, iy, ox, oy] rows, got {data.shape}")
        if not np.issubdtype(data.dtype, np.number):
            raise TrackFileError(f"{path}: expected a numeric array, got dtype {data.dtype}")
        data = data.astype(np.float64)
        if not np.isfinite(data).all():
            row = int(np.argmax(~np.isfinite(data).all(axis=1)))
            raise TrackFileError(f"{path}: row {row} contains NaN or inf")
        if len(data) >= 2 and np.allclose(data[0], data[-1]):
            data = data[:-1]
        elif len(data) >= 2:
            gap = float(np.linalg.norm(data[0, :2] - data[-1, :2]))
            typical = float(np.median(np.linalg.norm(np.diff(data[:, :2], axis=0), axis=1)))
            if gap > 3.0 * max(typical, 1e-6):
                raise TrackFileError(
                    f"{path}: not a closed loop (first and last centerline rows are {gap:.2f} m apart)"
                )
        widths = np.linalg.norm(data[:, 2:4] - data[:, 4:6], axis=1)
        return cls(data[:, :2], widths, name=name or path.stem, source=str(path), **kwargs)

    def deepracer_rows(self) -> np.ndarray:
        """This track as DeepRacer route rows `(M + 1, 6)`, closed (first row repeated), inner border first."""
        pts, hw = self.waypoints, 0.5 * self.waypoint_widths
        tangent = np.roll(pts, -1, axis=0) - np.roll(pts, 1, axis=0)
        tangent /= np.linalg.norm(tangent, axis=1, keepdims=True)
        left = np.stack([-tangent[:, 1], tangent[:, 0]], axis=1)
        inner_sign = 1.0 if self.is_counter_clockwise else -1.0
        inner = pts + inner_sign * hw[:, None] * left
        outer = pts - inner_sign * hw[:, None] * left
        rows = np.concatenate([pts, inner, outer], axis=1)
        return np.concatenate([rows, rows[:1]], axis=0)

    def save_deepracer_npy(self, path: str | Path) -> None:
        """Write this track as a DeepRacer route file (atomic: temporary file, then rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npy")
        np.save(tmp, self.deepracer_rows())
        tmp.replace(path)
