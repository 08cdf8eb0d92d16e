import math

import numpy as np
import pytest
import torch

from envs.augment import AugmentConfig, augment, photometric, photometric_sparse
from envs.augment_lighting import (
    LIGHTING,
    CastShadows,
    ExposureStep,
    Glare,
    MotionBlur,
    cast_shadow_gain,
    exposure_gain,
    glare_light,
    motion_blur,
)
from envs.errors import ConfigError
from student.dagger import DaggerConfig, choose_actions, distillation_loss, loss_mask, teacher_probability
from student.model import StudentConfig, StudentModel, previous_frames
from student.networks import EncoderConfig, ImageEncoder
from tests.helpers import racing_spec

SPEC = racing_spec("discrete", 10, 8, 7, 5)


def test_image_encoder_shapes_heads_and_raw_pixel_input():
    frames = torch.randint(0, 256, (3, 1, 120, 160), dtype=torch.uint8)
    for head in ("flatten", "spatial_softmax"):
        enc = ImageEncoder(EncoderConfig(head=head))
        e = enc(frames)
        assert e.shape == (3, 128)
        assert torch.allclose(e, enc(frames.float() / 255.0), atol=1e-5), "uint8 is scaled inside the model"
    conv = ImageEncoder(EncoderConfig()).conv
    assert [m.kernel_size[0] for m in conv if isinstance(m, torch.nn.Conv2d)] == [8, 4, 3]


@pytest.mark.parametrize("motion", [False, True])
@pytest.mark.parametrize("kind", ["tcn", "gru", "none"])
def test_student_window_and_step_agree(kind, motion):
    torch.manual_seed(0)
    cfg = StudentConfig(encoder=EncoderConfig(motion=motion), history=StudentConfig().history.__class__(kind=kind))
    model = StudentModel(cfg, SPEC).eval()
    t = cfg.estimates_context + 3
    cam = torch.randint(0, 256, (2, t, 1, 120, 160), dtype=torch.uint8)
    prev = torch.rand(2, t, 2)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, :2] = False  # row 1: its episode starts at step 2 of the window
    with torch.no_grad():
        out_w, heads_w = model.forward_window(cam, prev, mask)
        state = model.init_state(2)
        outs, heads = [], []
        for i in range(t):
            if i == 2:
                state[1] = 0.0  # the reset at row 1's episode start
            o, hd, state = model.step(cam[:, i], prev[:, i], state)
            outs.append(o)
            heads.append(hd)
    stepped = torch.stack(outs, 1)
    assert out_w.shape == (2, t, 10)
    assert torch.allclose(out_w[0, cfg.context :], stepped[0, cfg.context :], atol=1e-4)
    assert torch.allclose(out_w[1, 2:], stepped[1, 2:], atol=1e-4), "from an episode start the window is exact"
    c = cfg.estimates_context  # the factor estimator reads further back than the policy
    for key in heads_w:  # z-hat, the factor estimator's latency logits and estimates, the motion estimates
        step_head = torch.stack([hd[key] for hd in heads], 1)
        assert torch.allclose(heads_w[key][0, c:], step_head[0, c:], atol=1e-4), key
        assert torch.allclose(heads_w[key][1, 2:], step_head[1, 2:], atol=1e-4), key
    assert (kind == "none") == (heads_w == {})
    assert cfg.context == StudentConfig(history=cfg.history).context + motion, "motion reads one frame further back"


