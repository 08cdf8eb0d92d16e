"""The two-arm Genesis scene: two Franka Panda arms facing each other across a table, one object between them.

The arms stand at x = -d (facing +x) and x = +d (facing -x), on the table top (z = 0); the object (a bar along x, or a
cube) rests at the table centre. The table top is the collision plane z = 0 (a half-space: nothing falls off it);
`table_size` sets the extent that a camera sees. The object's friction against the fingers is the larger of the two
geoms' frictions (Genesis takes the maximum of a contact pair), so both are set to the same value. Per-env physical
parameters (friction, object mass and centre of mass, arm gains) are written through the solver with `envs_idx`; arm
gains per env need `batch_dofs_info=True`, which every physics step pays for. The camera over the table renders
through Genesis' rasterizer (the Panda's visual meshes, one env after another) or through the batched ray caster of
`envs/bimanual/camera.py` (fitted primitives); `camera_renderer` picks one and `render_gray` dispatches. The first
build of a scene kind compiles kernels (tens of seconds, cached under ~/.cache); later builds take seconds.

The reality proxy's settings, all at training's values by default: the contacts' time constant, where arm 1's base
truly stands (`arm_base_shift`: its controller is told the nominal place), the wrist joints' torque limits, and the
camera's `look` (`envs/bimanual/look.py`). Both renderers draw the look's pose, light, table and clutter (the
rasterizer's clutter is visual-only boxes: no collision geometry, so the physics is untouched); `render_gray` then
passes either renderer's frame through the look's lens and sensor noise.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from envs.bimanual.camera import RaycastCamera, scene_geometry
from envs.bimanual.look import (
    AMBIENT,
    CAMERA_FOV,
    LIGHT,
    OBJECT_COLOR,
    CameraLook,
    LookJitter,
    camera_pose,
    clutter_boxes,
    distort,
    lens_grid,
    sensor_noise,
    table_grain,
)
from envs.errors import ConfigError, check_range
from envs.genesis_import import GenesisConfig, init_genesis

PANDA_XML = "xml/franka_emika_panda/panda.xml"
ARM_JOINTS = 7
ARM_KP = (4500.0, 4500.0, 3500.0, 3500.0, 2000.0, 2000.0, 2000.0)
"""joint stiffness of the arm position servos (N·m/rad), the values of panda.xml's actuators"""
ARM_KV = (450.0, 450.0, 350.0, 350.0, 200.0, 200.0, 200.0)
"""joint damping of the arm position servos (N·m·s/rad)"""
ARM_TORQUE = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)
"""joint torque limits (N·m)"""
WRIST_JOINTS = (4, 5, 6)
"""the wrist among the seven arm joints (joints 5 to 7)"""
HOME_QPOS = (0.0, -0.3, 0.0, -2.2, 0.0, 1.9, 0.785, 0.04, 0.04)
"""joint configuration at reset: hand above the table, pointing down, fingers open"""
TCP_OFFSET = (0.0, 0.0, 0.1034)
"""the tool centre point between the fingertip pads, in the hand frame (m)"""
LUMA = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class SceneConfig:
    """What a bimanual scene is built with; the per-env physical values here are the nominal ones."""

    num_envs: int = 16
    """the number of parallel environments"""
    arm_distance: float = 0.70
    """distance of each arm's base from the table centre (m)"""
    table_size: tuple[float, float] = (1.0, 0.8)
    """visible extent of the table top along x and y (m)"""
    object_kind: Literal["bar", "cube"] = "bar"
    """the object between the arms: a bar along x, or a cube"""
    object_size: tuple[float, float, float] = (0.30, 0.04, 0.04)
    """the object's extent along x, y, z (m); a cube uses the first value for all three"""
    object_mass: float = 0.3
    """the object's mass (kg)"""
    friction: float = 0.8
    """finger-object friction coefficient"""
    finger_force: float = -4.0
    """force on each finger joint while closed (N; negative closes)"""
    dt: float = 0.01
    """physics step (s)"""
    decimation: int = 5
    """physics steps per control step"""
    batch_dofs_info: bool = False
    """per-env joint parameters (PD gains); every physics step costs more with it"""
    camera: bool = False
    """add a camera that renders one grayscale image per env"""
    camera_res: int = 96
    """square camera image side (pixels)"""
    camera_renderer: Literal["genesis", "raycast"] = "raycast"
    """who renders the camera: 'raycast', the batched torch ray caster of fitted primitives (fast), or 'genesis',
    Genesis' rasterizer of the arms' visual meshes (a detailed look, one env after another)"""
    look: CameraLook = field(default_factory=CameraLook)
    """how the camera sees the cell (training's look by default)"""
    look_jitter: LookJitter = field(default_factory=LookJitter)
    """looks drawn around `look` per env group at each full reset (`redraw_looks`; the ray caster only); off by
    default"""
    contact_timeconst: float = 0.0
    """time constant of every contact's response (s); 0: Genesis' default"""
    arm_base_shift: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """where arm 1's base truly stands, relative to its nominal place (m)"""
    wrist_torque_scale: float = 1.0
    """the wrist joints' torque limits relative to `ARM_TORQUE`"""
    genesis: GenesisConfig = field(default_factory=GenesisConfig)
    """engine settings, fixed by the first Genesis scene of a process"""

    def __post_init__(self) -> None:
        check_range("scene.num_envs", self.num_envs, 1, 65536)
        check_range("scene.arm_distance", self.arm_distance, 0.4, 1.0)
        check_range("scene.object_mass", self.object_mass, 0.01, 5.0)
        check_range("scene.friction", self.friction, 0.05, 3.0)
        check_range("scene.finger_force", self.finger_force, -20.0, 0.0)
        check_range("scene.dt", self.dt, 1e-4, 0.02)
        check_range("scene.decimation", self.decimation, 1, 50)
        check_range("scene.camera_res", self.camera_res, 16, 512)
        if self.camera_renderer not in ("genesis", "raycast"):
            raise ConfigError(f"scene.camera_renderer={self.camera_renderer!r}; use 'genesis' or 'raycast'")
        if self.object_kind not in ("bar", "cube"):
            raise ConfigError(f"scene.object_kind={self.object_kind!r}; use 'bar' or 'cube'")
        check_range("scene.contact_timeconst", self.contact_timeconst, 0.0, 0.2)
        check_range("scene.wrist_torque_scale", self.wrist_torque_scale, 0.1, 1.0)
        if any(abs(v) > 0.1 for v in self.arm_base_shift):
            raise ConfigError(f"scene.arm_base_shift={self.arm_base_shift!r}; each component within 0.1 m")
        if any(not 0.01 <= s <= 0.6 for s in self.object_size):
            raise ConfigError(f"scene.object_size={self.object_size!r}; each side must be in [0.01, 0.6] m")

    @property
    def control_dt(self) -> float:
        """seconds per control step"""
        return self.dt * self.decimation

    @property
    def object_extent(self) -> tuple[float, float, float]:
        """the object's box size (m)"""
        s = self.object_size
        return (s[0], s[0], s[0]) if self.object_kind == "cube" else s


