"""The only module that imports rsl_rl: builds PPO (through `OnPolicyRunner`) around our teacher actor.

rsl-rl-lib 5.x composes a policy from a model class (`actor`/`critic` entries with a `class_name`) and an output
distribution (`distribution_cfg`). The teacher actor subclasses rsl_rl's `MLPModel` so that its latent is
(normalized teacher state, z = mu(env factors)); discrete action spaces plug in our `CategoricalDistribution`,
continuous ones use rsl_rl's Gaussian.

Data-parallel runs use rsl_rl's own multi-GPU machinery (gradients averaged over ranks before the clip, the KL of the
adaptive learning rate averaged, the observation normalizer's statistics reduced over ranks) on the process group that
`envs.distributed` joined, with `gloo` as well as `nccl`; advantages are normalized with the statistics of every rank's
rollouts, so an update on two ranks' halves of a batch equals the update on the whole batch.

An auxiliary actor loss (the warm start's behaviour-cloning term) joins every mini-batch's PPO loss through the slot of
rsl_rl's symmetry extension, the one place where its update adds a further differentiable term before the backward pass:
its gradients are therefore averaged over the ranks and clipped together with the rest of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.distributed as dist
from rsl_rl.algorithms import PPO
from rsl_rl.models import MLPModel
from rsl_rl.runners import OnPolicyRunner
from tensordict import TensorDict
from torch import Tensor

from envs.distributed import SINGLE, Rank
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.networks import FactorEncoder, mlp, policy_input


class TeacherActorModel(MLPModel):
    """Policy: MLP over [normalized `teacher` group, z = mu(`env_factors`)], dropout in the trunk."""

    def __init__(
        self,
        obs: TensorDict,
        obs_groups: dict[str, list[str]],
        obs_set: str,
        output_dim: int,
        hidden_dims: tuple[int, ...] = (256, 128, 64),
        activation: str = "elu",
        obs_normalization: bool = True,
        distribution_cfg: dict | None = None,
        latent_dim: int = 8,
        encoder_hidden: tuple[int, ...] = (64,),
        dropout: float = 0.3,
        dropout_layers: int = 1,
        hidden_factors: tuple[str, ...] | list[str] = (),
        factor_names: tuple[str, ...] | list[str] = (),
    ) -> None:
        groups = obs_groups[obs_set]
        if groups != ["teacher", "env_factors"]:
            raise ValueError(f"the teacher actor reads ['teacher', 'env_factors'], got {groups}")
        self._split = (int(obs["teacher"].shape[-1]), int(obs["env_factors"].shape[-1]))
        self._latent = latent_dim
        super().__init__(
            obs, obs_groups, obs_set, output_dim, hidden_dims, activation, obs_normalization, distribution_cfg
        )
        self.factor_encoder = FactorEncoder(self._split[1], latent_dim, encoder_hidden, activation)
        out_dim = self.distribution.input_dim if self.distribution is not None else output_dim
        self.mlp = mlp(self._split[0] + latent_dim, out_dim, hidden_dims, activation, dropout, dropout_layers)
        if self.distribution is not None:
            self.distribution.init_mlp_weights(self.mlp)
        # Factors the actor is blind to read as 0 (mid-range); not saved: the policy config rebuilds the mask.
        names = list(factor_names) or [f"factor_{i}" for i in range(self._split[1])]
        visible = torch.tensor([name not in hidden_factors for name in names[: self._split[1]]])
        self.register_buffer("factor_visible", visible, persistent=False)

    def visible_factors(self, factors: Tensor) -> Tensor:
        """The env factors as the actor sees them: hidden ones held at 0."""
        return factors * self.factor_visible.to(factors.dtype)

    def _get_latent_dim(self) -> int:
        return self._split[0] + self._latent

    def split(self, obs: TensorDict) -> tuple[Tensor, Tensor]:
        x = self.obs_normalizer(torch.cat([obs["teacher"], obs["env_factors"]], dim=-1))
        state, _ = x.split(self._split, dim=-1)
        return state, self.visible_factors(obs["env_factors"])  # already normalized to [-1, 1] by the env

    def encode(self, obs: TensorDict) -> Tensor:
        """z = mu(e) `(N, latent_dim)` of the factors the actor sees."""
        return self.factor_encoder(self.visible_factors(obs["env_factors"]))

    def get_latent(self, obs: TensorDict, masks: Tensor | None = None, hidden_state=None) -> Tensor:
        state, factors = self.split(obs)
        return policy_input(state, self.factor_encoder(factors))


class _AuxiliaryLoss:
    """rsl_rl's symmetry-extension interface (`augment_batch`, `compute_loss`, `use_mirror_loss`, `mirror_loss_coeff`)
    around an actor loss: rsl_rl adds `mirror_loss_coeff * compute_loss(actor, batch, n)` to each mini-batch's loss."""

    use_data_augmentation = False
    use_mirror_loss = True

    def __init__(self, loss: Callable[[torch.nn.Module], Tensor], weight: float) -> None:
        self.loss, self.mirror_loss_coeff = loss, weight

    def augment_batch(self, batch, original_batch_size: int) -> None:
        """No augmentation: the batch stays as it is."""

    def compute_loss(self, actor: torch.nn.Module, batch, original_batch_size: int) -> Tensor:
        return self.loss(actor)


