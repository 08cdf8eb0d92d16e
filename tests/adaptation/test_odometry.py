import math

import pytest
import torch

from adaptation.odometry import OdometryConfig, PlanarOdometry, gaussian_blur, pose_change, track_episodes
from envs.camera_model import CameraConfig
from envs.errors import ConfigError
from envs.racing.builtin_tracks import builtin_track
from envs.racing.camera import ProjectiveCamera
from envs.racing.randomization import sample_visuals
from envs.racing.track_texture import SceneConfig, TrackScene
from tests.helpers import NO_RANDOMIZATION

TRACK = builtin_track("oval")


@pytest.fixture(scope="module")
def scene():
    return TrackScene(TRACK, SceneConfig())


def render(camera, poses):
    """Frames of car poses `(B, 3)` (x, y, yaw of the centre of gravity)."""
    vis = sample_visuals(NO_RANDOMIZATION, len(poses), torch.Generator().manual_seed(0), torch.device("cpu"))
    return camera.render(poses[:, 0], poses[:, 1], poses[:, 2], vis)


def moved(poses, motion):
    """Poses after `motion` `(B, 3)` (forward, left, yaw change in each pose's own frame)."""
    c, s = torch.cos(poses[:, 2]), torch.sin(poses[:, 2])
    return torch.stack(
        [
            poses[:, 0] + c * motion[:, 0] - s * motion[:, 1],
            poses[:, 1] + s * motion[:, 0] + c * motion[:, 1],
            poses[:, 2] + motion[:, 2],
        ],
        -1,
    )


def centreline_poses(s):
    xy, heading, _ = TRACK.interpolate(torch.as_tensor(s, dtype=torch.float32))
    return torch.cat([xy, heading[:, None]], -1)


@pytest.mark.parametrize("lens", ["pinhole", "fisheye"])
def test_recovers_a_known_motion_between_two_rendered_frames(scene, lens):
    """On straights, in the bend and half-way across the lane, a motion of up to 0.15 m and 0.2 rad per frame
    (2.25 m/s at 3 rad/s) is recovered to 2.5 mm and 6 mrad from a last estimate 1-2 cm and 0.05 rad off. In the
    tightest case (0.2 rad per frame) the frames match better a few mm further on than at the true motion (a lower
    alignment cost): it is held to 1 cm, and to a match at least as good as the true motion's."""
    optics = CameraConfig(lens=lens)
    camera = ProjectiveCamera(scene, optics)
    start = centreline_poses([0.3, 2.0, 4.5, 6.0])
    start[3, :2] += torch.tensor([0.0, 0.12])  # off the centreline
    truth = torch.tensor([[0.12, 0.004, 0.0], [0.15, -0.006, 0.2], [0.08, 0.01, -0.1], [0.1, 0.0, 0.05]])
    before, after = render(camera, start), render(camera, moved(start, truth))
    last = truth + torch.tensor([0.015, -0.01, 0.05])
    odometry = PlanarOdometry(optics)
    est = odometry.step(before, after, last)
    err = (est - truth).abs()
    easy = [0, 2, 3]
    assert err[easy, :2].max() < 2.5e-3 and err[easy, 2].max() < 6e-3, err
    assert err[1, :2].max() < 1e-2 and err[1, 2] < 6e-3, err
    cost_est, cost_truth = (odometry.alignment_cost(before.float(), after.float(), m)[1] for m in (est, truth))
    assert cost_est <= cost_truth + 1e-3
    # A still car: zero motion, from a last estimate of zero.
    still = odometry.step(before, before, torch.zeros(4, 3))
    assert still.abs().max() < 1e-3