@dataclass
class BimanualScene:
    """A built scene and the indices the controller and the setters use. Arm 0 stands at -x, arm 1 at +x."""

    cfg: SceneConfig
    gs: object
    scene: object
    arms: tuple[object, object]
    object: object
    camera: object | None
    """the Genesis camera (`camera_renderer='genesis'`)"""
    raycaster: RaycastCamera | None
    """the ray caster (`camera_renderer='raycast'`)"""
    hands: tuple[object, object]
    arm_dofs: list[int]
    """local dof indices of the seven arm joints"""
    finger_dofs: list[int]
    """local dof indices of the two finger joints"""
    finger_geoms: list[int]
    """solver geom indices of both arms' finger links"""
    object_geoms: list[int]
    nominal_object_com: Tensor = field(repr=False)
    """(3,) the object's centre of mass in its link frame as built"""
    lens: Tensor | None = field(default=None, repr=False)
    """the look's lens sampling grid (None: a pinhole)"""
    looks: list[RaycastCamera] = field(default_factory=list, repr=False)
    """with `look_jitter` on: a ray caster per env group (env i renders through looks[i % len(looks)])"""

    @property
    def num_envs(self) -> int:
        return self.cfg.num_envs

    @property
    def solver(self):
        return self.scene.rigid_solver

    @property
    def object_link(self) -> int:
        return self.object.link_start

    # ------------------------------------------------------------------------------------- per-env physics
    def set_friction(self, friction: Tensor, envs_idx: Tensor) -> None:
        """Finger-object friction `(n,)` for the envs `envs_idx` `(n,)` (written on both sides of the pair)."""
        geoms = self.finger_geoms + self.object_geoms
        self.solver.set_geoms_friction_ratio(friction[:, None].expand(-1, len(geoms)), geoms, envs_idx=envs_idx)

    def friction(self) -> Tensor:
        """`(N,)` the object's friction per env."""
        return self.solver.get_geoms_friction_ratio(self.object_geoms[:1])[:, 0]

    def set_object_mass(self, mass: Tensor, envs_idx: Tensor) -> None:
        """Object mass `(n,)` kg, inertia scaled with it (the same shape made heavier)."""
        self.solver.set_links_mass(mass[:, None], [self.object_link], envs_idx=envs_idx, scale_inertia=True)

    def object_mass(self) -> Tensor:
        """`(N,)` the object's mass per env."""
        return self.solver.get_links_mass([self.object_link])[:, 0]

    def set_object_com_shift(self, shift: Tensor, envs_idx: Tensor) -> None:
        """Shift `(n, 3)` of the object's centre of mass from its built position, in the object frame (m)."""
        com = self.nominal_object_com.to(shift)[None] + shift
        self.solver.set_links_COM(com[:, None], [self.object_link], envs_idx=envs_idx)

    def object_com_shift(self) -> Tensor:
        """`(N, 3)` the object's centre-of-mass shift per env."""
        return self.solver.get_links_COM([self.object_link])[:, 0] - self.nominal_object_com

    def set_arm_gains(self, kp_scale: Tensor, kv_scale: Tensor, envs_idx: Tensor) -> None:
        """Scale `(n,)` both arms' joint stiffness and damping from their nominal values (needs batch_dofs_info)."""
        if not self.cfg.batch_dofs_info:
            raise ConfigError("per-env arm gains need scene.batch_dofs_info=True")
        kp, kv = torch.tensor(ARM_KP), torch.tensor(ARM_KV)
        for arm in self.arms:
            arm.set_dofs_kp(kp[None] * kp_scale[:, None], self.arm_dofs, envs_idx=envs_idx)
            arm.set_dofs_kv(kv[None] * kv_scale[:, None], self.arm_dofs, envs_idx=envs_idx)

    def arm_kp(self) -> Tensor:
        """`(N, 2, 7)` both arms' joint stiffness per env."""
        return torch.stack([arm.get_dofs_kp(self.arm_dofs) for arm in self.arms], 1)

    # ------------------------------------------------------------------------------------------------ state
    def reset(self, envs_idx: Tensor, object_pos: Tensor, object_yaw: Tensor) -> None:
        """Arms to the home configuration, at rest; the object to `(n, 3)` positions and `(n,)` yaws."""
        n = len(envs_idx)
        home = torch.tensor(HOME_QPOS).expand(n, -1)
        for arm in self.arms:
            arm.set_qpos(home, envs_idx=envs_idx, zero_velocity=True, skip_forward=True)
            arm.control_dofs_position(home[:, : len(self.arm_dofs)], self.arm_dofs, envs_idx=envs_idx)
        half = 0.5 * object_yaw
        zero = torch.zeros_like(half)
        quat = torch.stack([torch.cos(half), zero, zero, torch.sin(half)], -1)
        self.object.set_qpos(torch.cat([object_pos, quat], -1), envs_idx=envs_idx, zero_velocity=True)

    def render_gray(self, generator: torch.Generator | None = None) -> Tensor:
        """`(N, 1, H, W)` uint8 grayscale images, one per env, from the renderer of `cfg.camera_renderer`, through the
        look's lens and sensor (its noise drawn from `generator`)."""
        if self.looks:
            pos, quat = self.solver.get_links_pos(), self.solver.get_links_quat()
            image = torch.empty(self.num_envs, 1, self.cfg.camera_res, self.cfg.camera_res, dtype=torch.uint8)
            for k, caster in enumerate(self.looks):  # a few groups, each a batched render of its envs
                image[k :: len(self.looks)] = caster.render(pos[k :: len(self.looks)], quat[k :: len(self.looks)])
        elif self.raycaster is not None:
            image = self.raycaster.render(self.solver.get_links_pos(), self.solver.get_links_quat())
        elif self.camera is None:
            raise ConfigError("this scene has no camera; build it with scene.camera=True")
        else:
            rgb = torch.as_tensor(self.camera.render(rgb=True, force_render=True)[0]).float()
            if rgb.dim() == 3:
                rgb = rgb.unsqueeze(0)
            image = (rgb @ torch.tensor(LUMA)).round().clamp_(0, 255).to(torch.uint8).unsqueeze(1)
        if self.lens is not None:
            image = distort(image, self.lens)
        if self.cfg.look.noise > 0.0:
            image = sensor_noise(image, self.cfg.look.noise, generator)
        return image

    def redraw_looks(self, generator: torch.Generator) -> None:
        """Draw each env group's look anew from `look_jitter` around `look` (nothing without a jitter or a ray
        caster)."""
        jitter = self.cfg.look_jitter
        if self.raycaster is None or not jitter.active:
            return
        n = min(jitter.groups, self.num_envs)
        self.looks = [
            RaycastCamera(self.raycaster.geo, self.cfg.camera_res, device=self.raycaster.device,
                          look=jitter.draw(self.cfg.look, generator))
            for _ in range(n)
        ]  # fmt: skip

    def render_links(self) -> Tensor:
        """`(N, H, W)` long: the solver link each pixel shows (Genesis' segmentation, or the ray caster's), -1 for
        the background and the table."""
        if self.raycaster is not None:
            return self.raycaster.render_links(self.solver.get_links_pos(), self.solver.get_links_quat())
        if self.camera is None:
            raise ConfigError("this scene has no camera; build it with scene.camera=True")
        seg = torch.as_tensor(self.camera.render(rgb=False, segmentation=True, force_render=True)[2]).long()
        index = self.scene.segmentation_idx_dict  # segmentation index -> (entity, link), 0 -> background
        lookup = torch.full((max(index) + 1,), -1, dtype=torch.long)
        for idxc, key in index.items():
            if isinstance(key, tuple) and key[-1] > 0:  # link 0 is the table plane
                lookup[idxc] = key[-1]
        return lookup[seg].reshape(-1, *seg.shape[-2:])

    def close(self) -> None:
        try:
            self.scene.destroy()
        except Exception:
            pass


