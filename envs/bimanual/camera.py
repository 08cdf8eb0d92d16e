"""The fixed camera over the two-arm table, and a batched torch ray caster that renders it without a rasterizer.

The camera (pose, vertical field of view, OpenGL axes: -z looks forward, +y up) is the one the Genesis scene adds;
every pixel's ray is fixed. The ray caster stands capsules in for the Panda links (fitted once to points sampled from
each link's visual meshes; several per link where a link bends), boxes for the hand and the fingers, the object's own
box and the table top as a plane within its extent, with the background colour beyond. Per frame it reads every link's
pose, moves the primitives, and casts only the rays that can meet them: the image is cut into square tiles, each
tile's rays lie in a cone around its centre ray, and a (tile, env, primitive) pair is tested only when the cone meets
the primitive's bounding sphere. A hit is written as one integer key, quantized depth above the pixel's 8-bit
payload (its shaded luma, or the link it shows), and one `scatter_reduce(amin)` keeps the nearest per pixel over the
static table and background. Shading is Lambertian under one directional light plus ambient light. No Python loops
run over envs or primitives per frame.

A `CameraLook` (`envs/bimanual/look.py`; training's by default) sets where the camera truly stands, the light, the
table's colour and grain, and clutter: static boxes cast once into the static background with the table.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from envs.bimanual.look import (
    AMBIENT,
    CAMERA_FOV,
    CAMERA_LOOKAT,
    CAMERA_POS,
    CAMERA_UP,
    DIFFUSE,
    OBJECT_COLOR,
    CameraLook,
    camera_frame,
    camera_rotation,
    clutter_boxes,
    table_grain,
)
from envs.bimanual.primitives import fit_box, fit_capsules, quat_to_matrix, ray_box, ray_capsule, sample_surface

LUMA = (0.299, 0.587, 0.114)
BOX_LINKS = ("hand", "left_finger", "right_finger")
"""Panda links drawn as boxes; the others as capsules"""
CAPSULES_PER_LINK = {"link0": 2, "link1": 2, "link2": 2, "link3": 2, "link4": 2, "link5": 2, "link6": 2, "link7": 1}
"""capsules fitted to each link (the elbow-shaped links carry two joint housings at right angles)"""
SURFACE_SAMPLES = 3000
"""points sampled from a link's visual meshes for the fit"""
DEPTH_STEPS = 1 << 16
"""depth quantization of the z-buffer keys (steps per metre)"""
MISS = 1 << 22
"""the quantized depth of the background (nothing on the ray; 64 m, far beyond the scene): keys fit in int32"""
NO_HIT = (MISS + 1) << 8
"""the key of a primitive's ray that misses it: above every background key"""


