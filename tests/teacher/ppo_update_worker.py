"""One PPO update on a fixed batch, as a single process or as one rank of `torchrun`; writes the updated weights.

    python tests/teacher/ppo_update_worker.py OUT.pt                          # the whole batch, one process
    torchrun --nproc-per-node 2 tests/teacher/ppo_update_worker.py OUT.pt     # each rank half of the envs

Every process first records the same rollout of `N` envs (same seed, synthetic observations and rewards, the policy's
own sampled actions); a rank then keeps its slice of the envs and updates on it with the gradients, advantage
statistics, KL and observation-normalizer statistics reduced over the ranks. The same update is then repeated from the
same weights with a behaviour-cloning term in the loss (a fixed set of expert samples, each rank holding its half).
Rank 0 (or the single process) writes the actor and critic weights before and after either update.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.distributed import SINGLE, init_distributed, shutdown
from envs.racing.env import RacingEnv
from envs.task import get_task
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.rsl_adapter import build_ppo
from teacher.warm_start import imitation_loss
from tests.helpers import small_env_config

STEPS, ENVS = 6, 8
PPO = PPOConfig(num_steps_per_env=STEPS, num_mini_batches=1, num_learning_epochs=3)
POLICY = TeacherPolicyConfig(hidden_dims=(32, 32), critic_hidden_dims=(32, 32))


def main(out: str) -> None:
    rank = init_distributed("WORLD_SIZE" in os.environ, "cpu", 60.0, "tests.teacher.ppo_update_worker")
    factors = get_task("racing").factor_names
    torch.manual_seed(0)
    env = RacingEnv(small_env_config(num_envs=ENVS))
    _, full = build_ppo(env, POLICY, PPO, factors)  # the whole batch, not distributed
    full.train_mode()
    g = torch.Generator().manual_seed(1)
    template = env.get_observations()

    def synthetic():
        return template.apply(lambda x: torch.randn(x.shape, generator=g) * 2.0 + 0.5)

    for _ in range(STEPS):
        full.act(synthetic())
        rewards = torch.randn(ENVS, generator=g)
        dones = torch.rand(ENVS, generator=g) < 0.1
        full.process_env_step(synthetic(), rewards, dones, {})
    last = synthetic()
    expert_obs = synthetic().select("teacher", "env_factors")  # one expert sample per env
    expert_actions = torch.randint(env.action_space.num_outputs, (ENVS, 1), generator=g).float()
    before = {k: v.clone() for k, v in full.get_policy().state_dict().items()}
    alg = full
    if rank.distributed:
        n = ENVS // rank.world_size
        part = slice(rank.rank * n, (rank.rank + 1) * n)
        _, alg = build_ppo(RacingEnv(small_env_config(num_envs=n)), POLICY, PPO, factors, rank=rank)
        alg.train_mode()
        alg.get_policy().load_state_dict(full.get_policy().state_dict())
        alg._raw_critic.load_state_dict(full._raw_critic.state_dict())
        src, dst = full.storage, alg.storage
        dst.observations = src.observations[:, part].clone()
        for name in ("actions", "rewards", "dones", "values", "actions_log_prob"):
            setattr(dst, name, getattr(src, name)[:, part].clone())
        dst.distribution_params = tuple(p[:, part].clone() for p in src.distribution_params)
        dst.step = STEPS
        last = last[part]
        expert_obs, expert_actions = expert_obs[part], expert_actions[part]
    alg.compute_returns(last)
    start = copy.deepcopy(
        (alg.get_policy().state_dict(), alg._raw_critic.state_dict(), alg.optimizer.state_dict(), alg.learning_rate)
    )
    torch.manual_seed(2)
    alg.update()
    result = {"before": before, "actor": copy.deepcopy(alg.get_policy().state_dict())}
    result["critic"] = copy.deepcopy(alg._raw_critic.state_dict())
    actor, critic, optimizer, alg.learning_rate = copy.deepcopy(start)
    alg.get_policy().load_state_dict(actor)
    alg._raw_critic.load_state_dict(critic)
    alg.optimizer.load_state_dict(optimizer)
    alg.auxiliary_loss = lambda model: imitation_loss(model, expert_obs, expert_actions, discrete=True)
    alg.auxiliary_weight = 0.5
    torch.manual_seed(2)
    alg.update()  # the storage keeps its rollout: `update` only rewinds its write cursor
    result["actor_bc"], result["critic_bc"] = alg.get_policy().state_dict(), alg._raw_critic.state_dict()
    if rank.is_main:
        torch.save(result, out)
    shutdown(rank if rank.distributed else SINGLE)


if __name__ == "__main__":
    main(sys.argv[1])