def object_mjcf(size: tuple[float, float, float], mass: float) -> str:
    """MJCF text of a free box of `size` (m) and `mass` (kg), its frame at its centre."""
    hx, hy, hz = (v / 2 for v in size)
    return (
        '<mujoco model="object"><worldbody><body name="object"><freejoint/>'
        f'<geom type="box" size="{hx} {hy} {hz}" mass="{mass}"/></body></worldbody></mujoco>\n'
    )


def joint_torque_limits(wrist_scale: float = 1.0) -> Tensor:
    """`(7,)` the arm joints' torque limits (N·m), the wrist's scaled by `wrist_scale`."""
    limits = torch.tensor(ARM_TORQUE)
    limits[list(WRIST_JOINTS)] *= wrist_scale
    return limits


def _vis_options(gs, look: CameraLook) -> dict:
    """The rasterizer's options: training's light unless the look changes it."""
    light = {}
    if look.light != LIGHT or look.light_intensity != 1.0:
        norm = sum(v * v for v in look.light) ** 0.5
        toward = tuple(-v / norm for v in look.light)  # Genesis takes the direction the light travels
        light = dict(lights=[dict(type="directional", dir=toward, color=(1.0, 1.0, 1.0),
                                  intensity=5.0 * look.light_intensity)])  # fmt: skip
    ambient = min(1.0, 0.4 * (look.ambient / AMBIENT))
    return dict(
        vis_options=gs.options.VisOptions(
            split_envs=True, shadow=False, plane_reflection=False, show_world_frame=False,
            background_color=(look.background,) * 3, ambient_light=(ambient,) * 3, **light,
        )
    )  # fmt: skip


