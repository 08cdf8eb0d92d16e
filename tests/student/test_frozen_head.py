"""The frozen-head student (`--student.head frozen-teacher`): fed the teacher's exact inputs it acts as the teacher, its
trunk never trains while the estimates do, a teacher of another layout is refused, and it saves and loads without its
teacher."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from adaptation.factor_estimator import EstimatorConfig
from adaptation.history_encoder import HistoryConfig
from datasets.checkpoints import save_atomic
from envs.config_io import to_yaml
from envs.errors import ConfigError
from envs.task import TaskMismatchError, get_task
from student.dagger import DaggerConfig, train_step
from student.loaded import STUDENT_KIND, load_student
from student.model import StudentConfig, StudentModel
from student.networks import EncoderConfig
from student.teacher_head import teacher_head_spec
from teacher.config import TeacherPolicyConfig
from tests.helpers import in_process_teacher, racing_spec

# Dropout in the trunk: a trunk left in train mode would drop units and miss the teacher's outputs.
POLICY = TeacherPolicyConfig(hidden_dims=(32, 16), dropout=0.3, latent_dim=4, hidden_factors=("friction",))
STUDENT = StudentConfig(
    encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16), estimator=EstimatorConfig(kind="none"),
    history=HistoryConfig(kind="tcn", dilations=(1, 2)), head="frozen-teacher",
)  # fmt: skip


def frozen_student(teacher, seed: int = 1) -> StudentModel:
    """A frozen-head student built from `teacher` (its trunk and normalization taken) with random other weights."""
    spec = racing_spec("discrete", teacher.action_space.num_outputs, POLICY.latent_dim, 7, 5)
    head = teacher_head_spec(teacher, get_task("racing"), teacher.layout)
    torch.manual_seed(seed)
    model = StudentModel(STUDENT, replace(spec, privileged_dim=teacher.layout.teacher, teacher_head=head))
    model.adopt_teacher(teacher)
    return model


def teacher_obs(teacher, n: int, seed: int = 0) -> TensorDict:
    """Raw observations whose last two `teacher` columns are the previous action (racing's layout)."""
    g = torch.Generator().manual_seed(seed)
    priv = torch.randn(n, teacher.layout.teacher, generator=g) * 2.0
    priv[:, -2:] = torch.rand(n, 2, generator=g) * 2.0 - 1.0
    factors = torch.rand(n, teacher.layout.env_factors, generator=g) * 2.0 - 1.0
    return TensorDict({"teacher": priv, "env_factors": factors}, batch_size=[n])


def substitute(model: StudentModel, observation: torch.Tensor, z: torch.Tensor) -> None:
    """Make the student's estimates exactly `observation` (normalized) and `z` `(N, ...)`, on every step of a window."""

    def like(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], *([1] * (out.dim() - 2)), x.shape[-1]).expand_as(out).to(out.dtype)

    model.privileged_head.register_forward_hook(lambda m, i, out: like(observation, out))
    heads = model.history.heads
    model.history.heads = lambda h: {**heads(h), "z_hat": like(z, heads(h)["z_hat"])}


def test_the_teachers_exact_inputs_give_the_teachers_actions():
    teacher = in_process_teacher(POLICY)
    model = frozen_student(teacher).train()
    assert not model.teacher_head.trunk.training, "the trunk keeps the teacher's eval mode while the student trains"
    n, t = 5, 3
    obs = teacher_obs(teacher, n)
    expected = teacher.logits(obs)
    exact, z, prev = model.privileged_head.normalize(obs["teacher"]), teacher.z(obs), obs["teacher"][:, -2:]
    with torch.no_grad():
        assert (model.teacher_action(exact, z, prev) - expected).abs().max() <= 1e-6
        wrong_there = exact.clone()
        wrong_there[:, -2:] = 100.0  # the previous-action columns are the known action, never the estimate
        assert (model.teacher_action(wrong_there, z, prev) - expected).abs().max() <= 1e-6
        assert (model.teacher_action(exact, z, prev.flip(0)) - expected).abs().max() > 1e-3, "the action counts"
        assert (model.teacher_action(exact, z.flip(0), prev) - expected).abs().max() > 1e-3, "z counts"

        # Through the student's own paths: the deployed step and the training window (train mode, dropout on).
        substitute(model, wrong_there, z)
        cam = torch.randint(0, 256, (n, t, 1, 120, 160), dtype=torch.uint8)
        out, _, _ = model.step(cam[:, 0], prev, model.init_state(n))
        assert (out - expected).abs().max() <= 1e-6
        window, heads = model.forward_window(cam, prev[:, None].expand(n, t, 2), torch.ones(n, t, dtype=torch.bool),
                                             privileged=True)  # fmt: skip
    assert (window - expected[:, None]).abs().max() <= 1e-6
    assert (heads["privileged"] - exact[:, None]).abs().max() <= 1e-6, "the estimate as the trunk reads it"