def test_a_start_ahead_recovers_a_motion_the_last_estimate_is_far_short_of(scene):
    """A last estimate 8 cm short of the true forward motion (a hard acceleration, or a lock lost the frame before):
    refined from it alone, the blurred stage settles 2-7 cm short; with a second start 6 cm ahead the best-matching
    result is within 1 cm, and its alignment cost is never above the single start's."""
    optics = CameraConfig()
    camera = ProjectiveCamera(scene, optics)
    start = centreline_poses([0.3, 1.0, 2.0, 3.0, 4.5, 6.0])
    truth = torch.tensor([[0.16, 0.004, 0.0], [0.15, 0.0, 0.0], [0.18, -0.006, 0.1], [0.19, 0.0, 0.02],
                          [0.14, 0.01, -0.1], [0.17, 0.0, 0.05]])  # fmt: skip
    before, after = render(camera, start), render(camera, moved(start, truth))
    last = truth - torch.tensor([0.08, 0.0, 0.0])
    single = PlanarOdometry(optics, OdometryConfig(forward_starts=(0.0,)))
    two = PlanarOdometry(optics, OdometryConfig(forward_starts=(0.0, 0.06)))
    one_est, two_est = single.step(before, after, last), two.step(before, after, last)
    assert (one_est - truth)[:, 0].abs().max() > 0.02  # the failure the second start is there for
    assert (two_est - truth)[:, 0].abs().max() < 0.01, two_est - truth
    cost_one = two.alignment_cost(before.float(), after.float(), one_est)
    cost_two = two.alignment_cost(before.float(), after.float(), two_est)
    assert (cost_two <= cost_one + 1e-4).all()


def test_pose_change_is_the_motion_that_moved_the_pose():
    torch.manual_seed(0)
    poses = torch.rand(64, 3) * torch.tensor([10.0, 10.0, 2 * math.pi]) - torch.tensor([5.0, 5.0, math.pi])
    motion = (torch.rand(64, 3) - 0.5) * torch.tensor([0.4, 0.1, 0.6])
    after = moved(poses, motion)
    after[:, 2] = torch.remainder(after[:, 2] + math.pi, 2 * math.pi) - math.pi  # yaw wrapped: the change is not
    assert torch.allclose(pose_change(poses, after), motion, atol=1e-5)
    assert torch.allclose(pose_change(poses, poses), torch.zeros(64, 3))


def test_body_velocity_takes_the_mid_interval_heading():
    """A car on a circle (speed v, yaw rate w) moves along a chord: the body velocity at mid-interval is the chord
    length over dt straight ahead, with no lateral part; a sideways slide shows as lateral speed."""
    v, w, dt = 2.0, 3.0, 1 / 15
    r = v / w
    chord = torch.tensor([[r * math.sin(w * dt), r * (1 - math.cos(w * dt)), w * dt]])
    vel = PlanarOdometry.body_velocity(chord, dt)[0]
    assert vel[1].abs() < 1e-6 and vel[2] == pytest.approx(w)
    assert vel[0] == pytest.approx(2 * r * math.sin(w * dt / 2) / dt, rel=1e-6)
    slide = PlanarOdometry.body_velocity(torch.tensor([[0.1, 0.005, 0.0]]), dt)[0]
    assert slide.tolist() == pytest.approx([1.5, 0.075, 0.0])


