"""A warm-started teacher run on the point-mass task with a scripted expert, as one rank of `torchrun`; rank 0 writes
what the test checks.

    torchrun --nproc-per-node 2 tests/teacher/warm_start_worker.py OUT_DIR

Each rank records the expert in its own envs; the run warm-starts and trains 2 PPO iterations with the cloning term
(checkpoints every iteration), then a second trainer in another run directory resumes from iteration 1 and trains to
2. Rank 0 writes every rank's actor weights after the warm start and at the end of both runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.distributed import gather, init_distributed, shutdown
from teacher.config import PPOConfig, TeacherPolicyConfig, WarmStartConfig
from teacher.trainer import TeacherTrainer, TrainerConfig
from tests.teacher.expert_task import ExpertPointMassConfig
from tests.toy_task import PointMassEvalConfig

WARM = WarmStartConfig(expert_steps=20, bc_epochs=5, dagger_rounds=1, bc_batch_size=64, critic_epochs=2, bc_weight=0.5)


def make(run_dir: Path, rank) -> TeacherTrainer:
    return TeacherTrainer(
        ExpertPointMassConfig(num_envs=16, camera=False),
        TeacherPolicyConfig(hidden_dims=(32,), critic_hidden_dims=(32,)),
        PPOConfig(num_steps_per_env=8, num_mini_batches=2, num_learning_epochs=2),
        TrainerConfig(iterations=2, eval_every=1, save_every=1, seed=4), PointMassEvalConfig(episodes=8), run_dir,
        rank=rank, warm_start=WARM,
    )  # fmt: skip


def weights(trainer: TeacherTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.alg.get_policy().state_dict().items()}


def main(out: str) -> None:
    rank = init_distributed(True, "cpu", 60.0, "tests.teacher.warm_start_worker")
    out_dir = Path(out)
    first = make(out_dir / "a", rank)
    original = first.alg.update
    seen: dict[str, dict] = {}

    def update():  # the weights right after the warm start, before PPO's first update
        seen.setdefault("cloned", weights(first))
        return original()

    first.alg.update = update
    first.train(show_progress=False)
    resumed = make(out_dir / "b", rank)
    resumed.resume(out_dir / "a" / "checkpoints" / "iter_000001.pt")
    resumed.train(show_progress=False)
    result = {
        "cloned": gather(seen["cloned"], rank),
        "final": gather(weights(first), rank),
        "resumed": gather(weights(resumed), rank),
        "rollouts": gather(first.expert_rollouts.num_samples, rank),
    }
    if rank.is_main:
        torch.save(result, out_dir / "result.pt")
    shutdown(rank)


if __name__ == "__main__":
    main(sys.argv[1])
