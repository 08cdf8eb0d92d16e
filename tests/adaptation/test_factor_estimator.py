import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaptation.estimator_fit import (
    EpisodeInputs,
    MotionErrors,
    estimate_sources,
    fit_estimator,
    motion_errors,
    odometry_errors,
    score,
    with_odometry_errors,
)
from adaptation.evaluation import r2_interval, seconds_to_follow, world_ids
from adaptation.factor_estimator import EstimatorConfig, FactorEstimator
from adaptation.losses import r2_score
from datasets.checkpoints import save_atomic
from envs.config_io import to_yaml
from envs.racing.car import discrete_grid
from envs.racing.config import EnvConfig
from envs.vehicle import VEHICLE_ESTIMATES
from student.loaded import STUDENT_KIND
from student.model import StudentConfig, StudentModel
from tests.helpers import racing_spec

SPEC = racing_spec("discrete", 10, 8, 7, 5)


def window_batch(t=50, b=2):
    torch.manual_seed(0)
    cam = torch.randint(0, 256, (b, t, 1, 120, 160), dtype=torch.uint8).float() / 255.0
    return cam, torch.rand(b, t, 2) * 2 - 1, torch.ones(b, t, dtype=torch.bool)


def grads(module):
    return [p.grad for p in module.parameters() if p.grad is not None and p.grad.abs().sum() > 0]


def test_estimator_losses_train_only_the_estimator_and_the_encoder_keeps_its_motion_estimates():
    model = StudentModel(StudentConfig(), SPEC)
    assert model.cfg.context == 28 and model.cfg.estimates_context == 28 + 30, "the estimator reads 30 steps more"
    cam, prev, mask = window_batch(t=70)
    _, heads = model.forward_window(cam, prev, mask)
    F.cross_entropy(heads["action_latency_logits"].flatten(0, 1), torch.zeros(140, dtype=torch.long)).backward()
    assert grads(model.estimator) and not grads(model.history) and not grads(model.encoder)
    model.zero_grad(set_to_none=True)
    _, heads = model.forward_window(cam, prev, mask)
    speed, friction = VEHICLE_ESTIMATES.regressions.index("speed"), VEHICLE_ESTIMATES.regressions.index("friction")
    heads["estimates"][..., speed].sum().backward()
    assert grads(model.history) and not grads(model.estimator)
    model.zero_grad(set_to_none=True)
    _, heads = model.forward_window(cam, prev, mask)
    heads["estimates"][..., friction].sum().backward()
    assert grads(model.estimator) and not grads(model.history), "friction comes from the estimator"