def _table_surface(gs, cfg: SceneConfig):
    """The table's surface: its colour, with the look's grain as a texture that covers the plane once."""
    look = cfg.look
    if look.table_texture == 0.0:
        return gs.surfaces.Default(color=look.table_color)
    sx, sy = cfg.table_size
    h, w = round(sy * 400), round(sx * 400)
    y = (0.5 - (torch.arange(h) + 0.5) / h) * sy  # image row 0 is +y
    x = ((torch.arange(w) + 0.5) / w - 0.5) * sx
    xy = torch.stack(torch.meshgrid(x, y, indexing="xy"), -1)  # (h, w, 2)
    grain = table_grain(xy, look.table_texture, look.clutter_seed)[..., None] * torch.tensor(look.table_color)
    image = (grain.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).numpy()
    return gs.surfaces.Default(diffuse_texture=gs.textures.ImageTexture(image_array=image, encoding="linear"))


def _add_clutter(gs, scene, cfg: SceneConfig) -> None:
    """The look's clutter as fixed, visual-only boxes (no collision geometry: the physics never meets them)."""
    centre, axes, half, albedo = clutter_boxes(cfg.look.clutter, cfg.look.clutter_seed, cfg.table_size)
    for c, ax, h, a in zip(centre.tolist(), axes, half.tolist(), albedo.tolist()):
        yaw = float(torch.atan2(ax[1, 0], ax[0, 0]))
        quat = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
        scene.add_entity(
            gs.morphs.Box(pos=tuple(c), quat=quat, size=tuple(2 * v for v in h), fixed=True, collision=False),
            surface=gs.surfaces.Default(color=(a, a, a)),
        )


