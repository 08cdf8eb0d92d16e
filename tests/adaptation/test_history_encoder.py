import pytest
import torch

from adaptation.history_encoder import HistoryConfig, HistoryEncoder
from adaptation.losses import adaptation_losses, estimate_metrics, latency_class, r2_score
from envs.vehicle import VEHICLE_ESTIMATES as VEHICLE


def make(kind="tcn"):
    torch.manual_seed(0)
    return HistoryEncoder(
        HistoryConfig(kind=kind), 6, 3, {"action_latency": 7, "camera_latency": 5}, len(VEHICLE.regressions)
    )


@pytest.mark.parametrize("kind", ["tcn", "gru"])
def test_step_by_step_equals_the_window_pass(kind):
    enc = make(kind).eval()
    r = enc.cfg.receptive_field
    t = r + 9
    steps = torch.randn(2, t, 8)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, :5] = False  # env 1's episode starts at step 5: left padding
    steps[1, :5] = 123.0  # whatever is in the padding must not matter
    full = enc(steps, mask)
    state = enc.init_state(2)
    outs = []
    for i in range(t):
        if i == 5:
            state[1] = 0.0  # reset on done: env 1 starts its episode here
        x = steps[:, i].clone()
        h, state = enc.step(torch.where(mask[:, i : i + 1], x, torch.zeros_like(x)), state)
        outs.append(h)
    stepped = torch.stack(outs, 1)
    ctx = r - 1 if kind == "tcn" else 0
    # env 0: identical once the window holds the full context (TCN) or from the start (GRU, same initial state).
    assert torch.allclose(full[0, ctx:], stepped[0, ctx:], atol=1e-5)
    # env 1: from its episode start on, the window pass sees what a freshly reset deployment state sees.
    assert torch.allclose(full[1, 5:], stepped[1, 5:], atol=1e-5)
    assert not torch.allclose(full[1, 5:], full[0, 5:], atol=1e-3), "the two envs' inputs differ"


def test_heads_shapes_and_ranges():
    enc = make()
    h = enc(torch.randn(4, 20, 8), torch.ones(4, 20, dtype=torch.bool))
    heads = enc.heads(h)
    assert h.shape == (4, 20, 64)
    assert heads["z_hat"].shape == (4, 20, 3) and heads["z_hat"].abs().max() < 1
    assert heads["action_latency_logits"].shape == (4, 20, 7)
    assert heads["camera_latency_logits"].shape == (4, 20, 5)
    assert heads["estimates"].shape == (4, 20, 5)


def test_causality_future_steps_do_not_change_the_past():
    enc = make()
    x = torch.randn(1, 30, 8)
    m = torch.ones(1, 30, dtype=torch.bool)
    a = enc(x, m)
    x2 = x.clone()
    x2[:, 20:] += 5.0
    b = enc(x2, m)
    assert torch.allclose(a[:, :20], b[:, :20]) and not torch.allclose(a[:, 20:], b[:, 20:])


