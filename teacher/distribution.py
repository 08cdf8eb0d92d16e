"""Categorical action distribution for discrete DeepRacer action spaces (rsl_rl `distribution_cfg` interface).

rsl_rl's models call `update(mlp_output)`, `sample()`, `log_prob(actions)`, `entropy`, `params` and
`kl_divergence(old, new)`; the action tensor is `(N, 1)` holding the chosen index as a float (rsl_rl stores actions
as floats). Plain torch, no rsl_rl import: the class is plugged in through `teacher/rsl_adapter.py`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ArgmaxOutput(nn.Module):
    """Export-friendly deterministic output: the most likely action index, `(N, 1)` float."""

    def forward(self, logits: Tensor) -> Tensor:
        return logits.argmax(dim=-1, keepdim=True).to(logits.dtype)


class CategoricalDistribution(nn.Module):
    """A categorical over `num_choices` actions parameterized by logits `(N, num_choices)`."""

    def __init__(self, output_dim: int, num_choices: int, init_logit_scale: float = 0.01) -> None:
        super().__init__()
        if output_dim != 1:
            raise ValueError(f"a categorical action is one index per env (output_dim 1), got {output_dim}")
        self.output_dim = output_dim
        self.num_choices = num_choices
        self.init_logit_scale = init_logit_scale
        self._log_probs: Tensor | None = None

    # -- rsl_rl Distribution interface ---------------------------------------------------------------------
    @property
    def input_dim(self) -> int:
        return self.num_choices

    def update(self, mlp_output: Tensor) -> None:
        self._log_probs = torch.log_softmax(mlp_output, dim=-1)

    def sample(self) -> Tensor:
        probs = self._log_probs.exp()  # type: ignore[union-attr]
        return torch.multinomial(probs, 1).to(probs.dtype)

    def deterministic_output(self, mlp_output: Tensor) -> Tensor:
        return mlp_output.argmax(dim=-1, keepdim=True).to(mlp_output.dtype)

    def as_deterministic_output_module(self) -> nn.Module:
        return ArgmaxOutput()

    @property
    def mean(self) -> Tensor:
        """Expected action index `(N, 1)` (for logging)."""
        idx = torch.arange(self.num_choices, device=self._log_probs.device, dtype=self._log_probs.dtype)
        return (self._log_probs.exp() * idx).sum(-1, keepdim=True)

    @property
    def std(self) -> Tensor:
        """Spread of the action index `(N, 1)` (rsl_rl logs it as the policy's std)."""
        idx = torch.arange(self.num_choices, device=self._log_probs.device, dtype=self._log_probs.dtype)
        p = self._log_probs.exp()
        var = (p * idx.square()).sum(-1, keepdim=True) - self.mean.square()
        return var.clamp(min=0.0).sqrt()

    @property
    def entropy(self) -> Tensor:
        """`(N,)` entropy in nats."""
        lp = self._log_probs
        return -(lp.exp() * lp).sum(-1)

    @property
    def params(self) -> tuple[Tensor, ...]:
        return (self._log_probs,)  # type: ignore[return-value]

    def log_prob(self, outputs: Tensor) -> Tensor:
        """`(N,)` log-probabilities of the indices in `outputs` `(N, 1)`."""
        idx = outputs.reshape(outputs.shape[0], -1)[:, :1].round().long()
        return self._log_probs.gather(-1, idx).squeeze(-1)  # type: ignore[union-attr]

    def kl_divergence(self, old_params: tuple[Tensor, ...], new_params: tuple[Tensor, ...]) -> Tensor:
        """KL(old || new) `(N,)` from stored log-probabilities (normalized logits)."""
        old = torch.log_softmax(old_params[0], dim=-1)
        new = torch.log_softmax(new_params[0], dim=-1)
        return (old.exp() * (old - new)).sum(-1)

    def init_mlp_weights(self, mlp: nn.Module) -> None:
        """Small last layer: the initial policy is close to uniform over the actions."""
        last = [m for m in mlp.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            last.weight.mul_(self.init_logit_scale)
            last.bias.zero_()