def test_an_odometry_estimator_reads_the_given_motion_and_is_skipped_without_it():
    """Window pass: the history encoder's own heads (odometry is not part of a training window). Step with motion:
    the estimator's window pass over (previous action, motion) from the episode start. Step without motion: the
    encoder's heads, the estimator's state part untouched, the actions the same."""
    from adaptation.factor_estimator import EstimatorConfig

    torch.manual_seed(0)
    cfg = StudentConfig(estimator=EstimatorConfig(motion="odometry", dilations=(1, 2)))
    model = StudentModel(cfg, SPEC).eval()
    plain = StudentModel(StudentConfig(estimator=EstimatorConfig(kind="none")), SPEC).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("estimator.")})
    t = 9
    cam = torch.randint(0, 256, (2, t, 1, 120, 160), dtype=torch.uint8)
    prev, motion = torch.rand(2, t, 2), torch.randn(2, t, 3)
    mask = torch.ones(2, t, dtype=torch.bool)
    with torch.no_grad():
        out_w, heads_w = model.forward_window(cam, prev, mask)
        out_p, heads_p = plain.forward_window(cam, prev, mask)
        assert torch.equal(out_w, out_p) and all(torch.equal(heads_w[k], heads_p[k]) for k in heads_p)
        ours = model.estimator(torch.cat([prev, motion], -1), mask)
        s_with, s_without = model.init_state(2), model.init_state(2)
        for i in range(t):
            o1, h1, s_with = model.step(cam[:, i], prev[:, i], s_with, motion[:, i])
            before = s_without.clone()
            o2, h2, s_without = model.step(cam[:, i], prev[:, i], s_without)
            assert torch.allclose(o1, out_w[:, i], atol=1e-4) and torch.equal(o1, o2), "the policy never reads it"
            assert torch.allclose(h1["action_latency_logits"], ours["action_latency_logits"][:, i], atol=1e-4)
            assert torch.allclose(h2["action_latency_logits"], heads_w["action_latency_logits"][:, i], atol=1e-4)
            assert torch.allclose(h2["estimates"], heads_w["estimates"][:, i], atol=1e-4)
            hist_size = model.history.init_state(1).numel()
            assert torch.equal(s_without[:, hist_size:], before[:, hist_size:]), "the estimator's inputs stay zeros"
    assert not torch.allclose(h1["estimates"], h2["estimates"])
    from envs.errors import ConfigError
    from experiments.distill_student import DistillConfig

    with pytest.raises(ConfigError, match="fit_estimator odometry"):  # DAgger cannot train it: refused by name
        DistillConfig(student=cfg)


@pytest.mark.parametrize("motion", [False, True])
def test_strided_encoder_gradient_keeps_outputs_and_limits_gradient_to_its_frames(motion):
    torch.manual_seed(0)
    cfg = StudentConfig(encoder=EncoderConfig(motion=motion), history=StudentConfig().history.__class__(kind="none"))
    model = StudentModel(cfg, SPEC).eval()
    t, c = 7, 2
    cam = torch.randint(0, 256, (2, t, 1, 120, 160), dtype=torch.uint8)
    prev, mask = torch.rand(2, t, 2), torch.ones(2, t, dtype=torch.bool)
    dense, _ = model.forward_window(cam, prev, mask, context_no_grad=c)
    strided, _ = model.forward_window(cam, prev, mask, context_no_grad=c, grad_stride=2)
    assert torch.allclose(dense, strided, atol=1e-5), "the stride changes gradients, never outputs"

    def encoder_grad(pos: int, stride: int) -> torch.Tensor | None:
        model.zero_grad(set_to_none=True)
        out, _ = model.forward_window(cam, prev, mask, context_no_grad=c, grad_stride=stride)
        out[:, pos].square().sum().backward()  # a memoryless student: position `pos` reads frame `pos` only
        grad = model.encoder.conv[0].weight.grad
        return None if grad is None else grad.clone()

    assert torch.allclose(encoder_grad(c + 2, 2), encoder_grad(c + 2, 1), atol=1e-5), "strided frame: full gradient"
    skipped = encoder_grad(c + 1, 2)
    assert skipped is None or not skipped.any(), "the frame between two strided ones has no encoder gradient"
    assert model.head.net[0].weight.grad.abs().sum() > 0, "the policy head still trains on the skipped frame"
    assert encoder_grad(c + 1, 1).abs().sum() > 0


def test_motion_encoder_sees_the_frame_difference():
    torch.manual_seed(0)
    enc = ImageEncoder(EncoderConfig(motion=True)).eval()
    frame = torch.randint(0, 256, (1, 1, 120, 160), dtype=torch.uint8)
    with torch.no_grad():
        still, moved = enc(frame, frame), enc(frame, torch.roll(frame, 3, dims=-1))
    assert not torch.allclose(still, moved), "the same frame after a move embeds differently"
    with pytest.raises(ValueError, match="previous frames"):
        enc(frame)
    assert previous_frames(torch.arange(4.0).view(1, 4), torch.tensor([[False, True, True, True]])).tolist() == [
        [0.0, 1.0, 1.0, 2.0]
    ], "a window's first step and an episode's first step pair with themselves"