def test_the_trunk_stays_frozen_while_the_estimates_learn_through_it():
    teacher = in_process_teacher(POLICY)
    model = frozen_student(teacher).train()
    trunk = {id(p) for p in model.teacher_head.trunk.parameters()}
    assert trunk and not trunk & {id(p) for p in model.trainable_parameters()}, "the optimizer never sees the trunk"
    b, t = 2, model.cfg.context + 3
    g, rng = torch.Generator().manual_seed(2), np.random.default_rng(2)
    targets = rng.normal(size=(b, t, 7)).astype(np.float32)
    targets[..., :2] = rng.uniform(0.0, 0.05, size=(b, t, 2))  # the two latencies, in seconds
    batch = {"camera": torch.randint(0, 256, (b, t, 1, 120, 160), dtype=torch.uint8, generator=g).numpy(),
             "prev_action": rng.uniform(-1, 1, size=(b, t, 2)).astype(np.float32),
             "mask": np.ones((b, t), dtype=bool), "teacher_logits": rng.normal(size=(b, t, 10)).astype(np.float32),
             "z": rng.uniform(-1, 1, size=(b, t, 4)).astype(np.float32), "targets": targets,
             "privileged": rng.normal(size=(b, t, teacher.layout.teacher)).astype(np.float32)}  # fmt: skip
    scale = lambda x: x.float() / 255.0  # noqa: E731

    # The action loss alone reaches the estimates through the frozen trunk.
    only_action = DaggerConfig(bf16="off", cnn_grad_stride=1, z_weight=0.0, latency_weight=0.0, estimate_weight=0.0)
    train_step(model, torch.optim.SGD(model.trainable_parameters(), lr=0.0), batch, only_action, 0.01, scale)
    assert model.privileged_head.net[0].weight.grad.abs().sum() > 0
    assert model.history.z_head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.teacher_head.trunk.parameters())

    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.trainable_parameters(), lr=1e-2)
    stats = train_step(model, optimizer, batch, DaggerConfig(bf16="off", privileged_weight=0.5), 0.01, scale)
    assert stats["loss/privileged"] > 0 and stats["loss/z"] > 0
    after = model.state_dict()
    frozen = [k for k in after if k.startswith("teacher_head.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    for k in ("privileged_head.net.0.weight", "history.z_head.weight", "encoder.conv.0.weight"):
        assert not torch.equal(before[k], after[k]), k
    assert torch.equal(after["privileged_head.centre"], before["privileged_head.centre"])


def test_a_teacher_of_another_layout_is_refused_naming_both():
    teacher = in_process_teacher(POLICY)
    model = frozen_student(teacher)
    width = teacher.layout.teacher
    wider = in_process_teacher(POLICY, teacher_width=width + 2)
    with pytest.raises(
        TaskMismatchError, match=rf"observation {width + 2} columns.*expects teacher observation {width} "
    ):
        model.adopt_teacher(wider)
    names = tuple(reversed(teacher.layout.factor_names))
    with pytest.raises(TaskMismatchError, match=rf"{names[0]}.*expects.*\[{teacher.layout.factor_names[0]!r}"):
        model.adopt_teacher(in_process_teacher(POLICY, factor_names=names))
    with pytest.raises(ConfigError, match="history.kind tcn or gru"):
        StudentModel(replace(STUDENT, history=HistoryConfig(kind="none")), model.spec)
    with pytest.raises(ConfigError, match="no teacher head"):
        StudentModel(STUDENT, replace(model.spec, teacher_head=None))
    from student.distiller import Distiller

    with pytest.raises(ConfigError, match="--student.head frozen-teacher.*--dagger.privileged-weight"):
        Distiller(teacher, teacher.env_cfg, STUDENT, DaggerConfig(), None, None, "unused")


def test_a_saved_student_loads_and_acts_without_its_teacher(tmp_path):
    teacher = in_process_teacher(POLICY)
    model = frozen_student(teacher).eval()
    ckpt = save_atomic({
        "kind": STUDENT_KIND, "model": model.state_dict(), "student_yaml": to_yaml(STUDENT),
        "env_yaml": to_yaml(teacher.env_cfg), "output_spec": model.spec.to_dict(), "format_version": 2,
        "task": "racing", "action_space": json.dumps(teacher.action_space.to_metadata()),
    }, tmp_path / "student.pt")  # fmt: skip
    loaded = load_student(ckpt).model
    assert loaded.spec == model.spec and loaded.spec.teacher_head.previous_action == teacher.layout.teacher - 2
    assert all(not p.requires_grad for p in loaded.teacher_head.trunk.parameters())
    state = loaded.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(state["teacher_head.trunk.0.weight"], teacher.actor.mlp[0].weight)
    cam, prev = torch.randint(0, 256, (3, 1, 120, 160), dtype=torch.uint8), torch.rand(3, 2)
    with torch.no_grad():
        outs = [m.step(cam, prev, m.init_state(3))[0] for m in (model, loaded)]
    assert torch.equal(*outs)
