"""Expert warm start of the teacher: the task's scripted expert drives the training envs, the actor's mean is cloned
from its actions, the critic is fitted to its returns, and a behaviour-cloning term on its rollouts joins PPO's loss
(DAPG).

- `collect_rollouts(env, act, steps, groups)` runs the expert in the training env (auto-reset inside `step`) and
  records time-major observations of the groups the actor and critic read, the expert's actions, rewards, dones and
  time-outs (`ExpertRollouts`); with `drive` another policy (the clone, in DAgger rounds) steps the env while the
  expert labels each state it reaches.
- `clone_actor` fits the actor's output through the whole actor (normalizer input, factor encoder, trunk) to the
  expert's actions: MSE of the mean for a box action, cross-entropy for a categorical one.
- `fit_critic` regresses the critic on the rollouts' lambda-returns (`lambda_returns`: bootstrapped at time-outs and
  at the rollouts' end as rsl_rl's PPO does), recomputed from the critic being fitted on every pass.
- `BehaviourCloning` is the term each PPO mini-batch adds to its loss with the weight `WarmStartConfig.bc_weight_at`;
  it draws its samples with its own generator, whose state a checkpoint keeps.

On several ranks each rank records its own envs; the normalizers reduce their statistics over the ranks and the cloning
and the fit average their gradients, so that every rank ends the warm start with the same weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from tensordict import TensorDict
from torch import Tensor, nn

from envs.distributed import SINGLE, Rank, average_gradients, sum_over_ranks
from teacher.config import PPOConfig, WarmStartConfig

EXPERT_FILE = "expert_rollouts.pt"
"""the expert's rollouts, beside the checkpoints of the run that recorded them"""
EXPERT_KIND = "gapbridge.expert_rollouts"
HELD_OUT_EVERY = 10
"""the cloning leaves out every tenth env's steps to report its loss on trajectories it never saw"""


