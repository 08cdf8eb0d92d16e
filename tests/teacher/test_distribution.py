import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from teacher.distribution import CategoricalDistribution
from teacher.networks import FactorEncoder, mlp


@pytest.fixture
def logits():
    return torch.randn(64, 10, generator=torch.Generator().manual_seed(0)) * 2


def test_log_prob_entropy_kl_match_torch(logits):
    dist = CategoricalDistribution(1, 10)
    dist.update(logits)
    ref = Categorical(logits=logits)
    actions = torch.randint(0, 10, (64, 1)).float()
    assert torch.allclose(dist.log_prob(actions), ref.log_prob(actions[:, 0].long()), atol=1e-6)
    assert torch.allclose(dist.entropy, ref.entropy(), atol=1e-6)
    other = logits.flip(0) + 0.3
    dist2 = CategoricalDistribution(1, 10)
    dist2.update(other)
    kl = dist.kl_divergence(dist.params, dist2.params)
    assert torch.allclose(kl, kl_divergence(ref, Categorical(logits=other)), atol=1e-5)
    assert dist.log_prob(actions).shape == (64,) and dist.entropy.shape == (64,)


def test_sampling_frequencies_and_deterministic_output():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(20000, 1)
    dist = CategoricalDistribution(1, 3)
    dist.update(logits)
    torch.manual_seed(0)
    samples = dist.sample()
    assert samples.shape == (20000, 1) and samples.dtype == torch.float32
    freq = torch.bincount(samples[:, 0].long(), minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.015)
    assert dist.deterministic_output(logits[:2]).tolist() == [[0.0], [0.0]]
    assert dist.as_deterministic_output_module()(torch.tensor([[0.0, 3.0, 1.0]])).tolist() == [[1.0]]
    assert dist.std.shape == (20000, 1) and dist.mean[0].item() == pytest.approx(0.4, abs=1e-5)


def test_initial_policy_is_near_uniform():
    net = mlp(12, 10, (32, 32))
    dist = CategoricalDistribution(1, 10)
    dist.init_mlp_weights(net)
    dist.update(net(torch.randn(16, 12)))
    assert dist.entropy.min() > 0.99 * torch.log(torch.tensor(10.0))


def test_factor_encoder_shape_and_range():
    enc = FactorEncoder(9, 8)
    z = enc(torch.randn(32, 9) * 10)
    assert z.shape == (32, 8) and z.abs().max() <= 1.0
    with pytest.raises(ValueError, match="output_dim 1"):
        CategoricalDistribution(2, 10)