def build_scene(cfg: SceneConfig, device: torch.device | str = "cpu") -> BimanualScene:
    """Build the Genesis scene for `cfg.num_envs` envs, with the nominal friction, mass and gains everywhere."""
    gs = init_genesis(torch.device(device), cfg.genesis)
    rasterized = cfg.camera and cfg.camera_renderer == "genesis"
    contact = {"constraint_timeconst": cfg.contact_timeconst} if cfg.contact_timeconst > 0.0 else {}
    scene = gs.Scene(
        sim_options=gs.options.SimOptions(dt=cfg.dt, substeps=1),
        rigid_options=gs.options.RigidOptions(
            enable_self_collision=False, batch_links_info=True, batch_dofs_info=cfg.batch_dofs_info, **contact,
        ),
        show_viewer=False,
        **(_vis_options(gs, cfg.look) if rasterized else {}),
    )  # fmt: skip
    sx, sy = cfg.table_size
    scene.add_entity(
        gs.morphs.Plane(plane_size=(sx, sy), tile_size=(sx, sy)),
        material=gs.materials.Rigid(friction=0.5),
        surface=_table_surface(gs, cfg),
    )
    d, shift = cfg.arm_distance, cfg.arm_base_shift
    bases = (((-d, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0)), ((d + shift[0], shift[1], shift[2]), (0.0, 0.0, 0.0, 1.0)))
    arms = tuple(
        scene.add_entity(gs.morphs.MJCF(file=PANDA_XML, pos=pos, quat=quat), material=gs.materials.Rigid(friction=1.0))
        for pos, quat in bases
    )
    size = cfg.object_extent
    # From a file, not a primitive morph, and unaligned: only then can its centre of mass be moved per env.
    with tempfile.TemporaryDirectory(prefix="gapbridge-bimanual-") as tmp:
        path = Path(tmp) / "object.xml"
        path.write_text(object_mjcf(size, cfg.object_mass))
        obj = scene.add_entity(
            gs.morphs.MJCF(file=str(path), pos=(0.0, 0.0, size[2] / 2), align=False),
            material=gs.materials.Rigid(friction=1.0),
            surface=gs.surfaces.Default(color=OBJECT_COLOR),
        )
    camera = None
    if rasterized:
        if cfg.look.clutter:
            _add_clutter(gs, scene, cfg)
        pos, lookat, up = camera_pose(cfg.look)
        pose = dict(pos=pos, lookat=lookat, up=up, fov=CAMERA_FOV)
        camera = scene.add_camera(res=(cfg.camera_res, cfg.camera_res), **pose, GUI=False)
    scene.build(n_envs=cfg.num_envs)

    arm_dofs = [arms[0].get_joint(f"joint{i + 1}").dofs_idx_local[0] for i in range(ARM_JOINTS)]
    finger_dofs = [arms[0].get_joint(f"finger_joint{i + 1}").dofs_idx_local[0] for i in range(2)]
    torque = joint_torque_limits(cfg.wrist_torque_scale)
    for arm in arms:
        arm.set_dofs_kp(torch.tensor(ARM_KP), arm_dofs)
        arm.set_dofs_kv(torch.tensor(ARM_KV), arm_dofs)
        arm.set_dofs_force_range(-torque, torque, arm_dofs)
    finger_links = [arm.get_link(name) for arm in arms for name in ("left_finger", "right_finger")]
    bs = BimanualScene(
        cfg=cfg, gs=gs, scene=scene, arms=arms, object=obj, camera=camera, raycaster=None,
        hands=(arms[0].get_link("hand"), arms[1].get_link("hand")),
        arm_dofs=arm_dofs, finger_dofs=finger_dofs,
        finger_geoms=[g for link in finger_links for g in range(link.geom_start, link.geom_end)],
        object_geoms=list(range(obj.geom_start, obj.geom_end)),
        nominal_object_com=scene.rigid_solver.get_links_COM([obj.link_start])[0, 0].clone(),
    )  # fmt: skip
    if cfg.camera and not rasterized:
        bs.raycaster = RaycastCamera(scene_geometry(bs), cfg.camera_res, device=device, look=cfg.look)
    if cfg.camera and cfg.look.distortion != 0.0:
        bs.lens = lens_grid(cfg.camera_res, cfg.look.distortion)
    everyone = torch.arange(cfg.num_envs)
    bs.set_friction(torch.full((cfg.num_envs,), cfg.friction), everyone)
    bs.set_object_mass(torch.full((cfg.num_envs,), cfg.object_mass), everyone)
    bs.reset(everyone, torch.tensor([[0.0, 0.0, size[2] / 2]]).expand(cfg.num_envs, -1), torch.zeros(cfg.num_envs))
    return bs
