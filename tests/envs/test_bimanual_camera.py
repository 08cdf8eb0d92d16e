"""The two-arm camera's ray caster: rays and intersections by hand, the fits, culling against a brute-force cast, then
one small Genesis scene for the object's silhouette against Genesis' rasterizer and per-env isolation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from envs.bimanual.camera import DEPTH_STEPS, NO_HIT, RaycastCamera, SceneGeometry, pixel_rays, shade
from envs.bimanual.look import BACKGROUND, LIGHT
from envs.bimanual.primitives import fit_box, fit_capsule, fit_capsules, ray_box, ray_capsule, sample_surface
from envs.errors import ConfigError


def test_pixel_rays_by_hand():
    # looking straight down from (0, 0, 1) with +y up in the image: the camera frame is the world frame
    rays = pixel_rays(4, pos=(0.0, 0.0, 1.0), lookat=(0.0, 0.0, 0.0), up=(0.0, 1.0, 0.0), fov_deg=90.0)
    f = 2.0  # (res / 2) / tan(45°)
    corner = torch.tensor([-1.5 / f, 1.5 / f, -1.0])
    assert torch.allclose(rays[0, 0], corner / corner.norm(), atol=1e-6), "row 0 is the top (+y), column 0 the left"
    centre = rays[1:3, 1:3].mean((0, 1))  # four rays (±0.25, ±0.25, -1) / |.| around the optical axis
    assert torch.allclose(centre, torch.tensor([0.0, 0.0, -1.0 / math.sqrt(1.125)]), atol=1e-6)


def test_ray_capsule_by_hand():
    a, b, r = torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([0.5])
    light = torch.tensor([1.0, 0.0, 0.0])
    side = ray_capsule(torch.tensor([2.0, 0.0, 0.5]), torch.tensor([[[-1.0, 0.0, 0.0]]]), a, b, r, light)
    assert side[0].item() == pytest.approx(1.5) and side[1].item() == pytest.approx(1.0)  # normal +x
    # from above, down the axis: the cap around b, 3 - (1 + 0.5) away, normal +z
    top = ray_capsule(torch.tensor([0.0, 0.0, 3.0]), torch.tensor([[[0.0, 0.0, -1.0]]]), a, b, r, light)
    assert top[0].item() == pytest.approx(1.5) and top[1].item() == pytest.approx(0.0, abs=1e-6)
    # grazing the cap at 45°: hits the sphere around b at (0.5 cos 45°, 0, 1 + 0.5 sin 45°)
    s = 0.5 * math.sqrt(0.5)
    cap = ray_capsule(torch.tensor([2.0, 0.0, 1.0 + s]), torch.tensor([[[-1.0, 0.0, 0.0]]]), a, b, r, light)
    assert cap[0].item() == pytest.approx(2.0 - s, abs=1e-5) and cap[1].item() == pytest.approx(math.sqrt(0.5))
    miss = ray_capsule(torch.tensor([2.0, 0.6, 0.5]), torch.tensor([[[-1.0, 0.0, 0.0]]]), a, b, r, light)
    assert math.isinf(miss[0].item())


def test_ray_box_by_hand():
    quarter_z = torch.tensor([[[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])  # box x along world y
    centre, half = torch.zeros(1, 3), torch.tensor([[1.0, 0.5, 0.5]])
    light = torch.tensor([1.0, 0.0, 0.0])
    t, ndl = ray_box(torch.tensor([3.0, 0.0, 0.0]), torch.tensor([[[-1.0, 0.0, 0.0]]]), centre, quarter_z, half, light)
    assert t.item() == pytest.approx(2.5) and ndl.item() == pytest.approx(1.0)
    t, ndl = ray_box(torch.tensor([0.0, 3.0, 0.0]), torch.tensor([[[0.0, -1.0, 0.0]]]), centre, quarter_z, half, light)
    assert t.item() == pytest.approx(2.0) and ndl.item() == pytest.approx(0.0)
    t, _ = ray_box(torch.tensor([3.0, 0.0, 0.6]), torch.tensor([[[-1.0, 0.0, 0.0]]]), centre, quarter_z, half, light)
    assert math.isinf(t.item())


def capsule_surface(a: list[float], b: list[float], r: float, count: int, gen: torch.Generator) -> torch.Tensor:
    """Points on a capsule's surface, spread by area (side and caps)."""
    a_, b_ = torch.tensor(a), torch.tensor(b)
    axis = (b_ - a_) / (b_ - a_).norm()
    d = torch.randn(count, 3, generator=gen)
    d = d / d.norm(dim=-1, keepdim=True)
    length = float((b_ - a_).norm())
    side = torch.rand(count, generator=gen) < length / (length + 2 * r)  # side area 2πrL against the caps' 4πr²
    radial = d - (d @ axis)[:, None] * axis
    radial = radial / radial.norm(dim=-1, keepdim=True)
    on_side = a_ + torch.rand(count, 1, generator=gen) * (b_ - a_) + r * radial
    on_cap = torch.where((d @ axis)[:, None] > 0, b_, a_) + r * d
    return torch.where(side[:, None], on_side, on_cap)