def test_losses_and_metrics_by_hand():
    assert latency_class(torch.tensor([0.0, 0.04, 0.1, 1.0]), 1 / 60, 7).tolist() == [0, 2, 6, 6]
    assert r2_score(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(1.0)
    assert r2_score(torch.full((3,), 2.0), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(0.0)
    heads = {
        "z_hat": torch.tensor([[[0.0] * 3, [5.0] * 3]]),  # the masked step is far off: it must not count
        "action_latency_logits": torch.tensor([[[10.0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 10.0]]]),
        "camera_latency_logits": torch.tensor([[[0, 10.0, 0, 0, 0], [10.0, 0, 0, 0, 0]]]),
        "estimates": torch.tensor([[[0.0] * 5, [9.0] * 5]]),
    }
    # friction 1.3, motor gain 0.85, speed 3.5, lateral speed 0.08, yaw rate -1.5 normalize to (+1, -1, +1, +1, -1)
    # around (1.0, 1.0, 2.0, 0.0, 0.0) / (0.3, 0.15, 1.5, 0.08, 1.5)
    targets = torch.tensor([[[0.0, 1 / 60, 1.3, 0.85, 3.5, 0.08, -1.5]] * 2])
    z = torch.ones(1, 2, 3)
    mask = torch.tensor([[True, False]])
    losses = adaptation_losses(heads, z, targets, mask, 1 / 60, VEHICLE)
    assert losses["z"].item() == pytest.approx(1.0)
    assert losses["estimates"].item() == pytest.approx(1.0)
    assert losses["action_latency"].item() < 1e-3 and losses["camera_latency"].item() < 1e-3
    # A factor estimator's own mask: latencies, friction and motor gain at step 1 only (the far-off step), the body
    # velocities at step 0: estimates (1 + 1 + 1 motion at step 0, (9 - 1)^2 + (9 + 1)^2 factors at step 1) / 5.
    factor_mask = torch.tensor([[False, True]])
    split = adaptation_losses(heads, z, targets, mask, 1 / 60, VEHICLE, factor_mask=factor_mask)
    assert split["estimates"].item() == pytest.approx((3 + 64 + 100) / 5)
    assert split["action_latency"].item() > 5 and split["z"].item() == pytest.approx(1.0)
    # Weighting the speed's error (normalized error 1 at step 0) ten times: (1 + 1 + 10 + 1 + 1) / 5; the mean's
    # denominator stays the count of estimates, the other losses do not change.
    weighted = adaptation_losses(heads, z, targets, mask, 1 / 60, VEHICLE, estimate_weights={"speed": 10.0})
    assert weighted["estimates"].item() == pytest.approx(14 / 5)
    assert weighted["z"].item() == losses["z"].item()
    with pytest.raises(ValueError, match="unknown estimates \\['mass'\\]"):
        adaptation_losses(heads, z, targets, mask, 1 / 60, VEHICLE, estimate_weights={"mass": 2.0})
    heads = {k: v[:, :1].expand(-1, 2, *v.shape[2:]) for k, v in heads.items()}  # both steps as the first
    m = estimate_metrics({k: v[0] for k, v in heads.items()}, targets[0], 1 / 60, frame_substeps=4, spec=VEHICLE)
    assert m["action_latency_acc"] == 1.0 and m["loop_latency_within_frame"] == 1.0


def test_latency_estimate_is_scored_against_the_constant_guess():
    # True action latencies 0, 2, 4, 6 substeps (1/60 s), camera latency 0: the mean class 3 is within one frame
    # (4 substeps) of every one, so "within a frame" cannot tell a constant guess from an estimate; the R^2 can.
    targets = torch.zeros(4, 7)
    targets[:, 0] = torch.tensor([0.0, 2.0, 4.0, 6.0]) / 60
    targets[:, 2:4] = 1.0

    def heads(classes):
        return {
            "action_latency_logits": 20.0 * torch.nn.functional.one_hot(torch.tensor(classes), 7).float(),
            "camera_latency_logits": 20.0 * torch.nn.functional.one_hot(torch.zeros(4, dtype=torch.long), 5).float(),
            "estimates": torch.zeros(4, 5),
        }

    exact = estimate_metrics(heads([0, 2, 4, 6]), targets, 1 / 60, frame_substeps=4, spec=VEHICLE)
    constant = estimate_metrics(heads([3, 3, 3, 3]), targets, 1 / 60, frame_substeps=4, spec=VEHICLE)
    assert exact["action_latency_within_frame_constant_guess"] == 1.0 == constant["action_latency_within_frame"]
    assert exact["action_latency_r2"] == pytest.approx(1.0, abs=1e-6)
    assert constant["action_latency_r2"] == pytest.approx(0.0, abs=1e-6)
    # loop latency: guessing the mean total (3 substeps) misses by 3, 1, 1, 3 substeps = 2/60 s on average
    assert exact["loop_latency_mae_ms_constant_guess"] == pytest.approx(2000 / 60)
    assert exact["loop_latency_mae_ms"] == pytest.approx(0.0)
