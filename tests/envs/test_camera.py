import math

import pytest
import torch

from envs.camera_model import CameraConfig, pixel_rays, project_point
from envs.racing.builtin_tracks import builtin_track
from envs.racing.camera import ProjectiveCamera
from envs.racing.env import RacingEnv
from envs.racing.randomization import NOMINAL_LUMA, RandomizationConfig, sample_visuals
from envs.racing.track_texture import SceneConfig, TrackScene
from tests.helpers import NO_RANDOMIZATION, small_env_config


@pytest.fixture(scope="module")
def oval_scene():
    return TrackScene(builtin_track("oval"), SceneConfig())


def nominal_visuals(n):
    return sample_visuals(NO_RANDOMIZATION, n, torch.Generator().manual_seed(0), torch.device("cpu"))


def test_shape_dtype_and_difference_between_poses(oval_scene):
    cam = ProjectiveCamera(oval_scene, CameraConfig())
    frames = cam.render(
        torch.tensor([0.0, 2.7]), torch.tensor([-1.2, 0.0]), torch.tensor([0.0, 1.57]), nominal_visuals(2)
    )
    assert frames.shape == (2, 1, 120, 160) and frames.dtype == torch.uint8
    assert (frames[0].float() - frames[1].float()).abs().mean() > 5


def test_border_line_appears_at_the_hand_computed_pixel(oval_scene):
    """Car on the bottom straight heading +x: the left border line (0.425 m left of the centerline, the middle of the
    5 cm line) seen 1.2 m ahead of the camera projects with the pinhole model to a computable pixel."""
    cfg = CameraConfig()  # height 0.10, forward 0.08, pitch 15 deg, hfov 120 deg, pinhole
    h, p, f = cfg.height, math.radians(cfg.pitch_deg), 80.0 / math.tan(math.radians(60.0))
    x_rel, y_rel = 1.2, 0.425  # ahead of the lens, left of the car
    depth = x_rel * math.cos(p) + h * math.sin(p)  # along the optical axis
    down = -x_rel * math.sin(p) + h * math.cos(p)  # image-down component
    col, row = 80.0 - f * y_rel / depth, 60.0 + f * down / depth
    assert (col, row) == pytest.approx(project_point(cfg, (cfg.forward + x_rel, y_rel, 0.0)), abs=1e-9)
    cam = ProjectiveCamera(oval_scene, cfg)
    frame = cam.render(torch.tensor([-1.3]), torch.tensor([-1.2]), torch.tensor([0.0]), nominal_visuals(1))[0, 0]
    r, c = int(row), int(round(col))
    on_line = frame[r, c - 1 : c + 2].float().max().item()
    asphalt = frame[r, c + 6].item()  # a few pixels toward the centre: asphalt
    assert on_line > 0.8 * NOMINAL_LUMA["line"]
    assert abs(asphalt - NOMINAL_LUMA["asphalt"]) < 10


def test_rays_point_forward_and_down_at_the_image_centre():
    rays = pixel_rays(CameraConfig())
    centre = rays[59:61, 79:81].mean(dim=(0, 1))
    assert math.degrees(math.atan2(-centre[2], centre[0])) == pytest.approx(15.0, abs=0.6)
    fish = pixel_rays(CameraConfig(lens="fisheye", hfov_deg=150.0))
    edge = fish[60, 0]
    assert math.degrees(math.atan2(edge[1], edge[0])) == pytest.approx(75.0 * 159 / 160, abs=1.0)


@pytest.mark.parametrize("hfov", [100.0, 120.0])
def test_genesis_fisheye_render_covers_the_frame_and_matches_the_projective_lens(hfov):
    """Every fisheye pixel samples inside the pinhole render (no black corners), along the ray the projective camera
    casts for the same pixel."""
    from envs.racing.camera_genesis import fisheye_render

    cfg = CameraConfig(lens="fisheye", hfov_deg=hfov, pitch_deg=0.0)
    (wp, hp), vfov, grid = fisheye_render(cfg, scale=0.75)
    assert grid.shape == (1, 120, 160, 2) and grid.abs().max() <= 1.0
    f_pin = (hp / 2) / math.tan(math.radians(vfov) / 2)
    assert f_pin == pytest.approx(0.75 * 80 / math.radians(hfov / 2), rel=1e-6)
    right, down = grid[0, ..., 0] * (wp / 2) / f_pin, grid[0, ..., 1] * (hp / 2) / f_pin
    ray = torch.stack([torch.ones_like(right), -right, -down], -1)  # car frame at zero pitch: x fwd, y left, z up
    ray = ray / ray.norm(dim=-1, keepdim=True)
    assert torch.allclose(ray, pixel_rays(cfg), atol=1e-4)
    assert (wp, hp) > (160, 120), "the pinhole sees the corners, so it is wider than the fisheye frame"


def test_walls_only_change_pixels_above_the_ground_horizon(oval_scene):
    no_walls = TrackScene(builtin_track("oval"), SceneConfig(walls=False))
    pose = (torch.tensor([0.0]), torch.tensor([-1.2]), torch.tensor([0.3]))
    a = ProjectiveCamera(oval_scene, CameraConfig()).render(*pose, nominal_visuals(1))[0, 0]
    b = ProjectiveCamera(no_walls, CameraConfig()).render(*pose, nominal_visuals(1))[0, 0]
    changed = (a != b).nonzero()
    assert len(changed) > 50
    assert (a[100:] == b[100:]).all(), "the near ground is never hidden by a barrier"


def test_visual_randomization_and_camera_latency():
    rnd = RandomizationConfig(**{**NO_RANDOMIZATION.__dict__, "visual": True})
    env = RacingEnv(small_env_config(num_envs=2, camera="projective", randomization=rnd))
    f = env.get_observations()["camera"].float()
    assert (f[0] - f[1]).abs().mean() > 1.0  # same pose, different colors
    # Camera latency: the frame shows the pose of `camera_latency` substeps ago.
    rnd = RandomizationConfig(**{**NO_RANDOMIZATION.__dict__, "nominal_camera_latency_ms": 4 * 1000 / 60})
    env = RacingEnv(small_env_config(num_envs=1, camera="projective", randomization=rnd))
    # 4 substeps of latency = one control frame: each frame shows the pose the car had one step earlier.
    state = env.physics.state
    start = previous = (state.x.clone(), state.y.clone(), state.yaw.clone())
    for _ in range(6):
        obs, *_ = env.step(torch.tensor([[5.0]]))
        assert torch.equal(obs["camera"], env.camera.render(*previous, env.visuals))
        state = env.physics.state
        previous = (state.x.clone(), state.y.clone(), state.yaw.clone())
    assert torch.hypot(state.x - start[0], state.y - start[1]).item() > 0.1, "the car has moved"
    now = env.physics.state
    current = env.camera.render(now.x, now.y, now.yaw, env.visuals)
    assert not torch.equal(obs["camera"], current)
