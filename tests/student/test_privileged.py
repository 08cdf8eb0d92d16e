"""The auxiliary privileged-observation head: its loss, where its gradient goes, and that it leaves the action path
(and students saved without it) as they were."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from adaptation.factor_estimator import EstimatorConfig
from adaptation.history_encoder import HistoryConfig
from envs.errors import ConfigError
from student.dagger import DaggerConfig, privileged_loss, train_step
from student.model import StudentConfig, StudentModel
from student.networks import EncoderConfig
from tests.helpers import racing_spec

SPEC = racing_spec("discrete", 10, 8, 7, 5)
WITH_HEAD = replace(SPEC, privileged_dim=6)
SMALL = StudentConfig(
    encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16), estimator=EstimatorConfig(kind="none"), head_hidden=(32,)
)
TCN = HistoryConfig(kind="tcn", dilations=(1, 2))


def window(t: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cam = torch.randint(0, 256, (2, t, 1, 120, 160), dtype=torch.uint8, generator=g)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, :2] = False  # row 1's episode starts at step 2
    return cam, torch.rand(2, t, 2, generator=g), mask


def test_privileged_loss_hand_example():
    target = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, False]])  # the third position carries no loss
    wrong_there = target.clone()
    wrong_there[0, 2] = 0.0
    loss, r2 = privileged_loss(wrong_there, target, mask)
    assert loss.item() == 0.0 and r2.item() == 1.0
    mean = torch.tensor([2.0, 1.0]).expand(1, 3, 2)  # each component's mean over the masked positions
    loss, r2 = privileged_loss(mean, target, mask)
    assert loss.item() == pytest.approx(1.0) and r2.item() == pytest.approx(0.0, abs=1e-7)
    _, r2 = privileged_loss(mean + 1.0, target, mask)
    assert r2.item() == pytest.approx(1.0 - 8.0 / 4.0)


@pytest.mark.parametrize("history", [TCN, HistoryConfig(kind="none")], ids=["tcn", "none"])
def test_the_head_predicts_per_step_and_leaves_the_action_path_unchanged(history):
    cfg = replace(SMALL, history=history)
    torch.manual_seed(0)
    plain = StudentModel(cfg, SPEC).eval()
    torch.manual_seed(0)
    aux = StudentModel(cfg, WITH_HEAD).eval()
    extra = set(aux.state_dict()) - set(plain.state_dict())
    assert extra and all(k.startswith("privileged_head.") for k in extra)
    plain_keys = {k: v for k, v in aux.state_dict().items() if k not in extra}
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in plain_keys.items()), "built last: same weights"
    cam, prev, mask = window(cfg.context + 2)
    with torch.no_grad():
        out_p, heads_p = plain.forward_window(cam, prev, mask)
        out_a, heads_a = aux.forward_window(cam, prev, mask, privileged=True)
        out_s, heads_s, _ = aux.step(cam[:, 0], prev[:, 0], aux.init_state(2))
        ref_s, _, _ = plain.step(cam[:, 0], prev[:, 0], plain.init_state(2))
    assert heads_a.pop("privileged").shape == (2, cam.shape[1], 6)
    assert torch.equal(out_a, out_p) and heads_a.keys() == heads_p.keys()
    assert torch.equal(out_s, ref_s) and "privileged" not in heads_s, "the deployed step never runs the head"
    assert "privileged" not in aux.forward_window(cam, prev, mask)[1], "only asked for"
    with pytest.raises(ConfigError, match="no privileged head"):
        plain.forward_window(cam, prev, mask, privileged=True)
    with pytest.raises(ValueError, match="positive"):
        aux.privileged_head.set_normalization(torch.zeros(6), torch.zeros(6))


def test_the_aux_loss_reaches_the_encoders_only_when_weighted():
    torch.manual_seed(0)
    model = StudentModel(replace(SMALL, history=HistoryConfig(kind="none")), WITH_HEAD)
    model.privileged_head.set_normalization(torch.full((6,), 0.5), torch.full((6,), 2.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # gradients only: the weights stay
    cam, prev, mask = window(5, seed=1)
    rng = np.random.default_rng(0)
    batch = {"camera": cam.numpy(), "prev_action": prev.numpy(), "mask": mask.numpy(),
             "teacher_logits": rng.normal(size=(2, 5, 10)).astype(np.float32),
             "privileged": rng.normal(size=(2, 5, 6)).astype(np.float32)}  # fmt: skip

    def grads(weight: float) -> tuple[dict[str, float], dict[str, torch.Tensor | None]]:
        cfg = DaggerConfig(bf16="off", cnn_grad_stride=1, privileged_weight=weight)
        stats = train_step(model, optimizer, batch, cfg, 0.01, lambda x: x.float() / 255.0)
        return stats, {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}

    stats0, g0 = grads(0.0)
    assert "loss/privileged" not in stats0 and "train/privileged_r2" not in stats0
    assert all(g0[n] is None for n in g0 if n.startswith("privileged_head.")), "weight 0: the head is not run"
    stats, g = grads(0.5)
    assert stats["loss/total"] == pytest.approx(stats["loss/action"] + 0.5 * stats["loss/privileged"], rel=1e-5)
    assert np.isfinite(stats["train/privileged_r2"]) and stats["train/privileged_r2"] < 1.0
    assert g["privileged_head.net.0.weight"].abs().sum() > 0
    assert not torch.allclose(g["encoder.conv.0.weight"], g0["encoder.conv.0.weight"]), "it trains the image encoder"
    assert torch.allclose(g["head.net.0.weight"], g0["head.net.0.weight"]), "and never the policy head"

    tcn = StudentModel(replace(SMALL, history=TCN), WITH_HEAD)
    cam, prev, mask = window(tcn.cfg.context + 2)
    tcn.forward_window(cam, prev, mask, privileged=True)[1]["privileged"].square().sum().backward()
    history_grad = sum(float(p.grad.abs().sum()) for p in tcn.history.parameters() if p.grad is not None)
    assert history_grad > 0 and tcn.encoder.conv[0].weight.grad.abs().sum() > 0