@dataclass
class ExpertRollouts:
    """Rollouts in the training envs labelled by the expert, time-major: the expert's own, and the clone's in DAgger
    rounds (as further envs)."""

    obs: TensorDict
    """`(T, N)` the groups the actor and critic read, before each step"""
    actions: Tensor
    """`(T, N, A)` the expert's action on each state (clamped to the action box)"""
    rewards: Tensor
    """`(T, N)`"""
    dones: Tensor
    """`(T, N)` bool: the episode ended at this step (the env reset itself)"""
    time_outs: Tensor
    """`(T, N)` bool: ended by the time limit (bootstrapped, not terminal)"""
    last_obs: TensorDict
    """`(N,)` the observation after the last step"""

    @property
    def num_samples(self) -> int:
        return int(self.actions.shape[0] * self.actions.shape[1])

    def flat(self) -> tuple[TensorDict, Tensor]:
        """Observations `(T * N,)` and actions `(T * N, A)`."""
        return self.obs.flatten(0, 1), rearrange(self.actions, "t n a -> (t n) a")

    def held_out(self) -> Tensor:
        """`(T * N,)` bool, in `flat`'s order: the steps of every `HELD_OUT_EVERY`-th env (the last env when there are
        fewer; none of a single env)."""
        steps, envs = self.rewards.shape
        mask = torch.arange(envs) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        if envs > 1 and not bool(mask.any()):
            mask[-1] = True
        return mask.expand(steps, envs).reshape(-1).to(self.rewards.device)

    def fingerprint(self) -> float:
        """A checksum a checkpoint records, so that a resume uses the very rollouts the run recorded."""
        groups = sum(float(value.double().sum()) for value in self.obs.values())
        return float(self.actions.double().sum() + self.rewards.double().sum()) + groups

    def cat(self, other: ExpertRollouts) -> ExpertRollouts:
        """Both rollouts side by side, as envs of one rollout `(T, N + N')` (each env's steps stay in order)."""
        return ExpertRollouts(
            torch.cat([self.obs, other.obs], 1), torch.cat([self.actions, other.actions], 1),
            torch.cat([self.rewards, other.rewards], 1), torch.cat([self.dones, other.dones], 1),
            torch.cat([self.time_outs, other.time_outs], 1), torch.cat([self.last_obs, other.last_obs], 0),
        )  # fmt: skip

    def to(self, device: str | torch.device) -> ExpertRollouts:
        return ExpertRollouts(
            self.obs.to(device), self.actions.to(device), self.rewards.to(device), self.dones.to(device),
            self.time_outs.to(device), self.last_obs.to(device),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "obs": self.obs.to_dict(), "actions": self.actions, "rewards": self.rewards, "dones": self.dones,
            "time_outs": self.time_outs, "last_obs": self.last_obs.to_dict(),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExpertRollouts:
        steps, envs = data["actions"].shape[:2]
        return cls(
            TensorDict(data["obs"], batch_size=[steps, envs]), data["actions"], data["rewards"], data["dones"],
            data["time_outs"], TensorDict(data["last_obs"], batch_size=[envs]),
        )  # fmt: skip


@torch.no_grad()
def collect_rollouts(
    env,
    act: Callable[[TensorDict], Tensor],
    steps: int,
    groups: tuple[str, ...],
    bounds: tuple[float, float] | None,
    logs: list[dict] | None = None,
    drive: Callable[[TensorDict], Tensor] | None = None,
) -> ExpertRollouts:
    """`steps` control steps of `act` in every env of `env` (which resets finished episodes itself), or of `drive`
    with `act`'s action on each state recorded as its label; `bounds`: the action box the recorded actions are clamped
    to (None: a categorical index, kept as is). The env's episode logs (`extras["log"]`) are appended to `logs`."""
    obs = env.get_observations()
    seen, actions, rewards, dones, time_outs = [], [], [], [], []
    for _ in range(steps):
        action = act(obs)  # the expert reads the env's state before the step
        seen.append(obs.select(*groups).clone())
        obs, reward, done, extras = env.step(action if drive is None else drive(obs))
        if logs is not None and extras.get("log"):
            logs.append(extras["log"])
        actions.append(action.float() if bounds is None else action.float().clamp(*bounds))
        rewards.append(reward.float())
        dones.append(done.bool())
        time_outs.append(extras.get("time_outs", torch.zeros_like(done)).bool())
    stack = torch.stack
    return ExpertRollouts(
        stack(seen), stack(actions), stack(rewards), stack(dones), stack(time_outs), obs.select(*groups).clone()
    )


def lambda_returns(
    values: Tensor, last_values: Tensor, rewards: Tensor, dones: Tensor, time_outs: Tensor, gamma: float, lam: float
) -> Tensor:
    """GAE(lambda) returns `(T, N)` of values `(T, N)` and rewards `(T, N)`, as rsl_rl's PPO computes them: a time-out
    adds `gamma * V` of its step's own observation to the reward (the next one is already the reset env's), a done
    stops the recursion, and the last step bootstraps from `last_values` `(N,)`."""
    rewards = rewards + gamma * values * time_outs.float()
    returns = torch.empty_like(values)
    advantage = torch.zeros_like(last_values)
    for t in reversed(range(values.shape[0])):
        next_values = last_values if t == values.shape[0] - 1 else values[t + 1]
        alive = 1.0 - dones[t].float()
        delta = rewards[t] + alive * gamma * next_values - values[t]
        advantage = delta + alive * gamma * lam * advantage
        returns[t] = advantage + values[t]
    return returns


def imitation_loss(actor: nn.Module, obs: TensorDict, actions: Tensor, discrete: bool) -> Tensor:
    """How far the actor's output is from the expert's `actions` `(B, A)`: MSE of the mean (a box action) or the
    cross-entropy of the expert's index (a categorical one)."""
    out = actor.mlp(actor.get_latent(obs))
    if discrete:
        return nn.functional.cross_entropy(out, actions[:, 0].round().long())
    return nn.functional.mse_loss(out, actions)


def mini_batches(n: int, batch_size: int, generator: torch.Generator) -> list[Tensor]:
    """A shuffled pass over `n` samples in batches of `batch_size` (the last one shorter)."""
    return list(torch.randperm(n, generator=generator).split(batch_size))


def _step(loss: Tensor, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], rank: Rank, clip: float) -> None:
    optimizer.zero_grad()
    loss.backward()
    average_gradients(params, rank)
    nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()