def test_beta_schedules():
    lbc = DaggerConfig(beta="lbc")
    assert [round(1 - teacher_probability(lbc, r), 6) for r in (0, 1, 10)] == [
        0.5,
        round(0.5 + 0.5 * 0.05, 6),
        round(0.5 + 0.5 * (1 - 0.95**10), 6),
    ]
    assert teacher_probability(DaggerConfig(beta="exponential"), 0) == 1.0
    assert teacher_probability(DaggerConfig(beta="exponential"), 3) == pytest.approx(0.95**3)
    assert teacher_probability(DaggerConfig(beta="zero"), 0) == 0.0


def test_mixing_and_gating():
    g = torch.Generator().manual_seed(0)
    n = 20000
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(n, 1)
    teacher = torch.zeros(n, 1)
    student = torch.full((n, 1), 2.0)
    executed, by_student = choose_actions(DaggerConfig(beta="lbc"), 0, logits, teacher, student, g)
    assert by_student.float().mean().item() == pytest.approx(0.5, abs=0.02)
    assert torch.equal(executed[by_student], student[by_student])
    gated, used = choose_actions(DaggerConfig(beta="exponential", gating=True, gate_threshold=0.2), 0, logits, teacher,
                                 torch.ones(n, 1), g)  # fmt: skip
    assert used.all(), "the teacher gives action 1 probability 0.3 >= 0.2: the student's action is accepted"
    assert torch.equal(gated, torch.ones(n, 1))
    assert torch.equal(executed[~by_student], teacher[~by_student])
    gated, used = choose_actions(DaggerConfig(beta="exponential", gating=True, gate_threshold=0.2), 0, logits, teacher,
                                 student, g)  # fmt: skip
    assert not used.any(), "action 2 has teacher probability 0.1 < 0.2: rejected, and the teacher drives (beta = 1)"
    assert torch.equal(gated, teacher)


def test_distillation_loss_hand_example():
    teacher = torch.log(torch.tensor([[[0.5, 0.5]]]))
    student = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * np.log(0.5 / 0.25) + 0.5 * np.log(0.5 / 0.75)
    assert distillation_loss(student, teacher, torch.ones(1, 1, dtype=torch.bool), "discrete").item() == pytest.approx(
        expected, rel=1e-5
    )
    assert distillation_loss(teacher, teacher, torch.ones(1, 1, dtype=torch.bool), "discrete").item() == pytest.approx(
        0.0, abs=1e-6
    )
    mse = distillation_loss(
        torch.tensor([[[0.0, 0.5]]]), torch.tensor([[[2.0, 0.5]]]), torch.ones(1, 1, dtype=torch.bool), "continuous"
    )
    assert mse.item() == pytest.approx(0.5)  # the teacher's 2.0 is clamped to 1.0


def test_loss_mask_needs_full_context_or_an_episode_start():
    mask = torch.tensor([[True] * 6, [False, False, True, True, True, True]])
    lm = loss_mask(mask, context=3)
    assert lm[0].tolist() == [False, False, False, True, True, True]
    assert lm[1].tolist() == [False, False, True, True, True, True]


def test_augmentations_keep_dtype_range_and_are_seeded():
    x = torch.rand(4, 3, 1, 120, 160)
    for name in ("color", "translate", "shadow", "sharpen", "noise"):
        cfg = AugmentConfig.only(name)
        a = augment(x, cfg, torch.Generator().manual_seed(1))
        b = augment(x, cfg, torch.Generator().manual_seed(1))
        c = augment(x, cfg, torch.Generator().manual_seed(2))
        assert a.dtype == x.dtype and a.shape == x.shape
        assert a.min() >= 0.0 and a.max() <= 1.0
        assert torch.equal(a, b) and not torch.equal(a, c), name
        assert not torch.equal(a, x), name
    assert torch.equal(augment(x, AugmentConfig.off(), torch.Generator()), x)
    # Window-consistent: the color change is the same for every frame of a window.
    flat = torch.full((2, 4, 1, 8, 8), 0.5)
    out = augment(flat, AugmentConfig.only("color"), torch.Generator().manual_seed(0))
    assert torch.allclose(out[:, :1].expand_as(out), out)