def test_estimator_learns_a_delay_it_can_see():
    """Latency classes 0-3: the 'yaw rate estimate' follows the steering command after that many steps (plus noise).
    A constant guess scores 25%; the estimator must read the delay from held-out sequences."""
    torch.manual_seed(0)
    est = FactorEstimator(EstimatorConfig(), act_latency_classes=4, cam_latency_classes=2)
    opt = torch.optim.Adam(est.parameters(), lr=3e-3)

    def batch(n, t=30):
        steer = torch.repeat_interleave(torch.randn(n, t // 3).clamp(-1, 1), 3, dim=1)  # piecewise constant
        delay = torch.randint(0, 4, (n,))
        idx = (torch.arange(t)[None] - delay[:, None]).clamp(min=0)
        yaw = steer.gather(1, idx) + 0.1 * torch.randn(n, t)
        estimates = torch.zeros(n, t, len(VEHICLE_ESTIMATES.regressions))
        estimates[..., VEHICLE_ESTIMATES.regressions.index("yaw_rate")] = yaw
        prev = torch.stack([steer, torch.zeros_like(steer)], -1)
        return FactorEstimator.inputs(prev, estimates), delay

    mask = torch.ones(64, 30, dtype=torch.bool)
    for _ in range(300):
        x, delay = batch(64)
        logits = est(x, mask)["action_latency_logits"][:, -1]
        loss = F.cross_entropy(logits, delay)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, delay = batch(512)
    with torch.no_grad():
        acc = est(x, torch.ones(512, 30, dtype=torch.bool))["action_latency_logits"][:, -1].argmax(-1) == delay
    assert acc.float().mean() > 0.8


def save_student(path, model, student_yaml):
    space = discrete_grid((-30.0, -15.0, 0.0, 15.0, 30.0), (1.0, 2.0))
    return save_atomic({
        "kind": STUDENT_KIND, "model": model.state_dict(), "student_yaml": student_yaml,
        "env_yaml": to_yaml(EnvConfig(num_envs=1, camera="projective")), "output_spec": SPEC.to_dict(),
        "format_version": 2, "task": "racing",
        "action_space": json.dumps(space.to_metadata()),
    }, path)  # fmt: skip


def test_physics_features_are_the_lateral_acceleration_and_steering_times_speed():
    """Speed 3.5 m/s (normalized 1.0), yaw rate 1.5 rad/s (1.0), steering command 0.5: lateral acceleration 5.25 m/s^2
    (/6), steering x speed 1.75 (/3); zero inputs (a reset state, padding) give zero features; the window pass and the
    one-step pass agree with them."""
    est = FactorEstimator(EstimatorConfig(), act_latency_classes=4, cam_latency_classes=2)
    x = torch.tensor([[0.5, 0.2, 1.0, 0.3, 1.0]])
    out = est.expand(x)
    assert out.shape == (1, 7) and torch.equal(out[:, :5], x)
    assert out[0, 5].item() == pytest.approx(5.25 / 6.0) and out[0, 6].item() == pytest.approx(1.75 / 3.0)
    assert torch.equal(est.expand(torch.zeros(3, 5)), torch.zeros(3, 7))
    raw = FactorEstimator(EstimatorConfig(features="raw"), act_latency_classes=4, cam_latency_classes=2)
    assert torch.equal(raw.expand(x), x) and est.init_state(2).shape[-1] == 5  # the state keeps raw inputs
    torch.manual_seed(0)
    seq = torch.randn(2, 40, 5)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, :12] = False  # the second episode starts at step 12
    window = est(seq, mask)["factors"]
    state = est.init_state(2)
    for t in range(40):
        started = mask[:, t]
        state = torch.where(started[:, None, None], state, est.init_state(2))
        heads, state = est.step(seq[:, t] * started[:, None], state)
        assert torch.allclose(heads["factors"][started], window[started, t], atol=1e-5)


def test_estimator_config_is_checked():
    with pytest.raises(ValueError, match="dilations"):
        EstimatorConfig(dilations=())
    assert EstimatorConfig().receptive_field == 31 and EstimatorConfig(kind="none").receptive_field == 1


def synthetic_episodes(n_episodes=240, length=40, seed=0, delays=None):
    """Recorded episodes whose 'yaw rate estimate' follows the steering command after the episode's action latency
    (0-3 substeps of 1/60 s here one step each; random, or `delays[e]`), as `episode_inputs` returns them."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for e in range(n_episodes):
        steer = torch.repeat_interleave(torch.rand(length // 4, generator=g) * 2 - 1, 4)
        delay = int(torch.randint(0, 4, (1,), generator=g))
        delay = delay if delays is None else delays[e]
        yaw = torch.cat([torch.zeros(delay), steer[: length - delay]]) + 0.05 * torch.randn(length, generator=g)
        x = torch.zeros(length, 5)
        x[:, 0], x[:, 4] = steer, yaw  # previous steering, yaw rate estimate
        targets = torch.zeros(length, len(VEHICLE_ESTIMATES.targets))
        targets[:, 0] = delay / 60.0
        targets[:, VEHICLE_ESTIMATES.column("friction")] = 1.0
        targets[:, VEHICLE_ESTIMATES.column("motor_gain")] = 1.0
        rows.append((x, targets, torch.full((length,), e), torch.arange(length)))
    return EpisodeInputs(*(torch.cat([r[i] for r in rows]) for i in range(4)))


def test_fit_estimator_learns_the_latency_on_held_out_episodes_and_trains_nothing_else():
    torch.manual_seed(0)
    data = synthetic_episodes()
    est = FactorEstimator(EstimatorConfig(), act_latency_classes=4, cam_latency_classes=2)
    before = score(est, data, torch.arange(len(data.episode)), 1 / 60)
    reports = []
    stats = fit_estimator(
        est, data, 1 / 60, steps=1000, batch=32, window=24, learning_rate=3e-3,
        progress=lambda step, loss: reports.append((step, loss)), progress_every=300,
    )  # fmt: skip
    assert [s for s, _ in reports] == [300, 600, 900, 1000], "every 300 steps and after the last"
    assert reports[-1][1] < 0.5 * reports[0][1], f"the reported mean loss falls as the fit learns: {reports}"
    assert before["action_latency_r2"] < 0.2
    assert stats["heldout/action_latency_r2"] > 0.8 and stats["train/action_latency_r2"] > 0.8
    assert stats["episodes"] == 240.0
    assert set(stats) >= {"heldout/loop_latency_r2", "heldout/friction_r2", "train/motor_gain_r2"}


def test_a_shift_is_followed_once_the_trailing_second_has_moved_not_on_one_noisy_step():
    step_up = np.r_[np.zeros(30), np.ones(30)]
    # the trailing 15-step mean reaches 0.8 when 12 of its steps are after the shift: step 30 + 11
    assert seconds_to_follow(step_up, 30, 1.0, 15.0) == pytest.approx(11 / 15)
    assert seconds_to_follow(1.0 - step_up, 30, 0.0, 15.0) == pytest.approx(11 / 15)
    spike = np.zeros(60)
    spike[35] = 1.0
    assert seconds_to_follow(spike, 30, 1.0, 15.0) is None
    half = np.r_[np.zeros(30), np.full(30, 0.5)]
    assert seconds_to_follow(half, 30, 1.0, 15.0) is None, "half way is not 80%"


def test_motion_errors_recover_how_the_estimates_lean_on_truth_and_commands_and_keep_residuals_whole():
    g = torch.Generator().manual_seed(0)
    data = synthetic_episodes(n_episodes=60, length=32)
    truth = torch.randn(len(data.episode), 3, generator=g)
    for i, name in enumerate(("speed", "lateral_speed", "yaw_rate")):
        centre, scale = VEHICLE_ESTIMATES.scale[name]
        data.targets[:, VEHICLE_ESTIMATES.column(name)] = truth[:, i] * scale + centre
    data.inputs[:, 1] = torch.rand(len(data.episode), generator=g)  # the speed command
    lagged = torch.roll(data.inputs[:, 1], 2) * (data.step >= 2)  # two steps back, zero before the episode's start
    noise = 0.1 * torch.randn(len(data.episode), 3, generator=g)
    linear = torch.tensor([0.2, -0.1, 0.0]) + torch.tensor([0.5, 0.8, 1.0]) * truth
    linear[:, 0] += 0.7 * lagged
    data.inputs[:, 2:] = linear + noise
    errors = motion_errors(data, lags=4)
    assert errors.lags == 4 and errors.weights.shape == (4 + 2 * 4, 3)
    assert torch.allclose(errors.weights[0], torch.tensor([0.2, -0.1, 0.0]), atol=0.03)  # constant
    assert torch.allclose(errors.weights[1:4].diagonal(), torch.tensor([0.5, 0.8, 1.0]), atol=0.03)  # truth
    assert abs(float(errors.weights[4 + 2 * 2 + 1, 0]) - 0.7) < 0.03  # speed command, lag 2
    assert torch.allclose(errors.predict(truth, data.inputs[:, :2], data.step), linear, atol=0.05)
    assert len(errors.residuals) == 60 and all(len(r) == 32 for r in errors.residuals)
    assert torch.allclose(errors.residuals[3], noise[96:128], atol=0.05)  # episode 3's rows, in step order
    # a longer sequence starts with one episode's residuals from its start, then goes on with others' from step 5
    seq = errors.sample(70, torch.Generator().manual_seed(1), under_way=5)
    assert seq.shape == (70, 3)
    assert any(torch.equal(seq[:32], r) for r in errors.residuals)
    assert any(torch.equal(seq[32:59], r[5:]) for r in errors.residuals)
    assert torch.equal(seq, errors.sample(70, torch.Generator().manual_seed(1), under_way=5))
    # speed leans on a command, the yaw rate on the truth alone
    sources = estimate_sources(data, after_steps=4, lags=4)
    assert sources["both/speed"] > 0.95 and sources["both/yaw_rate"] > 0.95
    assert sources["commands/yaw_rate"] < 0.05 < sources["commands/speed"] < sources["truth/speed"] < 0.9


def test_odometry_errors_recover_gain_and_residuals_and_apply_to_exact_odometry_from_each_start():
    g = torch.Generator().manual_seed(0)
    n_ep, length = 40, 30
    episode = torch.arange(n_ep).repeat_interleave(length)
    step = torch.arange(length).repeat(n_ep)
    exact = torch.randn(n_ep * length, 3, generator=g) * (step > 0)[:, None]
    noise = 0.05 * torch.randn(n_ep * length, 3, generator=g)
    measured = (torch.tensor([-0.05, 0.0, 0.01]) + exact * torch.tensor([0.9, 0.6, 1.0]) + noise) * (step > 0)[:, None]
    errors = odometry_errors(measured, exact, episode, step)
    assert errors.lags == 0 and errors.weights.shape == (4, 3)
    assert torch.allclose(errors.weights[0], torch.tensor([-0.05, 0.0, 0.01]), atol=0.01)
    assert torch.allclose(errors.weights[1:].diagonal(), torch.tensor([0.9, 0.6, 1.0]), atol=0.01)
    assert len(errors.residuals) == n_ep and all(len(r) == length for r in errors.residuals)
    assert not errors.residuals[0][0].any(), "no frame before an episode's first: nothing measured, no residual"
    assert torch.allclose(errors.residuals[5][1:], noise[5 * length + 1 : 6 * length], atol=0.02)
    # applied to simulated exact odometry: the linear part row by row, whole residual sequences, zeros at a start
    sim = synthetic_episodes(n_episodes=6, length=48)
    sim.inputs[:, 2:] = torch.randn(len(sim.step), 3, generator=g) * (sim.step > 0)[:, None]
    noisy = with_odometry_errors(sim, errors, seed=3)
    assert torch.equal(noisy.inputs[:, :2], sim.inputs[:, :2]) and torch.equal(noisy.targets, sim.targets)
    assert not noisy.inputs[sim.step == 0, 2:].any()
    diff = noisy.inputs[:, 2:] - errors.predict(sim.inputs[:, 2:], sim.inputs[:, :2], sim.step)
    first = diff[1:length]  # the first episode's rows after its start: one recorded episode's residuals
    assert any(torch.allclose(first, r[1:], atol=1e-5) for r in errors.residuals)
    assert torch.equal(noisy.inputs, with_odometry_errors(sim, errors, seed=3).inputs)
    assert not torch.equal(noisy.inputs, with_odometry_errors(sim, errors, seed=4).inputs)
    with pytest.raises(ValueError, match="command lags"):
        with_odometry_errors(sim, MotionErrors(torch.zeros(4 + 2 * 2, 3), errors.residuals))
    with pytest.raises(ValueError, match="rows with a frame before them"):
        odometry_errors(measured[:3], exact[:3], episode[:3], step[:3])


def test_fit_estimator_learns_from_simulated_worlds_and_scores_on_recorded_ones():
    """Every recorded training episode has latency 0, so only the simulated worlds can teach the others; the held-out
    recorded episodes (every second one) have latencies 0-3."""
    torch.manual_seed(0)
    recorded = synthetic_episodes(n_episodes=8, length=40, seed=1, delays=[0, 0, 1, 0, 2, 0, 3, 0])
    simulated = synthetic_episodes(n_episodes=240, length=40, seed=2)
    simulated.episode += 1000

    def fit(sim):
        est = FactorEstimator(EstimatorConfig(), act_latency_classes=4, cam_latency_classes=2)
        return fit_estimator(est, recorded, 1 / 60, steps=600, holdout_every=2, simulated=sim, after_steps=10)

    alone, stats = fit(None), fit(simulated)
    assert stats["simulated_episodes"] == 240.0 and stats["episodes"] == 8.0 and "simulated_episodes" not in alone
    assert alone["heldout_after/action_latency_r2"] < 0.2, "recorded episodes alone never show a latency"
    assert stats["heldout_after/action_latency_r2"] > 0.8
    assert stats["heldout/action_latency_r2"] > 0.8
    with pytest.raises(ValueError, match="overlap"):
        fit(synthetic_episodes(n_episodes=3, length=40))


def test_r2_interval_resamples_whole_cars():
    """Each car has one friction and one error of its estimate: its outputs count as one draw, not as many."""
    gen = torch.Generator().manual_seed(0)

    def cars(n: int, per: int):
        truth = torch.rand(n, generator=gen).repeat_interleave(per)  # uniform(0, 1): variance 1/12
        bias = 0.1 * torch.randn(n, generator=gen).repeat_interleave(per)  # the car's error, shared by its outputs
        return truth + bias, truth, torch.arange(n).repeat_interleave(per)

    pred, truth, car = cars(30, per=50)
    lo, hi = r2_interval(pred, truth, car)
    assert lo < r2_score(pred, truth) < hi
    assert lo < 1.0 - 0.01 * 12 < hi, "holds the R^2 of the population of cars"
    many = r2_interval(*cars(1500, per=1))  # as many outputs from as many cars
    assert lo < many[0] < many[1] < hi and many[1] - many[0] < 0.4 * (hi - lo), "fewer cars, wider interval"
    assert r2_interval(truth, truth, car) == (1.0, 1.0)
    assert all(math.isnan(v) for v in r2_interval(pred, truth, torch.zeros_like(car))), "one car: no interval"
    # every world holds the factor at one value, up to float32 rounding: that is not a spread
    fixed = (1.6 + 1.2e-7 * torch.randn(30, generator=gen)).repeat_interleave(50)
    assert all(math.isnan(v) for v in r2_interval(pred + 1.0, fixed, car)), "no spread: no interval"
    # car 0 resets at its fourth output (a new world); car 1 was under way from the first and never resets
    ids = world_ids(torch.tensor([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0], [0.0, 6.0], [1.0, 7.0]]))
    assert len(set(ids[:3, 0].tolist())) == 1 and len(set(ids[3:, 0].tolist())) == 1 and ids[2, 0] != ids[3, 0]
    assert len(set(ids[:, 1].tolist())) == 1 and ids[0, 1] not in ids[:, 0]


def scripted_estimation(monkeypatch, estimator: EstimatorConfig, num_envs=4, steps=75):
    """`estimation_by_time` of an untrained student while a pure-pursuit driver keeps the cars on the track; the
    policy objects it made, and per step the true body velocities."""
    from types import SimpleNamespace

    import student.estimation as evaluation
    from envs.racing.env import RacingEnv
    from envs.racing.pure_pursuit import PurePursuitDriver
    from envs.task import get_task
    from student.distiller import output_spec
    from student.model import StudentPolicy

    env_cfg = EnvConfig(num_envs=num_envs, camera="projective", compile=False)
    env = RacingEnv(env_cfg)
    pursuit = PurePursuitDriver(env.action_space, env_cfg.car, env_cfg.obs.lookahead_points,
                                env_cfg.obs.lookahead_spacing)  # fmt: skip
    made = []

    class Scripted(StudentPolicy):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.velocities, self.measured = [], []
            made.append(self)

        def act(self, obs):
            super().act(obs)  # the student's estimates, as it drives
            if self.tracker is not None:
                self.velocities.append(self.tracker.last.clone() * 15.0)
                self.measured.append(self.tracker.measured.clone())
            return pursuit.act(obs)

    monkeypatch.setattr(evaluation, "StudentPolicy", Scripted)
    teacher = SimpleNamespace(actor=SimpleNamespace(factor_encoder=SimpleNamespace(latent_dim=8)))
    torch.manual_seed(0)
    model = StudentModel(StudentConfig(estimator=estimator), output_spec(get_task("racing"), env, teacher)).eval()
    return evaluation.estimation_by_time(model, env_cfg, num_envs=num_envs, steps=steps), made


def test_estimation_by_time_scores_each_bin_and_every_output_after_two_seconds(monkeypatch):
    """The student's estimates are scored while a scripted driver keeps the cars on the track for 5 s."""
    out, made = scripted_estimation(monkeypatch, EstimatorConfig())
    assert made[0].tracker is None, "an estimator reading the encoder runs no odometry"
    bins = ("0-0.5s", "0.5-1s", "1-2s", "2-4s", ">4s")
    assert set(out) == {*bins, "after 2s"}
    assert [out[k]["samples"] for k in bins] == [4 * 8, 4 * 7, 4 * 15, 4 * 30, 4 * 15]  # no car left the track
    assert out["after 2s"]["samples"] == out["2-4s"]["samples"] + out[">4s"]["samples"]
    lo, hi = out["after 2s"]["friction_r2_ci"]
    assert lo <= hi, "an interval over the four cars"
    late = [out[k]["speed_r2"] for k in ("2-4s", ">4s")]
    assert out["after 2s"]["speed_r2"] not in late, "scored on both bins' outputs together"


def test_estimation_by_time_runs_the_odometry_beside_a_student_that_reads_it(monkeypatch):
    """An estimator that reads odometry is fed by a tracker over the env's frames: it measures the cars' forward
    motion (each car's frames follow its own pose) from their second frame on."""
    out, made = scripted_estimation(monkeypatch, EstimatorConfig(motion="odometry", dilations=(1, 2)), steps=40)
    policy = made[0]
    assert policy.tracker is not None
    measured = torch.stack(policy.measured)
    assert not measured[0].any() and measured[1:].all(), "no car left the track: every later frame is measured"
    forward = torch.stack(policy.velocities)[5:, :, 0]  # per frame, m/s: the pure-pursuit cars speed up to ~2 m/s
    assert 0.8 < float(forward.median()) < 4.0, forward.median()
    assert out["0.5-1s"]["samples"] == 4 * 7