def test_fits_recover_a_capsule_two_capsules_and_a_box():
    gen = torch.Generator().manual_seed(0)
    cap = fit_capsule(capsule_surface([0.1, 0.0, 0.0], [0.1, 0.0, 0.3], 0.05, 4000, gen))
    ends = sorted([cap[:3].tolist(), cap[3:6].tolist()], key=lambda p: p[2])
    assert torch.allclose(torch.tensor(ends), torch.tensor([[0.1, 0.0, 0.0], [0.1, 0.0, 0.3]]), atol=0.01)
    assert cap[6].item() == pytest.approx(0.05, abs=1e-3)
    # an L: a vertical and a horizontal capsule; each fitted capsule finds one of them
    ell = torch.cat([capsule_surface([0, 0, 0], [0, 0, 0.3], 0.04, 3000, gen),
                     capsule_surface([0.06, 0, 0.3], [0.3, 0, 0.3], 0.04, 3000, gen)])  # fmt: skip
    caps, label = fit_capsules(ell, 2)
    first = label[:3000].mode().values
    assert (label[:3000] == first).float().mean() > 0.9 and (label[3000:] != first).float().mean() > 0.9
    axes = caps[:, 3:6] - caps[:, :3]
    vertical = axes[first].abs().argmax()
    assert vertical == 2 and axes[1 - first].abs().argmax() == 0
    assert torch.allclose(caps[:, 6], torch.tensor([0.04, 0.04]), atol=0.005)
    # a box's 12 triangles
    corners = torch.tensor([[x, y, z] for x in (-0.2, 0.2) for y in (-0.05, 0.05) for z in (-0.1, 0.1)])
    faces = torch.tensor([[0, 1, 3], [0, 3, 2], [4, 6, 7], [4, 7, 5], [0, 4, 5], [0, 5, 1],
                          [2, 3, 7], [2, 7, 6], [0, 2, 6], [0, 6, 4], [1, 5, 7], [1, 7, 3]])  # fmt: skip
    points, _ = sample_surface(corners + torch.tensor([0.3, 0.0, 0.0]), faces, 4000, gen)
    centre, axes, half = fit_box(points, trim=0.0)
    assert torch.allclose(centre, torch.tensor([0.3, 0.0, 0.0]), atol=1e-3)
    assert torch.allclose(axes.abs(), torch.eye(3)[:, [0, 2, 1]], atol=0.02), "x, z, y: the largest spread first"
    assert torch.allclose(half, torch.tensor([0.2, 0.1, 0.05]), atol=3e-3)


def test_unknown_renderer_refused_by_field():
    from envs.bimanual.config import ObservationConfig
    from envs.bimanual.scene import SceneConfig
    from envs.errors import ConfigError

    assert SceneConfig().camera_renderer == "raycast" and ObservationConfig().camera_renderer == "raycast"
    with pytest.raises(ConfigError, match="scene.camera_renderer"):
        SceneConfig(camera_renderer="pyrender")
    with pytest.raises(ConfigError, match="observations.camera_renderer"):
        ObservationConfig(camera_renderer="pyrender")


# ------------------------------------------------------------------------------------ a scene without Genesis
def toy_geometry() -> SceneGeometry:
    """A capsule on link 1, a box on link 2 and the table; link 0 is the world."""
    return SceneGeometry(
        capsule_link=torch.tensor([1]), capsules=torch.tensor([[0.0, 0.0, -0.1, 0.0, 0.0, 0.1, 0.05]]),
        capsule_albedo=torch.tensor([0.9]), box_link=torch.tensor([2]), box_centre=torch.zeros(1, 3),
        box_axes=torch.eye(3)[None], box_half=torch.tensor([[0.15, 0.02, 0.02]]), box_albedo=torch.tensor([0.7]),
        table_size=(1.0, 0.8), table_albedo=0.46,
    )  # fmt: skip