def test_lighting_augmentations_keep_dtype_range_and_are_seeded():
    """Each lighting effect at probability 1, from uint8 and float frames: float in [0, 1], same shape, the same
    for the same seed, different for another, different from the input; at probability 0, the input."""
    raw = torch.randint(0, 256, (3, 4, 1, 60, 80), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    scaled = raw.float() * (1.0 / 255.0)
    for name in LIGHTING:
        cfg = AugmentConfig.only(name)
        for x in (raw, scaled):
            a = augment(x, cfg, torch.Generator().manual_seed(1))
            assert a.dtype == torch.float32 and a.shape == x.shape, name
            assert a.min() >= 0.0 and a.max() <= 1.0, name
            assert not torch.equal(a, scaled), name
        assert torch.equal(a, augment(scaled, cfg, torch.Generator().manual_seed(1))), name
        assert not torch.equal(a, augment(scaled, cfg, torch.Generator().manual_seed(2))), name
        none = AugmentConfig(**{**vars(cfg), f"{name}_p": 0.0})
        assert torch.allclose(augment(raw, none, torch.Generator().manual_seed(1)), scaled, atol=1e-6), name


def test_only_the_exposure_step_changes_within_a_window():
    """One frame repeated over each window: the exposure changes after the first frame of every window; every other
    lighting effect is the same on all frames (cast shadows too once their drift is 0, and they turn with it)."""
    frame = torch.rand(4, 1, 1, 60, 80, generator=torch.Generator().manual_seed(0))
    x = frame.expand(4, 6, 1, 60, 80)
    for name in LIGHTING:
        out = augment(x, AugmentConfig.only(name), torch.Generator().manual_seed(3))
        same = [torch.equal(out[:, i], out[:, 0]) for i in range(6)]
        if name == "exposure":
            assert torch.equal(out[:, 0], x[:, 0])  # the step comes after the first frame
            assert all(not torch.equal(out[i, -1], out[i, 0]) for i in range(4))
        elif name == "cast_shadow":
            assert not all(same)
            still = AugmentConfig(**{**vars(AugmentConfig.only(name)), "cast_shadow_drift": 0.0})
            out = augment(x, still, torch.Generator().manual_seed(3))
            assert all(torch.equal(out[:, i], out[:, 0]) for i in range(6))
        else:
            assert all(same), name


def test_lighting_probabilities_fall_back_to_the_group_and_are_checked_by_name():
    import tyro

    cfg = tyro.cli(AugmentConfig, args=["--lighting-p", "0.3", "--glare-p", "0"])
    assert [cfg.probability(n) for n in LIGHTING] == [0.3, 0.0, 0.3, 0.3, 0.3]
    assert not AugmentConfig().lighting_on and AugmentConfig(exposure_p=0.1).lighting_on
    assert AugmentConfig.only("flare").probability("flare") == 1.0 and not AugmentConfig.only("color").lighting_on
    with pytest.raises(ConfigError, match="augment.glare_p"):
        AugmentConfig(glare_p=1.5)
    with pytest.raises(ConfigError, match="augment.cast_shadow_strength"):
        AugmentConfig(cast_shadow_strength=(0.8, 0.2))
    with pytest.raises(ConfigError, match="unknown"):
        AugmentConfig.only("rain")


def test_exposure_gain_and_motion_blur_by_hand():
    two = torch.tensor([2.0, 1.0])
    step = ExposureStep(start=two, frames=two, stops=torch.tensor([1.0, -1.0]))
    expected = torch.tensor([[1.0, 1.0, 2**0.5, 2.0, 2.0], [1.0, 0.5, 0.5, 0.5, 0.5]])
    assert torch.allclose(exposure_gain(step, 5), expected)
    dot = torch.zeros(2, 1, 1, 7, 7)
    dot[..., 3, 3] = 0.9
    blur = MotionBlur(length=torch.tensor([3.0, 1.0]), angle=torch.tensor([0.0, 0.0]))
    out = motion_blur(dot, blur, radius=(1, 2))
    assert torch.allclose(out[0, 0, 0, 3, 2:5], torch.full((3,), 0.3)) and out[0].sum().item() == pytest.approx(0.9)
    assert torch.allclose(out[1], dot[1])  # length 1: no blur


def test_cast_shadow_and_glare_maps_by_hand():
    """A band straight down from a vanishing point at the horizon's centre covers the bottom-centre pixel and not
    the corners; a glare patch peaks at its gain in its centre and falls to gain/e on its ellipse."""
    one = torch.ones(1, 1)
    band = CastShadows(
        vp_x=torch.tensor([40.5]), drift=torch.zeros(1), strength=torch.tensor([0.5]), foot_x=40.5 * one,
        foot_y=80 * one, width=10 * one, side=-one, present=one.bool(),
    )  # fmt: skip
    gain = cast_shadow_gain(band, 2, 60, 80, horizon=20.0)  # 10 px wide at the bottom row, 5 px halfway up
    assert gain.shape == (1, 2, 60, 80)
    assert gain[0, 0, 59, 40] == 0.5 and gain[0, 0, 59, 0] == 1.0 and gain[0, 0, 10, 40] == 1.0
    assert gain[0, 0, 59, 36] == 0.5 and gain[0, 0, 59, 34] == 1.0 and gain[0, 0, 39, 37] == 1.0
    patch = Glare(
        x=40.5 * one, y=30.5 * one, a=8 * one, b=4 * one, angle=0 * one, gain=0.8 * one, present=one.bool()
    )  # fmt: skip
    light = glare_light(patch, 60, 80)
    assert light[0, 30, 40].item() == pytest.approx(0.8)
    assert light[0, 30, 48].item() == pytest.approx(0.8 / math.e)  # a semi-axis (8 px) to the right
    assert light[0, 34, 40].item() == pytest.approx(0.8 / math.e)  # b semi-axis (4 px) down


def test_sparse_photometric_equals_the_fused_pass_exactly():
    """The eager path (shadow and sharpen only over the windows with non-neutral parameters) gives the fused pass's
    result bit for bit, from uint8 and from float frames."""
    g = torch.Generator().manual_seed(3)
    b = 6
    frames = torch.randint(0, 256, (b, 3, 1, 24, 32), generator=g, dtype=torch.uint8)
    shaded, sharpened = torch.tensor([1, 4]), torch.tensor([0, 4, 5])
    tone = torch.rand(b, generator=g) - 0.5
    gain = 0.6 + 0.8 * torch.rand(b, generator=g)
    shift = 0.5 * torch.rand(b, generator=g) - 0.25
    angle = 6.28 * torch.rand(b, generator=g)
    strength = torch.ones(b)
    strength[shaded] = 0.5
    shadow = torch.stack([angle.cos(), angle.sin(), torch.rand(b, generator=g) - 0.5, strength], 1)
    sharp = torch.zeros(b)
    sharp[sharpened] = torch.tensor([-0.8, 0.5, 1.0])
    for x in (frames, frames.float() / 255.0):
        fused = photometric(x, tone, gain, shift, shadow, sharp)
        assert torch.equal(fused, photometric_sparse(x, tone, gain, shift, shadow, sharp))


def test_failed_compile_warns_once_and_runs_the_eager_fallback(monkeypatch):
    from envs import jit

    def broken(fn, dynamic=False):
        def call(*args, **kwargs):
            raise torch._dynamo.exc.BackendCompilerFailed(fn, RuntimeError("no compiler"), None)

        return call

    monkeypatch.setattr(jit.torch, "compile", broken)
    calls = []
    fn = jit.maybe_compile(lambda x: x + 1, True, fallback=lambda x: calls.append(x) or x + 1)
    with pytest.warns(UserWarning, match="torch.compile unavailable"):
        assert fn(1) == 2
    assert fn(2) == 3 and calls == [1, 2]  # the fallback from then on
    assert jit.maybe_compile(lambda x: x, False, fallback=lambda x: -x)(3) == -3  # compile off: the fallback
