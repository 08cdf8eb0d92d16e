"""Capsules and boxes that stand in for meshes: fitting them to surface points, and casting rays against them.

Fitting works on points sampled uniformly (by area) from a mesh's surface, in the frame of the link that carries it.
A capsule takes the points' principal axis; its radius is a quantile of the points' distances from that axis and its
segment is shortened by the radius at each end, so the rounded caps reach the points' extremes. Several capsules per
link are fitted by Lloyd iterations (assign each point to the nearest capsule surface, refit each capsule). A box
takes the principal axes and the points' extent along each, less the sparsest few per cent at either end.

Intersections are batched over pairs of (primitive, block of rays) sharing one ray origin: rays `(M, S, 3)`, one
primitive per row `M`. Each returns the distance along the ray (`inf` on a miss) and the cosine between the surface
normal and a light direction, which is all Lambertian shading needs.
"""

from __future__ import annotations

import torch
from torch import Tensor

RADIUS_QUANTILE = 0.7
"""quantile of the points' distances from a capsule's axis taken as its radius: surface points of a cylinder lie at
its radius, those of its flat ends inside it, those of a bulge outside it"""
BOX_TRIM = 0.05
"""a fitted box spans its points from this quantile to one minus it along each axis, so thin protrusions (the
hand's finger rails) do not widen it"""


def quat_to_matrix(q: Tensor) -> Tensor:
    """Rotation matrices `(..., 3, 3)` of unit wxyz quaternions `(..., 4)`."""
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, -1).reshape(*q.shape[:-1], 3, 3)


def sample_surface(verts: Tensor, faces: Tensor, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """`(count, 3)` points drawn uniformly by area from a triangle mesh (`verts (V, 3)`, `faces (F, 3)` long), and
    the face `(count,)` of each."""
    tri = verts[faces]  # (F, 3, 3)
    area = torch.linalg.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1).norm(dim=-1)
    face = torch.multinomial(area / area.sum(), count, replacement=True, generator=generator)
    u, v = torch.rand(2, count, 1, generator=generator, dtype=verts.dtype)
    flip = (u + v) > 1  # fold the unit square onto the triangle
    u, v = torch.where(flip, 1 - u, u), torch.where(flip, 1 - v, v)
    t = tri[face]
    return t[:, 0] + u * (t[:, 1] - t[:, 0]) + v * (t[:, 2] - t[:, 0]), face


def principal_axes(points: Tensor) -> tuple[Tensor, Tensor]:
    """Centroid `(3,)` and principal axes `(3, 3)` (columns, largest spread first, right-handed) of `(P, 3)` points."""
    centre = points.mean(0)
    _, vecs = torch.linalg.eigh(torch.cov((points - centre).T))
    axes = vecs.flip(-1)
    axes[:, 2] = torch.linalg.cross(axes[:, 0], axes[:, 1], dim=0)
    return centre, axes


def fit_capsule(points: Tensor, quantile: float = RADIUS_QUANTILE) -> Tensor:
    """Capsule `(7,)` = segment ends a, b and radius r around `(P, 3)` surface points."""
    centre, axes = principal_axes(points)
    rel = points - centre
    s = rel @ axes[:, 0]
    radial = (rel - s[:, None] * axes[:, 0]).norm(dim=-1)
    r = torch.quantile(radial, quantile)
    lo, hi = float(s.min() + r), float(s.max() - r)
    if lo > hi:  # shorter than wide: a sphere
        lo = hi = 0.5 * (lo + hi)
    return torch.cat([centre + lo * axes[:, 0], centre + hi * axes[:, 0], r.reshape(1)])