def _mean(value: float, rank: Rank) -> float:
    return sum_over_ranks(value, rank) / rank.world_size


def clone_actor(
    actor: nn.Module,
    obs: TensorDict,
    actions: Tensor,
    held_out: Tensor,
    cfg: WarmStartConfig,
    discrete: bool,
    generator: torch.Generator,
    rank: Rank = SINGLE,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """Behaviour cloning of the actor on `(obs, actions)` `(M,)`, `(M, A)` but the `held_out` `(M,)` samples, for
    `cfg.bc_epochs` passes; returns its first and last pass's loss and the loss on the held-out samples before and
    after (averaged over the ranks; NaN without held-out samples)."""
    test, train = held_out.nonzero()[:, 0], (~held_out).nonzero()[:, 0]
    params = [p for name, p in actor.named_parameters() if not name.startswith("distribution.") and p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.bc_learning_rate)

    def held_out_loss() -> float:
        if not len(test):
            return _mean(float("nan"), rank)
        with torch.no_grad():
            return _mean(float(imitation_loss(actor, obs[test], actions[test], discrete)), rank)

    figures = {"bc_heldout_loss_before": held_out_loss()}
    for epoch in range(cfg.bc_epochs):
        total = 0.0
        for idx in mini_batches(len(train), cfg.bc_batch_size, generator):
            batch = train[idx.to(train.device)]
            loss = imitation_loss(actor, obs[batch], actions[batch], discrete)
            _step(loss, optimizer, params, rank, max_grad_norm)
            total += float(loss.detach()) * len(batch)
        mean = _mean(total / len(train), rank)
        if epoch == 0:
            figures["bc_loss_first"] = mean
        figures["bc_loss"] = mean
    figures["bc_heldout_loss"] = held_out_loss()
    return figures


def fit_critic(
    critic: nn.Module,
    rollouts: ExpertRollouts,
    cfg: WarmStartConfig,
    gamma: float,
    lam: float,
    generator: torch.Generator,
    rank: Rank = SINGLE,
    max_grad_norm: float = 1.0,
) -> float:
    """Regress the critic on the rollouts' lambda-returns for `cfg.critic_epochs` passes, the returns recomputed from
    the critic at the start of each; returns the last pass's mean squared error (averaged over the ranks)."""
    steps, envs = rollouts.rewards.shape
    flat = rollouts.obs.flatten(0, 1)
    params = [p for p in critic.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.bc_learning_rate)
    last = float("nan")
    for _ in range(cfg.critic_epochs):
        with torch.no_grad():
            values = rearrange(critic(flat)[:, 0], "(t n) -> t n", t=steps)
            targets = lambda_returns(
                values, critic(rollouts.last_obs)[:, 0], rollouts.rewards, rollouts.dones, rollouts.time_outs,
                gamma, lam,
            ).reshape(-1)  # fmt: skip
        total = 0.0
        for idx in mini_batches(steps * envs, cfg.bc_batch_size, generator):
            idx = idx.to(targets.device)
            loss = (critic(flat[idx])[:, 0] - targets[idx]).square().mean()
            _step(loss, optimizer, params, rank, max_grad_norm)
            total += float(loss.detach()) * len(idx)
        last = _mean(total / (steps * envs), rank)
    return last


def set_action_std(actor: nn.Module, std: float) -> None:
    """The Gaussian's action std (either parameterization) set to `std`; a categorical has none to set."""
    dist = getattr(actor, "distribution", None)
    with torch.no_grad():
        if hasattr(dist, "std_param"):
            dist.std_param.fill_(std)
        elif hasattr(dist, "log_std_param"):
            dist.log_std_param.fill_(math.log(std))


class BehaviourCloning:
    """The behaviour-cloning term of a PPO mini-batch: the imitation loss on `batch_size` expert samples drawn with
    replacement by the term's own generator (`state_dict` / `load_state_dict` carry it over a resume)."""

    def __init__(self, rollouts: ExpertRollouts, batch_size: int, discrete: bool, generator: torch.Generator) -> None:
        self.obs, self.actions = rollouts.flat()
        self.batch_size, self.discrete, self.generator = batch_size, discrete, generator

    def __call__(self, actor: nn.Module) -> Tensor:
        idx = torch.randint(self.actions.shape[0], (self.batch_size,), generator=self.generator)
        idx = idx.to(self.actions.device)
        return imitation_loss(actor, self.obs[idx], self.actions[idx], self.discrete)

    def state_dict(self) -> Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: Tensor) -> None:
        self.generator.set_state(state)


