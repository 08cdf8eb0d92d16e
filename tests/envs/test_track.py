import math

import numpy as np
import pytest
import torch

from envs.errors import TrackFileError
from envs.racing.builtin_tracks import BUILTIN_TRACKS, builtin_track, load_track
from envs.racing.track import GRAVITY, Track


@pytest.fixture(scope="module")
def oval():
    # Straight 3 m, radius 1.2 m, centred: the bottom straight runs +x along y = -1.2 from x = -1.5 to 1.5.
    return builtin_track("oval")


def test_oval_length_and_width(oval):
    assert oval.length == pytest.approx(6.0 + 2 * math.pi * 1.2, rel=2e-3)
    assert oval.min_width == pytest.approx(0.9)


def test_projection_of_known_points_on_the_oval(oval):
    # (0, -1.0): 1.5 m along the bottom straight, 0.2 m left of the forward (+x) direction, heading 0.1 rad.
    # (2.5, 0): on the right semicircle at its apex (s = 3 + 0.6 pi), 0.2 m inside = left of travel (+y).
    # (-1.5, -1.5): at the start line, 0.3 m to the right.
    xy = torch.tensor([[0.0, -1.0], [2.5, 0.0], [-1.5, -1.5]])
    heading = torch.tensor([0.1, math.pi / 2, 0.0])
    proj = oval.project(xy, heading)
    expected_s = torch.tensor([1.5, 3.0 + 0.6 * math.pi, 0.0])
    ds = torch.remainder(proj.s - expected_s + oval.length / 2, oval.length) - oval.length / 2
    assert ds.abs().max() < 0.01
    assert proj.offset.tolist() == pytest.approx([0.2, 0.2, -0.3], abs=3e-3)
    assert proj.heading_error.tolist() == pytest.approx([0.1, 0.0, 0.0], abs=0.03)  # ~1° at a straight-arc joint
    assert proj.half_width.tolist() == pytest.approx([0.45] * 3, abs=1e-4)


def test_windowed_projection_matches_global(oval):
    gen = torch.Generator().manual_seed(0)
    s = torch.rand(64, generator=gen) * oval.length
    xy, tangent, hw = oval.interpolate(s)
    normal = torch.stack([-torch.sin(tangent), torch.cos(tangent)], -1)
    xy = xy + normal * (torch.rand(64, generator=gen)[:, None] - 0.5) * 0.8
    full = oval.project(xy, tangent)
    hint = torch.remainder(full.segment + 3, oval.num_points)  # hint 3 segments off
    local = oval.project(xy, tangent, hint=hint)
    assert torch.equal(full.segment, local.segment)
    assert torch.allclose(full.offset, local.offset)


def test_lookahead_points_in_car_frame(oval):
    xy = torch.tensor([[-1.0, -1.2], [1.0, -1.2]])
    heading = torch.tensor([0.0, math.pi])  # second car drives the loop backwards
    s = oval.project(xy, heading).s
    pts = oval.lookahead(xy, heading, s, torch.tensor([1.0, -1.0]), count=3, spacing=0.25)
    expected = torch.tensor([[0.25, 0.0], [0.5, 0.0], [0.75, 0.0]])
    assert pts.shape == (2, 3, 2)
    assert torch.allclose(pts[0], expected, atol=2e-3)
    assert torch.allclose(pts[1], expected, atol=2e-3)


def circle(radius: float, n: int = 200) -> np.ndarray:
    a = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.stack([radius * np.cos(a), radius * np.sin(a)], 1)


def test_optimal_lap_time_of_a_circle():
    r, mu = 2.0, 0.8
    track = Track(circle(r), 0.8)
    expected = 2 * math.pi * r / math.sqrt(mu * GRAVITY * r)  # v_max does not bind
    assert track.optimal_lap_time(mu=mu, v_max=10.0) == pytest.approx(expected, rel=5e-3)
    # A binding speed limit: the lap is driven at v_max.
    assert track.optimal_lap_time(mu=mu, v_max=1.0) == pytest.approx(2 * math.pi * r / 1.0, rel=5e-3)


def test_optimal_lap_time_orders_tracks_and_limits():
    track = builtin_track("reinvent2018")
    slow = track.optimal_lap_time(mu=0.5)
    fast = track.optimal_lap_time(mu=1.0)
    assert slow > fast
    assert track.optimal_lap_time(a_accel=1.0) > track.optimal_lap_time(a_accel=4.0)
    # Asymmetric acceleration and braking make the two directions differ on an asymmetric loop.
    fwd = track.optimal_lap_time(a_accel=0.5, a_brake=8.0)
    rev = track.optimal_lap_time(a_accel=0.5, a_brake=8.0, reverse=True)
    assert fwd != pytest.approx(rev, rel=1e-4)
    with pytest.raises(ValueError, match="mu"):
        track.optimal_lap_time(mu=0.0)


