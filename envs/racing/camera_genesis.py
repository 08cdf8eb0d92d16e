"""Genesis-rendered camera: the same `(N, 1, 120, 160)` uint8 frames, rasterized from a 3-D scene.

The scene (its own Genesis scene, render-only, so it works with either physics backend) holds the textured track
plane, barrier walls as one mesh, and clutter beyond the barriers (boxes and people-sized posts). Every frame the
camera takes one pose per env, the car pose composed with the calibrated mount (height, forward offset, pitch), and
renders one image per env (`VisOptions(split_envs=True)`). Rendering is
headless through EGL (Mesa on CPUs).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from envs.camera_model import CameraConfig
from envs.errors import ConfigError
from envs.genesis_import import GenesisConfig, import_genesis, init_genesis
from envs.racing.randomization import VisualSample
from envs.racing.track_texture import TrackScene

LUMA = torch.tensor([0.299, 0.587, 0.114])
_MSAA = {"samples": 4}


def _limit_msaa_samples() -> None:
    """Let `GenesisCamera` choose the multisample count of Genesis' offscreen framebuffers.

    Genesis' renderer always asks for min(GL_MAX_SAMPLES, 4) samples when it creates a camera's framebuffer (on the
    first render); answering that query with `_MSAA["samples"]` makes the count a setting. A software rasterizer
    shades every sample, so each sample adds to the render time of a 160x120 frame.
    """
    import_genesis()
    from genesis.ext.pyrender import renderer

    if getattr(renderer, "_gapbridge_msaa", False):
        return
    query = renderer.glGetIntegerv

    def get_integer(name, *args):
        value = query(name, *args)
        return min(int(value), _MSAA["samples"]) if name == renderer.GL_MAX_SAMPLES else value

    renderer.glGetIntegerv = get_integer
    renderer._gapbridge_msaa = True


def wall_mesh(scene: TrackScene) -> tuple[np.ndarray, np.ndarray]:
    """Vertices and faces of vertical barrier ribbons along both borders (offset by the scene's wall offset)."""
    left, right = scene.track.borders(extra=scene.cfg.wall_offset)
    h = scene.cfg.wall_height
    verts, faces = [], []
    for border in (left, right):
        n = len(border)
        base = len(verts)
        for p in border:
            verts += [(p[0], p[1], 0.0), (p[0], p[1], h)]
        for i in range(n):
            j = (i + 1) % n
            a, b, c, d = base + 2 * i, base + 2 * i + 1, base + 2 * j, base + 2 * j + 1
            faces += [(a, c, b), (b, c, d), (a, b, c), (b, d, c)]  # both sides visible
    return np.asarray(verts, dtype=np.float32), np.asarray(faces, dtype=np.int64)


FISHEYE_MAX_OFF_AXIS_DEG = 80.0
"""a pinhole render cannot see sideways: fisheye pixels further off axis than this stay black"""


def fisheye_render(cfg: CameraConfig, scale: float = 0.75) -> tuple[tuple[int, int], float, Tensor]:
    """The pinhole render behind an equidistant fisheye lens of `cfg.hfov_deg`: its resolution `(W, H)`, its vertical
    field of view (degrees), and the `(1, H, W, 2)` grid_sample coordinates that resample it into the fisheye frame.

    The render covers every fisheye pixel up to `FISHEYE_MAX_OFF_AXIS_DEG` off axis, corners included (the car's lens
    fills its frame), at `scale` times the fisheye's focal length at the image centre; the pinhole magnifies the
    periphery, so the edges are sampled finer than the centre."""
    w, h = cfg.width, cfg.height_px
    f_fish = (w / 2) / math.radians(cfg.hfov_deg / 2)
    xs = torch.arange(w, dtype=torch.float64) + 0.5 - w / 2
    ys = torch.arange(h, dtype=torch.float64) + 0.5 - h / 2
    px, py = torch.meshgrid(xs, ys, indexing="xy")
    r = torch.sqrt(px * px + py * py).clamp(min=1e-9)
    theta = r / f_fish
    visible = theta <= math.radians(FISHEYE_MAX_OFF_AXIS_DEG)
    t = torch.tan(theta.clamp(max=math.radians(FISHEYE_MAX_OFF_AXIS_DEG)))
    ux, uy = t * px / r, t * py / r  # pinhole image coordinates at unit focal length
    f_pin = scale * f_fish
    wp = 2 * math.ceil(f_pin * float(ux.abs().max()))
    hp = 2 * math.ceil(f_pin * float(uy.abs().max()))
    vfov = 2 * math.degrees(math.atan(hp / 2 / f_pin))
    gx = torch.where(visible, ux * f_pin / (wp / 2), torch.full_like(ux, 3.0))  # outside the render: black
    gy = torch.where(visible, uy * f_pin / (hp / 2), torch.full_like(uy, 3.0))
    return (wp, hp), vfov, torch.stack([gx, gy], -1).float().unsqueeze(0)


def mount_transform(cfg: CameraConfig, base_height: float = 0.0) -> np.ndarray:
    """4x4 pose of the camera in the frame of a car body `base_height` above the floor (OpenGL camera: looks along
    -z, +y up)."""
    p = math.radians(cfg.pitch_deg)
    x_cam = np.array([0.0, -1.0, 0.0])
    y_cam = np.array([math.sin(p), 0.0, math.cos(p)])
    z_cam = -np.array([math.cos(p), 0.0, -math.sin(p)])
    t = np.eye(4)
    t[:3, 0], t[:3, 1], t[:3, 2] = x_cam, y_cam, z_cam
    t[:3, 3] = (cfg.forward, 0.0, cfg.height - base_height)
    return t


class GenesisCamera:
    """Rasterized per-env camera (render-only Genesis scene)."""

    name = "genesis"

    def __init__(
        self,
        physics,
        scene: TrackScene,
        cfg: CameraConfig,
        device: str | torch.device = "cpu",
        genesis: GenesisConfig | None = None,
    ) -> None:
        self.device = torch.device(device)
        genesis = genesis or GenesisConfig()
        vfov = 2 * math.degrees(math.atan(math.tan(math.radians(cfg.hfov_deg) / 2) * cfg.height_px / cfg.width))
        res, self.warp = (cfg.width, cfg.height_px), None
        if cfg.lens == "fisheye":
            res, vfov, warp = fisheye_render(cfg, genesis.fisheye_scale)
            self.warp = warp.to(self.device)
            self.visible = (warp.abs() <= 1.0 + 1e-6).all(-1).unsqueeze(1).to(self.device)  # (1, 1, H, W)
        look = scene.cfg
        az, el = math.radians(look.light_azimuth_deg), math.radians(look.light_elevation_deg)
        light_dir = (-math.cos(el) * math.cos(az), -math.cos(el) * math.sin(az), -math.sin(el))
        self.cfg, self.track_scene = cfg, scene
        self.num_envs = physics.num_envs
        self.msaa_samples = genesis.msaa_samples
        gs = init_genesis(self.device, genesis)
        _limit_msaa_samples()
        self.gs = gs
        self.scene = gs.Scene(
            show_viewer=False,
            vis_options=gs.options.VisOptions(
                split_envs=True, shadow=False, plane_reflection=False, show_world_frame=False,
                background_color=(0.75, 0.75, 0.75), ambient_light=(look.ambient,) * 3,
                lights=[{"type": "directional", "dir": light_dir, "color": (1.0, 1.0, 1.0),
                         "intensity": 5.0 * look.light_intensity}],
            ),
            rigid_options=gs.options.RigidOptions(enable_collision=False, gravity=(0.0, 0.0, 0.0)),
        )  # fmt: skip
        center = scene.origin + scene.extent / 2
        self.scene.add_entity(
            gs.morphs.Plane(pos=(float(center[0]), float(center[1]), 0.0), plane_size=tuple(map(float, scene.extent)),
                            tile_size=tuple(map(float, scene.extent)), collision=False),
            surface=gs.surfaces.Default(diffuse_texture=gs.textures.ImageTexture(image_array=scene.rgb_image())),
        )  # fmt: skip
        # The meshes are written to a temporary folder that lives only until the scene is built (Genesis has read and
        # cached them by then), so nothing is left behind even when the process never calls `close`.
        tmp = tempfile.TemporaryDirectory(prefix="gapbridge-genesis-")
        tmp_dir = Path(tmp.name)
        import trimesh

        if scene.cfg.walls:
            verts, faces = wall_mesh(scene)
            mesh_path = tmp_dir / "walls.obj"
            trimesh.Trimesh(verts, faces, process=False).export(mesh_path)
            self.scene.add_entity(
                gs.morphs.Mesh(file=str(mesh_path), fixed=True, collision=False),
                surface=gs.surfaces.Default(color=(0.85, 0.85, 0.9)),
            )
        rng = np.random.default_rng(scene.cfg.room_seed)
        left, right = scene.track.borders(extra=scene.cfg.wall_offset + 0.6)
        candidates = np.concatenate([left, right])
        # Keep clutter clear of every part of the track (offset curves can cross the track in tight sections).
        seg = scene.track.nearest_segment(torch.as_tensor(candidates, dtype=torch.float32))
        dist = np.linalg.norm(candidates - scene.track.dense_np[seg.numpy()], axis=1)
        clear = candidates[dist > scene.track.half_width_np.max() + scene.cfg.wall_offset + 0.4]
        # Clutter as three meshes (light, mid, dark objects): few draw calls per env image.
        import trimesh

        groups: list[list] = [[], [], []]
        for i in range(min(look.clutter, len(clear))):
            p = clear[rng.integers(len(clear))]
            size = (rng.uniform(0.1, 0.4), rng.uniform(0.1, 0.4), rng.uniform(0.2, 1.7))  # up to people-sized
            box = trimesh.creation.box(extents=size)
            box.apply_translation((float(p[0]), float(p[1]), size[2] / 2))
            groups[i % 3].append(box)
        for shade, boxes in zip((0.85, 0.5, 0.2), groups):
            if not boxes:
                continue
            path = tmp_dir / f"clutter_{shade}.obj"
            trimesh.util.concatenate(boxes).export(path)
            self.scene.add_entity(
                gs.morphs.Mesh(file=str(path), fixed=True, collision=False),
                surface=gs.surfaces.Default(color=(shade, shade * 0.9, shade * 0.8)),
            )
        self.camera = self.scene.add_camera(res=res, fov=vfov, near=0.01, far=40.0, GUI=False)
        try:
            self.scene.build(n_envs=self.num_envs)
        except Exception as err:  # the rasterizer needs an OpenGL context
            tmp.cleanup()
            if "EGL" in str(err) or "OpenGL" in str(err) or "display" in str(err).lower():
                raise ConfigError(
                    "env.camera=genesis could not open an OpenGL context. Run headless with EGL: install libegl1 and "
                    "libgl1-mesa-dri (Debian/Ubuntu) and set PYOPENGL_PLATFORM=egl, or use env.camera=projective"
                ) from None
            raise
        tmp.cleanup()
        self.mount = torch.as_tensor(mount_transform(cfg), dtype=torch.float64)  # car frame on the floor -> camera

    @torch.no_grad()
    def render(self, x: Tensor, y: Tensor, yaw: Tensor, visuals: VisualSample) -> Tensor:
        """Frames `(N, 1, H, W)` uint8 from car poses `(N,)`; brightness randomization applies to the luma."""
        c, sn = torch.cos(yaw).double().cpu(), torch.sin(yaw).double().cpu()
        car = torch.zeros(x.shape[0], 4, 4, dtype=torch.float64)
        car[:, 0, 0], car[:, 0, 1], car[:, 1, 0], car[:, 1, 1] = c, -sn, sn, c
        car[:, 0, 3], car[:, 1, 3] = x.double().cpu(), y.double().cpu()
        car[:, 2, 2] = car[:, 3, 3] = 1.0
        self.camera.set_pose(transform=(car @ self.mount).numpy())
        _MSAA["samples"] = self.msaa_samples  # read when this camera's framebuffer is created (its first render)
        rgb = self.camera.render(rgb=True, force_render=True)[0]
        rgb = torch.as_tensor(np.ascontiguousarray(rgb), device=self.device).float()
        if rgb.dim() == 3:
            rgb = rgb.unsqueeze(0)
        luma = ((rgb @ LUMA.to(rgb.device)) * visuals.brightness.view(-1, 1, 1)).unsqueeze(1)
        if self.warp is not None:
            grid = self.warp.expand(luma.shape[0], -1, -1, -1)
            luma = torch.nn.functional.grid_sample(luma, grid, "bilinear", "border", align_corners=False)
            luma = luma * self.visible
        return luma.clamp_(0, 255).to(torch.uint8)

    def close(self) -> None:
        try:
            self.scene.destroy()
        except Exception:
            pass