def episode_means(logs: list[dict]) -> dict[str, float]:
    """The mean of each episode metric the env logged (`episode/success` -> `success`)."""
    out = {}
    for key in sorted({k for log in logs for k in log}):
        values = torch.cat([torch.as_tensor(log[key]).float().reshape(-1) for log in logs if key in log])
        if values.numel():
            out[key.split("/")[-1]] = float(values.mean())
    return out


def run_warm_start(
    alg,
    env,
    act: Callable[[TensorDict], Tensor],
    cfg: WarmStartConfig,
    ppo: PPOConfig,
    generator: torch.Generator,
    rank: Rank = SINGLE,
) -> tuple[ExpertRollouts, dict[str, float]]:
    """The warm start of a PPO algorithm `alg` (rsl_rl's, built by `teacher.rsl_adapter.build_ppo`): the expert `act`
    drives `env` for `cfg.expert_steps` steps, both normalizers take in its observations and the actor is cloned on
    them; in each of `cfg.dagger_rounds` rounds the clone drives as long while the expert labels its states, and the
    actor is cloned again on everything; the critic is fitted on all the rollouts and the action std set to
    `cfg.init_std`. Returns the rollouts (every round's beside the expert's) and the figures to log."""
    actor, critic = alg.get_policy(), alg._raw_critic
    groups = tuple(dict.fromkeys([*actor.obs_groups, *critic.obs_groups]))
    space = env.action_space
    discrete = space.kind == "discrete"
    bounds = None if discrete else (space.low, space.high)
    start = time.time()
    figures: dict[str, float] = {}

    def record(who: str, drive: nn.Module | None) -> ExpertRollouts:
        """`expert_steps` labelled steps (`drive`: the clone's mean steps the env), taken in by both normalizers."""
        logs: list[dict] = []
        alg.eval_mode()
        more = collect_rollouts(env, act, cfg.expert_steps, groups, bounds, logs, drive).to(alg.device)
        figures.update({f"{who}_{k}": v for k, v in episode_means(logs).items()})  # this rank's episodes
        figures[f"{who}_step_reward"] = _mean(float(more.rewards.mean()), rank)
        alg.train_mode()
        actor.update_normalization(more.obs.flatten(0, 1))
        critic.update_normalization(more.obs.flatten(0, 1))
        return more

    def clone(prefix: str) -> None:
        obs, actions = rollouts.flat()
        out = clone_actor(actor, obs, actions, rollouts.held_out(), cfg, discrete, generator, rank, ppo.max_grad_norm)
        figures.update({prefix + k: v for k, v in out.items()})

    rollouts = record("expert", None)
    clone("")
    for round_ in range(1, cfg.dagger_rounds + 1):
        rollouts = rollouts.cat(record(f"dagger{round_}", actor))
        clone(f"dagger{round_}_")
    figures["samples"] = float(rollouts.num_samples * rank.world_size)
    figures["critic_loss"] = fit_critic(critic, rollouts, cfg, ppo.gamma, ppo.lam, generator, rank, ppo.max_grad_norm)
    set_action_std(actor, cfg.init_std)
    if rank.distributed:  # the same weights everywhere (the averaged steps keep them equal up to rounding)
        alg.broadcast_parameters()
    figures["seconds"] = time.time() - start
    return rollouts, figures