def test_tracks_episodes_from_rest_in_any_row_order(scene):
    """Two cars accelerating from rest along the centreline (one in the bend, one turning into it), recorded
    as one episode each: the tracked velocities follow the truth (median errors 1-2 cm/s forward, 3-4 mm/s
    sideways, about 0.02 rad/s in yaw; a few frames are off by up to 0.2 m/s), and shuffling the episodes' rows
    (each in step order) changes nothing."""
    optics, dt, steps = CameraConfig(), 1 / 15, 24
    camera = ProjectiveCamera(scene, optics)
    t = torch.arange(steps) * dt
    s = 0.5 * 3.0 * t.clamp(max=0.6) ** 2 + 3.0 * 0.6 * (t - 0.6).clamp(min=0)  # 3 m/s^2 to 1.8 m/s, then steady
    starts = torch.tensor([1.5, 3.4])
    poses = torch.stack([centreline_poses(s0 + s) for s0 in starts])  # (2, T, 3)
    frames = render(camera, poses.reshape(-1, 3))
    episode = torch.arange(2).repeat_interleave(steps) + 7
    step = torch.arange(steps).repeat(2)
    odometry = PlanarOdometry(optics)
    vel = track_episodes(odometry, frames, episode, step, dt, chunk=1).reshape(2, steps, 3)
    d = poses[:, 1:, :2] - poses[:, :-1, :2]
    c, sn = torch.cos(poses[:, :-1, 2]), torch.sin(poses[:, :-1, 2])
    yaw = torch.remainder(poses[:, 1:, 2] - poses[:, :-1, 2] + math.pi, 2 * math.pi) - math.pi
    rel = torch.stack([c * d[..., 0] + sn * d[..., 1], -sn * d[..., 0] + c * d[..., 1], yaw], -1)
    truth = PlanarOdometry.body_velocity(rel, dt)
    assert vel[:, 0].abs().max() == 0  # no frame before the first
    err = (vel[:, 1:] - truth).abs()
    median = err.flatten(0, 1).median(0).values
    assert median[0] < 0.03 and median[1] < 0.01 and median[2] < 0.05, median
    assert err[..., 0].max() < 0.3, err.amax((0, 1))  # never off by a dash period (0.3 m per frame: 4.5 m/s)
    assert truth[..., 2].abs().max() > 1.0  # the bend is in the test
    perm = torch.cat([torch.arange(steps, 2 * steps), torch.arange(steps)])  # the second episode first
    again = track_episodes(odometry, frames[perm], episode[perm], step[perm], dt, chunk=2)
    assert torch.allclose(again, vel.reshape(-1, 3)[perm], atol=1e-5)


def test_online_tracker_matches_the_recorded_episodes_tracking_across_a_reset(scene):
    """Two cars one frame per step: car 0 drives one episode, car 1 ends its episode after 8 frames and starts
    the same drive again. Each step's velocities equal `track_episodes` on the recorded episodes; the first frame
    of each episode reads zeros, not measured."""
    from adaptation.odometry import OdometryTracker

    optics, dt, steps, cut = CameraConfig(), 1 / 15, 14, 8
    camera = ProjectiveCamera(scene, optics)
    s = 1.8 * torch.arange(steps) * dt
    poses = torch.stack([centreline_poses(s0 + s) for s0 in (1.5, 3.4)])
    frames = render(camera, poses.reshape(-1, 3)).reshape(2, steps, 1, *render(camera, poses[0, :1]).shape[2:])
    odometry = PlanarOdometry(optics)
    episode, step = torch.arange(2).repeat_interleave(steps), torch.arange(steps).repeat(2)
    recorded = track_episodes(odometry, frames.flatten(0, 1), episode, step, dt).reshape(2, steps, 3)
    tracker = OdometryTracker(odometry, dt, 2)
    got, measured = [], []
    for t in range(steps + cut):
        cur = torch.stack([frames[0, min(t, steps - 1)], frames[1, t if t < cut else t - cut]])
        got.append(tracker.update(cur))
        measured.append(tracker.measured.clone())
        if t == cut - 1:
            tracker.reset(torch.tensor([False, True]))
    got, measured = torch.stack(got, 1), torch.stack(measured, 1)
    assert torch.allclose(got[0, :steps], recorded[0], atol=1e-5)
    assert torch.allclose(got[1, :cut], recorded[1, :cut], atol=1e-5)
    assert torch.allclose(got[1, cut:], recorded[1, :steps], atol=1e-5), "the new episode tracked from rest again"
    assert measured[0, 1:].all() and not measured[0, 0]
    assert measured[1].tolist() == [t not in (0, cut) for t in range(steps + cut)]
    assert recorded[:, 1:, 0].min() > 1.0, "the cars move"
    tracker.resize(3)
    assert tracker.update(frames[:, 0].repeat(2, 1, 1, 1)[:3]).abs().max() == 0 and not tracker.measured.any()


def test_blur_keeps_a_flat_image_and_the_mean():
    img = torch.rand(2, 1, 20, 30) * 255
    assert torch.equal(gaussian_blur(img, 0.0), img)
    flat = torch.full((1, 1, 9, 9), 40.0)
    assert torch.allclose(gaussian_blur(flat, 1.5), flat)
    assert gaussian_blur(img, 1.0).mean().item() == pytest.approx(img.mean().item(), rel=0.02)