def pixel_rays(
    res: int, pos=CAMERA_POS, lookat=CAMERA_LOOKAT, up=CAMERA_UP, fov_deg: float = CAMERA_FOV,
    rotation_deg: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> Tensor:  # fmt: skip
    """Unit world-frame ray `(res, res, 3)` through each pixel centre (row 0 at the top), as Genesis' camera sees;
    `rotation_deg` turns the camera about its own axes (`look.camera_rotation`)."""
    f = 0.5 * res / math.tan(math.radians(fov_deg) / 2)
    c = torch.arange(res, dtype=torch.float64) + 0.5 - res / 2
    row, col = torch.meshgrid(c, c, indexing="ij")
    cam = torch.stack([col / f, -row / f, -torch.ones_like(col)], -1)  # (H, W, 3) camera frame
    rays = cam @ camera_rotation(rotation_deg).T @ camera_frame(pos, lookat, up)
    return (rays / rays.norm(dim=-1, keepdim=True)).float()


def luma(color: tuple[float, float, float]) -> float:
    return sum(c * w for c, w in zip(color, LUMA))


def shade(albedo: Tensor, ndl: Tensor, ambient: float = AMBIENT, diffuse: float = DIFFUSE) -> Tensor:
    """Lambertian grey level in [0, 255] (float) of `albedo` under a normal at cosine `ndl` to the light."""
    return (albedo * (ambient + diffuse * ndl.clamp(min=0.0)) * 255.0).clamp(0.0, 255.0)


@dataclass(frozen=True)
class SceneGeometry:
    """What the ray caster draws, each primitive in the frame of the link that carries it (solver link indices)."""

    capsule_link: Tensor
    """(Kc,) long"""
    capsules: Tensor
    """(Kc, 7): segment ends a, b and radius"""
    capsule_albedo: Tensor
    """(Kc,)"""
    box_link: Tensor
    """(Kb,) long"""
    box_centre: Tensor
    """(Kb, 3)"""
    box_axes: Tensor
    """(Kb, 3, 3) columns"""
    box_half: Tensor
    """(Kb, 3)"""
    box_albedo: Tensor
    """(Kb,)"""
    table_size: tuple[float, float]
    table_albedo: float


def link_surface(link, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Points `(count, 3)` sampled by area from a Genesis link's visual meshes (link frame) and their albedo."""
    verts, faces, albedo, offset = [], [], [], 0
    for g in link.vgeoms:
        v = torch.as_tensor(g.init_vverts, dtype=torch.float32)
        rot = quat_to_matrix(torch.as_tensor(g.init_quat, dtype=torch.float32))
        verts.append(v @ rot.T + torch.as_tensor(g.init_pos, dtype=torch.float32))
        faces.append(torch.as_tensor(g.init_vfaces, dtype=torch.long) + offset)
        color = getattr(getattr(g.vmesh.surface, "diffuse_texture", None), "color", None) or (1.0, 1.0, 1.0)
        albedo.append(torch.full((len(faces[-1]),), luma(tuple(color)[:3])))
        offset += len(v)
    points, face = sample_surface(torch.cat(verts), torch.cat(faces), count, generator)
    return points, torch.cat(albedo)[face]


def fit_arm(arm, generator: torch.Generator) -> tuple[list, list]:
    """Capsules `[(link offset, (7,), albedo)]` and boxes `[(link offset, centre, axes, half, albedo)]` of one arm,
    link offsets counted from the arm's first link."""
    capsules, boxes = [], []
    for i, link in enumerate(arm.links):
        points, albedo = link_surface(link, SURFACE_SAMPLES, generator)
        if link.name in BOX_LINKS:
            boxes.append((i, *fit_box(points), float(albedo.mean())))
            continue
        caps, label = fit_capsules(points, CAPSULES_PER_LINK.get(link.name, 1))
        for j in range(len(caps)):
            own = albedo[label == j]
            capsules.append((i, caps[j], float(own.mean()) if len(own) else float(albedo.mean())))
    return capsules, boxes


def scene_geometry(bs) -> SceneGeometry:
    """Fit the primitives to a built `BimanualScene` (both arms share one fit: they load the same model)."""
    capsules, boxes = fit_arm(bs.arms[0], torch.Generator().manual_seed(0))
    starts = [arm.link_start for arm in bs.arms]
    extent = torch.tensor(bs.cfg.object_extent)
    box_rows = [(s + i, c, ax, h, al) for s in starts for i, c, ax, h, al in boxes]
    box_rows.append((bs.object_link, torch.zeros(3), torch.eye(3), 0.5 * extent, luma(OBJECT_COLOR)))
    return SceneGeometry(
        capsule_link=torch.tensor([s + i for s in starts for i, _, _ in capsules]),
        capsules=torch.stack([c for _ in starts for _, c, _ in capsules]),
        capsule_albedo=torch.tensor([a for _ in starts for _, _, a in capsules]),
        box_link=torch.tensor([r[0] for r in box_rows]),
        box_centre=torch.stack([r[1] for r in box_rows]),
        box_axes=torch.stack([r[2] for r in box_rows]),
        box_half=torch.stack([r[3] for r in box_rows]),
        box_albedo=torch.tensor([r[4] for r in box_rows]),
        table_size=tuple(bs.cfg.table_size),
        table_albedo=luma(bs.cfg.look.table_color),
    )


class RaycastCamera:
    """Batched renderer of `SceneGeometry` from the fixed camera: `(N, 1, res, res)` uint8 grey images."""

    name = "raycast"

    def __init__(
        self, geometry: SceneGeometry, res: int, tile: int = 4, device: str | torch.device = "cpu", threads: int = 1,
        look: CameraLook | None = None,
    ) -> None:  # fmt: skip
        """`tile`: side of the square pixel blocks culled together; `threads`: torch threads while rendering on a CPU
        (0: the process's setting). One by default: a frame is a few hundred small ops, and on a shared CPU each op
        waits for its slowest thread, which the scheduler may have set aside. `look`: the camera's pose, the light,
        the table and the clutter (training's by default)."""
        self.geo, self.res, self.device, self.threads = geometry, res, torch.device(device), threads
        self.look = look = look or CameraLook()
        dev = self.device
        pos, lookat = (tuple(a + b for a, b in zip(p, look.camera_shift)) for p in (CAMERA_POS, CAMERA_LOOKAT))
        self.origin = torch.tensor(pos, device=dev)
        self.light = torch.tensor(look.light, device=dev) / math.sqrt(sum(v * v for v in look.light))
        self.ambient, self.diffuse = look.ambient, look.diffuse
        rays = pixel_rays(res, pos, lookat, rotation_deg=look.camera_rotation_deg).to(dev)  # (H, W, 3)
        n_pix = res * res
        # Tiles of tile x tile pixels; the edge tiles of a side that `tile` does not divide are padded with a dummy
        # pixel (index n_pix) whose key is dropped at the end.
        side = -(-res // tile)
        r = torch.arange(side * tile, device=dev)
        row, col = rearrange(r, "(ty y) -> ty y", y=tile), rearrange(r, "(tx x) -> tx x", x=tile)
        pix = row[:, None, :, None] * res + col[None, :, None, :]  # (ty, tx, y, x)
        valid = (row[:, None, :, None] < res) & (col[None, :, None, :] < res)
        self.tile_pix = rearrange(torch.where(valid, pix, n_pix), "ty tx y x -> (ty tx) (y x)")  # (T, S)
        flat = torch.cat([rays.reshape(-1, 3), rays.reshape(-1, 3)[:1]])  # the dummy pixel repeats pixel 0's ray
        self.tile_rays = flat[self.tile_pix]  # (T, S, 3)
        centre = self.tile_rays.sum(1)
        self.tile_dir = centre / centre.norm(dim=-1, keepdim=True)  # (T, 3)
        cos = (self.tile_rays @ self.tile_dir[..., None])[..., 0].clamp(-1.0, 1.0)
        self.tile_angle = torch.acos(cos).amax(-1) + 1e-4  # (T,) cone half-angle around the centre ray
        # Link-frame primitives and their bounding-sphere radii.
        g = geometry
        self.cap_link, self.cap = g.capsule_link.to(dev), g.capsules.to(dev)
        self.cap_radius = 0.5 * (self.cap[:, 3:6] - self.cap[:, :3]).norm(dim=-1) + self.cap[:, 6]
        self.box_link, self.box_centre = g.box_link.to(dev), g.box_centre.to(dev)
        self.box_axes, self.box_half = g.box_axes.to(dev), g.box_half.to(dev)
        self.box_radius = self.box_half.norm(dim=-1)
        self.cap_albedo, self.box_albedo = g.capsule_albedo.to(dev), g.box_albedo.to(dev)
        self.cap_code = (self.cap_link + 1).clamp(max=255)  # payload of `render_links`: solver link index + 1
        self.box_code = (self.box_link + 1).clamp(max=255)
        self.background_luma, self.background_link = self._background(rays.reshape(-1, 3))

    def _background(self, rays: Tensor) -> tuple[Tensor, Tensor]:
        """Keys `(P + 1,)` of the static world per pixel: the table top within its extent (with the look's grain) and
        the look's clutter on it, the background beyond."""
        sx, sy = self.geo.table_size
        look = self.look
        t = -self.origin[2] / rays[:, 2].clamp(max=-1e-9)
        hit = self.origin[:2] + t[:, None] * rays[:, :2]
        table = (rays[:, 2] < 0) & (hit[:, 0].abs() <= sx / 2) & (hit[:, 1].abs() <= sy / 2)
        depth = torch.where(table, (t * DEPTH_STEPS).clamp(max=MISS - 1).int(), MISS) << 8
        albedo = self.geo.table_albedo * table_grain(hit, look.table_texture, look.clutter_seed)
        lit = shade(albedo, self.light[2].expand_as(albedo), self.ambient, self.diffuse)
        grey = torch.where(table, lit, look.background * 255.0)
        luma_key = depth | grey.round().int()
        link_key = depth  # payload 0: the table, the clutter and the background
        if look.clutter:
            centre, axes, half, box_albedo = (
                v.to(self.device) for v in clutter_boxes(look.clutter, look.clutter_seed, self.geo.table_size)
            )
            dirs = rays[None].expand(len(centre), -1, -1)
            t_box, ndl = ray_box(self.origin, dirs, centre, axes, half, self.light)  # (K, P)
            t_near, k = t_box.min(0)
            on_box = torch.isfinite(t_near)
            box_depth = (t_near * DEPTH_STEPS).clamp(max=MISS - 1).int() << 8
            box_grey = shade(box_albedo[k], ndl.gather(0, k[None])[0], self.ambient, self.diffuse).round().int()
            luma_key = torch.where(on_box, torch.minimum(luma_key, box_depth | box_grey), luma_key)
            link_key = torch.where(on_box, torch.minimum(link_key, box_depth), link_key)
        tail = torch.tensor([MISS << 8], dtype=torch.int32, device=self.device)
        return torch.cat([luma_key, tail]), torch.cat([link_key, tail])

    # ---------------------------------------------------------------------------------------------------- render
    @torch.no_grad()
    def render(self, links_pos: Tensor, links_quat: Tensor) -> Tensor:
        """`(N, 1, res, res)` uint8 grey images from every solver link's pose, `(N, L, 3)` and wxyz `(N, L, 4)`."""
        with self._threads():
            keys = self._cast(links_pos, links_quat, links=False)
        return keys.to(torch.uint8).reshape(-1, 1, self.res, self.res)  # the cast keeps the low 8 bits

    @torch.no_grad()
    def render_links(self, links_pos: Tensor, links_quat: Tensor) -> Tensor:
        """`(N, res, res)` long: the solver link each pixel shows, -1 for the table and the background."""
        with self._threads():
            keys = self._cast(links_pos, links_quat, links=True)
        return ((keys & 255).long() - 1).reshape(-1, self.res, self.res)

    @contextmanager
    def _threads(self):
        before = torch.get_num_threads()
        change = self.device.type == "cpu" and self.threads > 0 and self.threads != before
        if change:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if change:
                torch.set_num_threads(before)

    def _cast(self, links_pos: Tensor, links_quat: Tensor, links: bool) -> Tensor:
        """Nearest keys `(N, P)` over the static world, the capsules and the boxes."""
        pos, quat = links_pos.to(self.device, torch.float32), links_quat.to(self.device, torch.float32)
        n, n_pix = pos.shape[0], self.res * self.res
        rot_c = quat_to_matrix(quat[:, self.cap_link])  # (N, Kc, 3, 3)
        a = pos[:, self.cap_link] + (rot_c @ self.cap[:, :3, None])[..., 0]
        b = pos[:, self.cap_link] + (rot_c @ self.cap[:, 3:6, None])[..., 0]
        rot_b = quat_to_matrix(quat[:, self.box_link])
        centre = pos[:, self.box_link] + (rot_b @ self.box_centre[..., None])[..., 0]
        axes = rot_b @ self.box_axes  # (N, Kb, 3, 3)
        keys = (self.background_link if links else self.background_luma).repeat(n)
        stride = n_pix + 1

        t_i, n_i, k_i = self._pairs(0.5 * (a + b), self.cap_radius)
        if len(t_i):
            rays = self.tile_rays[t_i]
            t, ndl = ray_capsule(self.origin, rays, a[n_i, k_i], b[n_i, k_i], self.cap[k_i, 6], self.light)
            payload = self.cap_code[k_i][:, None] if links else self._shade(self.cap_albedo[k_i][:, None], ndl)
            self._scatter(keys, t, payload, n_i * stride, t_i)
        t_i, n_i, k_i = self._pairs(centre, self.box_radius)
        if len(t_i):
            t, ndl = ray_box(self.origin, self.tile_rays[t_i], centre[n_i, k_i], axes[n_i, k_i], self.box_half[k_i],
                             self.light)  # fmt: skip
            payload = self.box_code[k_i][:, None] if links else self._shade(self.box_albedo[k_i][:, None], ndl)
            self._scatter(keys, t, payload, n_i * stride, t_i)
        return keys.reshape(n, stride)[:, :n_pix]

    def _shade(self, albedo: Tensor, ndl: Tensor) -> Tensor:
        return shade(albedo, ndl, self.ambient, self.diffuse)

    def _pairs(self, centre: Tensor, radius: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(tile, env, primitive) index triples `(M,)` whose tile cone meets the bounding sphere `centre (N, K, 3)`,
        `radius (K,)`."""
        rel = centre - self.origin
        dist = rel.norm(dim=-1)  # (N, K)
        cos = torch.einsum("tc,nkc->tnk", self.tile_dir, rel / dist[..., None]).clamp(-1.0, 1.0)
        half = torch.asin((radius / dist).clamp(max=1.0))  # (N, K) angular radius of the sphere
        inside = dist <= radius  # the camera within the sphere: every tile
        near = (torch.acos(cos) <= self.tile_angle[:, None, None] + half) | inside
        return near.nonzero(as_tuple=True)

    def _scatter(self, keys: Tensor, t: Tensor, payload: Tensor, env_offset: Tensor, tile: Tensor) -> None:
        """Keep, per pixel, the smaller of its key and the hits' keys `(M, S)` (quantized depth, 8-bit payload)."""
        depth = (t * DEPTH_STEPS).clamp(max=MISS - 1).int()
        key = torch.where(torch.isfinite(t), (depth << 8) | payload.round().int(), NO_HIT)
        index = env_offset[:, None] + self.tile_pix[tile]
        keys.scatter_reduce_(0, index.reshape(-1), key.reshape(-1), "amin")
