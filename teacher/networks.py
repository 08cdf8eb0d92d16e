"""Teacher building blocks in plain torch: the environment-factor encoder μ(e) -> z, an MLP trunk with dropout and
the composition of the trunk's input."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU, "gelu": nn.GELU}


def mlp(
    in_dim: int,
    out_dim: int,
    hidden: Sequence[int],
    activation: str = "elu",
    dropout: float = 0.0,
    dropout_layers: int | None = None,
) -> nn.Sequential:
    """Linear -> activation per hidden layer, then a linear output layer.

    Dropout follows the last `dropout_layers` hidden layers (None = all of them)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}; use one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    last = in_dim
    first_dropped = 0 if dropout_layers is None else len(hidden) - dropout_layers
    for i, width in enumerate(hidden):
        layers += [nn.Linear(last, width), ACTIVATIONS[activation]()]
        if dropout > 0 and i >= first_dropped:
            layers.append(nn.Dropout(dropout))
        last = width
    layers.append(nn.Linear(last, out_dim))
    return nn.Sequential(*layers)


def policy_input(state: Tensor, z: Tensor) -> Tensor:
    """The policy trunk's input `(..., teacher + latent_dim)`: the normalized `teacher` group `(..., teacher)` and
    z `(..., latent_dim)`, in that order. The teacher actor composes it from its own state and z = mu(e); a student
    that acts through the teacher's frozen trunk composes it from its estimates of the two."""
    return torch.cat([state, z], dim=-1)


class FactorEncoder(nn.Module):
    """RMA / HORA environment-factor encoder: normalized factors `(N, F)` -> latent z `(N, latent_dim)` in (-1, 1)."""

    def __init__(self, factor_dim: int, latent_dim: int = 8, hidden: Sequence[int] = (64,), activation: str = "elu"):
        super().__init__()
        self.net = mlp(factor_dim, latent_dim, hidden, activation)
        self.latent_dim = latent_dim

    def forward(self, factors: Tensor) -> Tensor:
        return torch.tanh(self.net(factors))