def test_bad_configurations_are_refused():
    with pytest.raises(ConfigError, match="odometry.ground_range"):
        OdometryConfig(ground_range=0.0)
    with pytest.raises(ConfigError, match="odometry.blur"):
        OdometryConfig(blur=())
    with pytest.raises(ConfigError, match="odometry.forward_starts"):
        OdometryConfig(forward_starts=())
    with pytest.raises(ConfigError, match="odometry.forward_starts"):
        OdometryConfig(forward_starts=(0.0, 0.8))
    with pytest.raises(ConfigError, match="pixels see the ground"):
        PlanarOdometry(CameraConfig(pitch_deg=-40.0, hfov_deg=30.0), OdometryConfig(ground_range=0.2))


def test_probe_odometry_scores_both_trackers_against_the_camera_pose_change(tmp_path):
    """Four pure-pursuit cars on the default camera env: the frames' true motion is zero at each episode's first
    frame and a car's speed elsewhere; both trackers are scored on the same frames and the configured one measures
    the speed and yaw rate well (R² > 0.8 and > 0.95 on this deterministic drive)."""
    import json

    from experiments.research.probe_odometry import ProbeOdometryConfig, drive, main

    cfg = ProbeOdometryConfig(envs=4, steps=24, after_steps=4, out_dir=str(tmp_path))
    rows, env_cfg = drive(cfg)
    assert rows.camera.shape == (4 * 24, 1, env_cfg.optics.height_px, env_cfg.optics.width)
    assert rows.camera.dtype == torch.uint8
    assert torch.equal(rows.truth[rows.step == 0], torch.zeros(int((rows.step == 0).sum()), 3))
    assert rows.truth[rows.step > 5, 0].min() > 0.2  # racing forward
    assert torch.all(rows.episode[1:] >= rows.episode[:-1])  # each car's rows together, in step order
    result = main(cfg)
    assert json.loads((tmp_path / "probe_odometry.json").read_text()) == result
    assert set(result["trackers"]) == {"single start", "configured"}
    assert result["rows_scored"] == int((rows.step >= 4).sum())
    configured = result["trackers"]["configured"]
    assert configured["speed"]["r2"] > 0.8 and configured["yaw_rate"]["r2"] > 0.95, configured
    assert configured["speed"]["abs_q50"] <= configured["speed"]["abs_q90"] <= configured["speed"]["abs_q99"]


@pytest.mark.parametrize("lens", ["pinhole", "fisheye"])
def test_closed_form_jacobian_matches_finite_differences(scene, lens):
    """The refinement's Jacobian (the geometry's derivative in closed form times the image's slope) is the finite
    difference of the sampled previous image along forward, left and yaw, on a lightly blurred rendered frame; a wrong
    sign or a dropped term in either lens's derivative shows as a low correlation or a scale off 1."""
    optics = CameraConfig(lens=lens)
    odometry = PlanarOdometry(optics)
    prev = gaussian_blur(render(ProjectiveCamera(scene, optics), centreline_poses([0.3, 2.0, 4.5])).float(), 1.0)
    motion = torch.tensor([[0.12, 0.004, 0.05], [0.15, -0.006, 0.2], [0.08, 0.01, -0.1]])
    val, ok, jac = odometry._ground_with_jacobian(prev, motion)
    base, base_ok = odometry._ground_in_previous(prev, motion)
    assert torch.equal(ok, base_ok) and torch.allclose(val, base, atol=1e-3)
    eps = 1e-3
    for i in range(3):
        step = eps * torch.eye(3)[i]
        fd = (
            odometry._ground_in_previous(prev, motion + step)[0] - odometry._ground_in_previous(prev, motion - step)[0]
        ) / (2 * eps)
        a, b = jac[..., i][ok], fd[ok]
        corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        scale = float((a * b).sum() / (b * b).sum())
        assert corr > 0.98 and abs(scale - 1.0) < 0.05, (lens, i, corr, scale)