def segment_distance(points: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Distances `(P, K)` from points `(P, 3)` to K segments with ends `a`, `b` `(K, 3)`."""
    ba = b - a
    pa = points[:, None] - a[None]  # (P, K, 3)
    h = ((pa * ba).sum(-1) / (ba * ba).sum(-1).clamp(min=1e-12)).clamp(0.0, 1.0)
    return (pa - h[..., None] * ba).norm(dim=-1)


def fit_capsules(points: Tensor, k: int, iterations: int = 12) -> tuple[Tensor, Tensor]:
    """`k` capsules `(k, 7)` covering `(P, 3)` surface points, and each point's capsule `(P,)`.

    Starts from `k` slices of equal width along the principal axis; Lloyd iterations then move each point to the
    capsule whose surface is nearest and refit every capsule to its points."""
    centre, axes = principal_axes(points)
    s = (points - centre) @ axes[:, 0]
    edges = torch.linspace(float(s.min()), float(s.max()), k + 1)[1:-1]
    label = torch.bucketize(s, edges)
    caps = torch.zeros(k, 7)
    for _ in range(iterations):
        for j in range(k):
            own = points[label == j]
            if len(own) >= 8:  # an emptied capsule keeps its last fit
                caps[j] = fit_capsule(own)
        gap = (segment_distance(points, caps[:, :3], caps[:, 3:6]) - caps[:, 6]).abs()
        new = gap.argmin(-1)
        if torch.equal(new, label):
            break
        label = new
    return caps, label


def fit_box(points: Tensor, trim: float = BOX_TRIM) -> tuple[Tensor, Tensor, Tensor]:
    """Oriented box around `(P, 3)` points: centre `(3,)`, axes `(3, 3)` (columns) and half extents `(3,)`."""
    centre, axes = principal_axes(points)
    local = (points - centre) @ axes
    lo, hi = torch.quantile(local, trim, dim=0), torch.quantile(local, 1.0 - trim, dim=0)
    return centre + axes @ (0.5 * (lo + hi)), axes, 0.5 * (hi - lo)


def ray_capsule(origin: Tensor, dirs: Tensor, a: Tensor, b: Tensor, r: Tensor, light: Tensor) -> tuple[Tensor, Tensor]:
    """Rays from `origin (3,)` along unit `dirs (M, S, 3)` against capsules `a, b (M, 3)`, `r (M,)`.

    Returns the hit distance `(M, S)` (`inf` on a miss) and the cosine between the outward normal and the unit
    `light (3,)`. The ray meets the infinite cylinder, then the finite body or the cap sphere at the nearer end."""
    ba, oa = b - a, origin - a  # (M, 3)
    baba, baoa, oaoa = (ba * ba).sum(-1, keepdim=True), (ba * oa).sum(-1, keepdim=True), (oa * oa).sum(-1, keepdim=True)
    r2 = (r * r)[:, None]
    proj = torch.bmm(dirs, torch.stack([ba, oa], -1))  # (M, S, 2): d·ba, d·oa
    bd, od = proj[..., 0], proj[..., 1]
    aa = baba - bd * bd
    bb = baba * od - baoa * bd
    cc = baba * oaoa - baoa * baoa - r2 * baba
    h = bb * bb - aa * cc
    t_body = (-bb - h.clamp(min=0.0).sqrt()) / aa.clamp(min=1e-12)
    y = baoa + t_body * bd
    body = (y > 0) & (y < baba) & (aa > 1e-12)
    near_a = y <= 0  # otherwise the cap around b
    b_cap = torch.where(near_a, od, od - bd)
    c_cap = torch.where(near_a, oaoa, oaoa - 2 * baoa + baba) - r2
    h_cap = b_cap * b_cap - c_cap
    t = torch.where(body, t_body, -b_cap - h_cap.clamp(min=0.0).sqrt())
    hit = (h >= 0) & (body | (h_cap >= 0)) & (t > 0)
    # normal = (p - nearest axis point) / r with p = origin + t d
    along = ((baoa + t * bd) / baba.clamp(min=1e-12)).clamp(0.0, 1.0)
    dl = dirs @ light  # (M, S)
    ndl = ((oa @ light)[:, None] + t * dl - along * (ba @ light)[:, None]) / r[:, None]
    return torch.where(hit, t, torch.inf), ndl


def ray_box(
    origin: Tensor, dirs: Tensor, centre: Tensor, rot: Tensor, half: Tensor, light: Tensor
) -> tuple[Tensor, Tensor]:
    """Rays from `origin (3,)` along unit `dirs (M, S, 3)` against boxes: centre `(M, 3)`, axes `rot (M, 3, 3)`
    (columns, world frame), half extents `half (M, 3)`. Returns as `ray_capsule`; the slab method in the box frame."""
    o = torch.einsum("mij,mi->mj", rot, origin - centre)  # (M, 3) origin in the box frame
    d = torch.bmm(dirs, rot)  # (M, S, 3)
    d = torch.where(d.abs() < 1e-12, torch.full_like(d, 1e-12), d)
    inv = 1.0 / d
    t1 = (-half - o)[:, None] * inv
    t2 = (half - o)[:, None] * inv
    t_near, axis = torch.minimum(t1, t2).max(-1)
    t_far = torch.maximum(t1, t2).amin(-1)
    hit = (t_near <= t_far) & (t_near > 0)
    light_box = torch.einsum("mij,i->mj", rot, light)  # (M, 3)
    d_axis = d.gather(-1, axis[..., None])[..., 0]
    ndl = -torch.sign(d_axis) * light_box.gather(-1, axis)  # outward normal: against the ray on the entered face
    return torch.where(hit, t_near, torch.inf), ndl