def toy_poses(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    pos = torch.zeros(n, 3, 3)
    pos[:, 1] = torch.tensor([0.0, 0.0, 0.3]) + 0.2 * (torch.rand(n, 3, generator=gen) - 0.5)
    pos[:, 2] = torch.tensor([0.1, 0.0, 0.02]) + 0.1 * (torch.rand(n, 3, generator=gen) - 0.5)
    quat = torch.randn(n, 3, 4, generator=gen)
    quat[:, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    return pos, quat / quat.norm(dim=-1, keepdim=True)


def brute_force_links(cam: RaycastCamera, pos: torch.Tensor, quat: torch.Tensor) -> torch.Tensor:
    """`(N, H, W)` links by casting every pixel's ray at every primitive (no culling)."""
    from envs.bimanual.primitives import quat_to_matrix

    n = pos.shape[0]
    rays = pixel_rays(cam.res).reshape(1, -1, 3).expand(n, -1, -1)
    rot = quat_to_matrix(quat)
    a = pos[:, 1] + rot[:, 1] @ cam.cap[0, :3]
    b = pos[:, 1] + rot[:, 1] @ cam.cap[0, 3:6]
    t_cap, _ = ray_capsule(cam.origin, rays, a, b, cam.cap[:, 6].expand(n), cam.light)
    axes = rot[:, 2] @ cam.box_axes[0]
    t_box, _ = ray_box(cam.origin, rays, pos[:, 2], axes, cam.box_half.expand(n, -1), cam.light)
    background = (cam.background_link[:-1] >> 8).float() / DEPTH_STEPS
    depth = torch.stack([background.expand(n, -1), t_cap, t_box], -1)
    link = torch.tensor([-1, 1, 2])[depth.argmin(-1)]
    return link.reshape(n, cam.res, cam.res)


def test_raycast_frames_shape_range_culling_and_isolation():
    cam = RaycastCamera(toy_geometry(), 24, tile=5)  # 5 does not divide 24: padded edge tiles
    pos, quat = toy_poses(4)
    img = cam.render(pos, quat)
    assert img.shape == (4, 1, 24, 24) and img.dtype == torch.uint8
    links = cam.render_links(pos, quat)
    assert torch.equal(links, brute_force_links(cam, pos, quat)), "culling drops no hit"
    assert set(links.unique().tolist()) == {-1, 1, 2}
    light = torch.tensor(LIGHT) / torch.tensor(LIGHT).norm()
    table = shade(torch.tensor(0.46), light[2]).round()
    assert set(img[links[:, None] == -1].unique().tolist()) == {int(table), round(BACKGROUND * 255)}
    assert torch.equal(cam.render(pos, quat), img), "deterministic"
    assert torch.equal(RaycastCamera(toy_geometry(), 24, tile=8).render(pos, quat), img), "tiles change nothing"
    moved = pos.clone()
    moved[2, 1, 0] += 0.05
    after = cam.render(moved, quat)
    assert not torch.equal(after[2], img[2])
    assert torch.equal(after[[0, 1, 3]], img[[0, 1, 3]]), "only the moved env's frame changes"
    assert NO_HIT > int(cam.background_luma.max()), "a miss never covers the background"


# --------------------------------------------------------------------------------------------- Genesis scene
N = 3


@pytest.fixture(scope="module")
def genesis_scene():
    from envs.bimanual.camera import scene_geometry
    from envs.bimanual.scene import SceneConfig, build_scene

    # batch_dofs_info as in test_bimanual_scene: the same scene kind, so its compiled kernels serve here too
    bs = build_scene(SceneConfig(num_envs=N, batch_dofs_info=True, camera=True, camera_renderer="genesis"))
    yield bs, RaycastCamera(scene_geometry(bs), bs.cfg.camera_res)
    bs.close()


def object_poses(bs, pos: torch.Tensor, yaw: torch.Tensor) -> None:
    half = 0.5 * yaw
    zero = torch.zeros_like(half)
    bs.object.set_qpos(torch.cat([pos, torch.stack([half.cos(), zero, zero, half.sin()], -1)], -1))


@pytest.mark.genesis
def test_object_silhouette_matches_genesis(genesis_scene):
    """Both renderers see the same box through the same pinhole, so the background-difference masks (the object in
    place against it moved behind the camera) differ only at the edges. Genesis blends the pixels along a slanted
    edge with the table (its segmentation, unblended, matches the ray caster's silhouette pixel for pixel), so its
    mask grows by up to a pixel there: on a bar of ~80 pixels the perimeter costs up to ~0.17 of IoU (0.83-0.85
    measured for the slanted poses, 1.0 for the one aligned with the pixel grid). Hence 0.75."""
    bs, cam = genesis_scene
    h = bs.cfg.object_extent[2] / 2
    pos = torch.tensor([[0.0, 0.0, h], [0.08, -0.06, h], [-0.05, 0.04, 0.2]])
    yaw = torch.tensor([0.0, 0.5, -0.3])
    frames = {}
    for name, p in (("with", pos), ("without", torch.tensor([[0.0, -3.0, h]]).expand(N, -1))):
        object_poses(bs, p, yaw)
        frames[name] = (bs.render_gray(), cam.render(bs.solver.get_links_pos(), bs.solver.get_links_quat()))
    masks = [(a.int() - b.int()).abs()[:, 0] > 8 for a, b in zip(frames["with"], frames["without"])]
    inter = (masks[0] & masks[1]).flatten(1).sum(-1)
    union = (masks[0] | masks[1]).flatten(1).sum(-1)
    iou = inter / union
    assert (union > 40).all(), union
    assert (iou > 0.75).all(), iou
    assert iou[0] > 0.95, "aligned with the pixel grid, the silhouettes coincide"


@pytest.mark.genesis
def test_render_gray_through_the_ray_caster_moves_only_the_env_that_moved(genesis_scene):
    bs, cam = genesis_scene
    rc = replace(bs, raycaster=cam)  # the same scene, rendered by the ray caster
    object_poses(bs, torch.tensor([[0.0, 0.0, bs.cfg.object_extent[2] / 2]]).expand(N, -1), torch.zeros(N))
    before = rc.render_gray()
    assert before.shape == (N, 1, bs.cfg.camera_res, bs.cfg.camera_res) and before.dtype == torch.uint8
    assert before.float().std() > 10 and torch.equal(rc.render_gray(), before)
    q = bs.arms[0].get_qpos()
    try:
        bent = q.clone()
        bent[1, 1] += 0.4
        bs.arms[0].set_qpos(bent)
        after = rc.render_gray()
    finally:
        bs.arms[0].set_qpos(q)
    assert not torch.equal(after[1], before[1])
    assert torch.equal(after[[0, 2]], before[[0, 2]])


def test_look_jitter_draws_within_its_ranges_and_is_off_by_default():
    from envs.bimanual.look import TRAINING_JITTER, CameraLook, LookJitter

    g = torch.Generator().manual_seed(0)
    base, j = CameraLook(), TRAINING_JITTER
    looks = [j.draw(base, g) for _ in range(300)]
    assert max(abs(v) for look in looks for v in look.camera_shift) <= j.camera_shift
    assert max(abs(v) for look in looks for v in look.camera_rotation_deg) <= j.camera_rotation_deg
    assert all(j.ambient[0] <= look.ambient <= j.ambient[1] for look in looks)
    assert all(0 <= look.clutter <= j.clutter and look.light[2] == base.light[2] for look in looks)
    spread = torch.tensor([look.light_intensity for look in looks])
    assert spread.min() < 0.8 and spread.max() > 1.25, "the draws span the range"
    assert len({look.clutter_seed for look in looks}) > 250, "clutter stands elsewhere in each look"
    assert not LookJitter().active and j.active and not LookJitter(groups=8).active
    with pytest.raises(ConfigError, match="look_jitter.light_intensity"):
        LookJitter(light_intensity=(1.3, 0.7))


@pytest.mark.genesis
def test_jittered_looks_render_each_env_group_through_its_own_look(genesis_scene):
    from envs.bimanual.look import TRAINING_JITTER, LookJitter

    bs, cam = genesis_scene
    object_poses(bs, torch.tensor([[0.0, 0.0, bs.cfg.object_extent[2] / 2]]).expand(N, -1), torch.zeros(N))
    plain = replace(bs, raycaster=cam)
    jittered = replace(plain, cfg=replace(bs.cfg, look_jitter=replace(TRAINING_JITTER, groups=2)))
    jittered.redraw_looks(torch.Generator().manual_seed(1))
    assert len(jittered.looks) == 2 and jittered.looks[0].look != jittered.looks[1].look
    pos, quat = bs.solver.get_links_pos(), bs.solver.get_links_quat()
    image = jittered.render_gray()
    for k, caster in enumerate(jittered.looks):  # env i through look i mod 2
        assert torch.equal(image[k::2], caster.render(pos[k::2], quat[k::2]))
    assert not torch.equal(image, plain.render_gray()), "another look than the fixed one"
    first = [c.look for c in jittered.looks]
    jittered.redraw_looks(torch.Generator().manual_seed(2))
    assert [c.look for c in jittered.looks] != first, "a full reset draws new looks"
    off = replace(plain, cfg=replace(bs.cfg, look_jitter=LookJitter()))
    off.redraw_looks(torch.Generator().manual_seed(1))
    assert off.looks == [] and torch.equal(off.render_gray(), plain.render_gray())
