"""The two-frame motion branch: it reads a speed from consecutive frames alone, each row estimated out of fold."""

import math

import pytest
import torch

from adaptation.motion_branch import RecordedFrames, cross_fit_motion, frame_pairs
from envs.vehicle import VEHICLE_ESTIMATES


def striped_episodes(n_episodes=24, length=12, seed=0):
    """Horizontal stripes (period 16 px) that move down by the episode's speed, 0-4 px per frame; the commands are
    noise (they say nothing of the speed)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(60, dtype=torch.float32)[:, None]
    cams, targets, episodes, steps = [], [], [], []
    for e in range(n_episodes):
        px = float(torch.randint(0, 5, (1,), generator=g))
        phase = float(torch.rand(1, generator=g)) * 16
        for t in range(length):
            img = 127.5 + 100 * torch.sin(2 * math.pi * (rows - phase - px * t) / 16.0).expand(60, 80)
            cams.append(img.round().to(torch.uint8)[None])
            tg = torch.zeros(len(VEHICLE_ESTIMATES.targets))
            centre, scale = VEHICLE_ESTIMATES.scale["speed"]
            tg[VEHICLE_ESTIMATES.column("speed")] = centre + scale * (px - 2.0) / 2.0
            targets.append(tg)
            episodes.append(e)
            steps.append(t)
    n = len(episodes)
    return RecordedFrames(torch.stack(cams), torch.rand(n, 2, generator=g), torch.stack(targets),
                          torch.tensor(episodes), torch.tensor(steps))  # fmt: skip


def test_frame_pairs_hold_the_frame_the_one_before_and_zeros_at_an_episode_start():
    frames = striped_episodes(n_episodes=2, length=3)
    x = frame_pairs(frames, torch.tensor([0, 1, 3]))
    assert x.shape == (3, 3, 60, 80) and x.dtype == torch.float32
    assert torch.equal(x[1, 1], frames.camera[0, 0].float() / 255.0)  # step 1 sees step 0
    assert not x[0, 1].any() and not x[2, 1].any(), "nothing before an episode's first frame"
    assert torch.allclose(x[:, 2], x[:, 0] - x[:, 1])


def test_cross_fitted_cnn_reads_the_speed_from_two_frames():
    frames = striped_episodes()
    pred, r2 = cross_fit_motion(frames, folds=2, steps=150, batch=32, learning_rate=3e-3, after_steps=1)
    assert pred.shape == (len(frames.episode), 3)
    assert r2["speed"] > 0.8, r2
    again, _ = cross_fit_motion(frames, folds=2, steps=150, batch=32, learning_rate=3e-3, after_steps=1)
    assert torch.equal(pred, again)
    inputs = frames.episode_inputs(pred)
    assert torch.equal(inputs.inputs[:, 2:], pred) and torch.equal(inputs.inputs[:, :2], frames.prev_action)
    with pytest.raises(ValueError, match="at least 2"):
        cross_fit_motion(frames, folds=1)