class TeacherPPO(PPO):
    """rsl_rl's PPO; on several ranks the advantages are normalized over all of them (rsl_rl normalizes each rank's
    own). With an `auxiliary_loss` (`actor -> scalar`) and a positive `auxiliary_weight`, every mini-batch's loss adds
    `auxiliary_weight * auxiliary_loss(actor)`; `update` reports its mean as `auxiliary_name`."""

    auxiliary_loss: Callable[[torch.nn.Module], Tensor] | None = None
    auxiliary_weight: float = 0.0
    auxiliary_name: str = "bc"

    def update(self) -> dict[str, float]:
        if self.auxiliary_loss is None or self.auxiliary_weight <= 0.0:
            return super().update()
        if self.symmetry is not None:
            raise ValueError("an auxiliary loss takes the symmetry extension's place; the two cannot be combined")
        self.symmetry = _AuxiliaryLoss(self.auxiliary_loss, self.auxiliary_weight)
        try:
            losses = super().update()
        finally:
            self.symmetry = None
        losses[self.auxiliary_name] = losses.pop("symmetry")
        return losses

    def compute_returns(self, obs: TensorDict) -> None:
        if not self.is_multi_gpu or self.normalize_advantage_per_mini_batch:
            super().compute_returns(obs)
            return
        self.normalize_advantage_per_mini_batch = True  # returns and raw advantages only; normalized below
        try:
            super().compute_returns(obs)
        finally:
            self.normalize_advantage_per_mini_batch = False
        adv = self.storage.advantages
        stats = torch.stack([adv.sum(), adv.square().sum(), torch.tensor(adv.numel(), device=adv.device)]).double()
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        total, squares, count = stats.unbind()
        mean = total / count
        std = ((squares - count * mean.square()) / (count - 1)).clamp(min=0.0).sqrt()
        self.storage.advantages = ((adv - mean) / (std + 1e-8)).to(adv.dtype)


class _Runner(OnPolicyRunner):
    """rsl_rl's runner on a process group that is already joined (any backend, any device), or none."""

    def __init__(self, env, cfg: dict, device: str, rank: Rank) -> None:
        self._rank = rank
        super().__init__(env, cfg, log_dir=None, device=device)

    def _configure_multi_gpu(self) -> None:
        rank = self._rank
        self.gpu_world_size, self.is_distributed = rank.world_size, rank.distributed
        self.gpu_local_rank, self.gpu_global_rank = rank.local_rank, rank.rank
        self.cfg["multi_gpu"] = (
            {"global_rank": rank.rank, "local_rank": rank.local_rank, "world_size": rank.world_size}
            if rank.distributed
            else None
        )


def train_cfg(
    policy: TeacherPolicyConfig, ppo: PPOConfig, action_kind: str, num_choices: int, factor_names: tuple[str, ...]
) -> dict:
    """The rsl_rl runner configuration dict (`factor_names`: the task's, in `env_factors` order)."""
    policy.check_factors(factor_names)
    if action_kind == "discrete":
        dist = {"class_name": "teacher.distribution:CategoricalDistribution", "num_choices": num_choices}
    else:
        dist = {"class_name": "GaussianDistribution", "init_std": policy.init_std}
    alg = asdict(ppo)
    alg.pop("num_steps_per_env")
    return {
        "num_steps_per_env": ppo.num_steps_per_env,
        "save_interval": 10**9,
        "check_for_nan": False,  # our trainer checks every step and names the group
        "obs_groups": {"actor": ["teacher", "env_factors"], "critic": ["teacher", "env_factors"]},
        "algorithm": {"class_name": "teacher.rsl_adapter:TeacherPPO", **alg},
        "actor": {
            "class_name": "teacher.rsl_adapter:TeacherActorModel",
            "hidden_dims": list(policy.hidden_dims),
            "activation": policy.activation,
            "obs_normalization": policy.obs_normalization,
            "distribution_cfg": dist,
            "latent_dim": policy.latent_dim,
            "encoder_hidden": list(policy.encoder_hidden),
            "dropout": policy.dropout,
            "dropout_layers": policy.dropout_layers,
            "hidden_factors": list(policy.hidden_factors),
            "factor_names": list(factor_names),
        },
        "critic": {
            "class_name": "MLPModel",
            "hidden_dims": list(policy.critic_hidden_dims),
            "activation": policy.activation,
            "obs_normalization": policy.obs_normalization,
        },
    }


def build_ppo(
    env,
    policy: TeacherPolicyConfig,
    ppo: PPOConfig,
    factor_names: tuple[str, ...],
    device: str = "cpu",
    rank: Rank = SINGLE,
):
    """An rsl_rl `OnPolicyRunner` (no log dir: our trainer logs and checkpoints) and its PPO algorithm; on several
    ranks every rank starts from rank 0's parameters."""
    space = env.action_space
    cfg = train_cfg(policy, ppo, space.kind, space.num_outputs if space.kind == "discrete" else 0, factor_names)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # rsl_rl prints the model summaries
        runner = _Runner(env, cfg, device, rank)
    if rank.distributed:
        runner.alg.broadcast_parameters()
    return runner, runner.alg


def build_actor(
    obs: TensorDict,
    num_actions: int,
    policy: TeacherPolicyConfig,
    action_kind: str,
    num_choices: int,
    factor_names: tuple[str, ...],
):
    """A standalone teacher actor (for loading a checkpoint without an env)."""
    cfg = train_cfg(policy, PPOConfig(), action_kind, num_choices, factor_names)["actor"]
    cfg.pop("class_name")
    return TeacherActorModel(obs, {"actor": ["teacher", "env_factors"]}, "actor", num_actions, **cfg)