def deepracer_rows(track_pts: np.ndarray, width: float) -> np.ndarray:
    t = Track(track_pts, width)
    return t.deepracer_rows()


def test_npy_round_trip(tmp_path):
    track = builtin_track("technical")
    path = tmp_path / "technical.npy"
    track.save_deepracer_npy(path)
    rows = np.load(path)
    assert rows.shape == (len(track.waypoints) + 1, 6)
    assert np.allclose(rows[0], rows[-1])
    loaded = Track.from_deepracer_npy(path)
    assert np.allclose(loaded.waypoints, track.waypoints)
    assert np.allclose(loaded.waypoint_widths, 1.07, atol=1e-6)
    assert loaded.length == pytest.approx(track.length, rel=1e-4)
    # Inner border is on the loop's inside (this loop runs counter-clockwise: inside = left).
    inner, center, outer = rows[:-1, 2:4], rows[:-1, :2], rows[:-1, 4:6]
    assert np.linalg.norm(inner[0] - center[0]) == pytest.approx(0.535, abs=1e-6)
    tangent = np.roll(center, -1, axis=0) - center
    cross = lambda a, b: a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]  # noqa: E731
    assert (cross(tangent, inner - center) > 0).all() and (cross(tangent, outer - center) < 0).all()
    x, y = center[:, 0], center[:, 1]
    assert 0.5 * np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) > 0, "counter-clockwise loop"


def test_npy_width_from_borders_and_open_loop(tmp_path):
    pts = circle(3.0, 60)
    normal = pts / 3.0
    widths = np.linspace(0.6, 1.0, 60)
    rows = np.concatenate([pts, pts - normal * widths[:, None] / 2, pts + normal * widths[:, None] / 2], 1)
    path = tmp_path / "closed_implicitly.npy"
    np.save(path, rows)  # first != last, but the gap is one waypoint spacing: closed
    t = Track.from_deepracer_npy(path)
    assert np.allclose(t.waypoint_widths, widths)
    np.save(tmp_path / "open.npy", rows[:40])
    with pytest.raises(TrackFileError, match="open.npy: not a closed loop"):
        Track.from_deepracer_npy(tmp_path / "open.npy")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (np.zeros((10, 4)), r"expected shape \(M, 6\)"),
        (np.full((10, 6), np.nan), "NaN"),
        (np.array([[0, 0, 0, -0.3, 0, 0.3], [1, 0, 1, -0.3, 1, 0.3], [0, 0, 0, -0.3, 0, 0.3]]), "too short"),
    ],
)
def test_malformed_npy_is_refused_with_the_file_named(tmp_path, rows, message):
    path = tmp_path / "bad.npy"
    np.save(path, rows)
    with pytest.raises(TrackFileError, match=message) as err:
        Track.from_deepracer_npy(path)
    assert "bad.npy" in str(err.value)


def test_self_intersecting_and_zero_width_are_refused(tmp_path):
    a = np.linspace(0, 2 * np.pi, 80, endpoint=False)
    eight = np.stack([np.sin(a), np.sin(a) * np.cos(a)], 1) * 3  # figure eight crosses itself
    rows = np.concatenate([eight, eight, eight], 1)
    rows[:, 2:4] += 0.3
    np.save(tmp_path / "eight.npy", np.vstack([rows, rows[:1]]))
    with pytest.raises(TrackFileError, match="self-intersecting"):
        Track.from_deepracer_npy(tmp_path / "eight.npy")
    pts = circle(3.0, 50)
    flat = np.concatenate([pts, pts, pts], 1)  # inner == outer: zero width
    np.save(tmp_path / "flat.npy", np.vstack([flat, flat[:1]]))
    with pytest.raises(TrackFileError, match="width must be positive"):
        Track.from_deepracer_npy(tmp_path / "flat.npy")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(TrackFileError, match="not a readable"):
        Track.from_deepracer_npy(tmp_path / "text.npy")


def test_builtin_tracks_match_their_specification():
    assert set(BUILTIN_TRACKS) >= {"oval", "reinvent2018", "technical"}
    r18 = builtin_track("reinvent2018")
    assert 17.0 <= r18.length <= 18.0 and r18.min_width == pytest.approx(0.76)
    tech = builtin_track("technical")
    assert tech.min_width == pytest.approx(1.07)
    curv = r18.curvature_np
    assert curv.max() > 1.0 and curv.min() < -0.5, "re:Invent-like loop turns both ways"
    for name in BUILTIN_TRACKS:
        t = builtin_track(name)
        # every corner is wider than half the track, so both borders are drivable
        assert 1.0 / np.abs(t.curvature_np).max() > 0.5 * t.min_width
    assert load_track("oval").length == pytest.approx(builtin_track("oval").length)
