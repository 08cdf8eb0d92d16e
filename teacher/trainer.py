"""PPO training loop for the privileged teacher: rollouts, updates, periodic evaluation, checkpoints, exact resume.

The PPO update itself is rsl_rl's (built by `teacher/rsl_adapter.py`); this loop owns what a research run needs
around it: a wall-clock budget, NaN/inf checks that name the observation group and step, fixed-seed evaluation in
both directions, atomic checkpoints holding everything needed to continue bit-exactly (model, optimizer, learning
rate, iteration, global and env RNG, the env's full state), and a progress bar.

On several ranks (`envs.distributed`, launched by torchrun) each rank steps its own share of the envs in its own
worlds and the PPO update averages the ranks' gradients; rank 0 alone evaluates, logs and writes checkpoints, which
hold every rank's env and RNG state so that a resume with the same world size continues exactly. The wall-clock budget
is rank 0's, so all ranks stop at the same iteration.

With a warm start (`WarmStartConfig`, `teacher/warm_start.py`) the run begins with the task's scripted expert: its
rollouts, the cloned actor and fitted critic, the cloned policy's evaluation and a checkpoint at iteration 0; the
rollouts are written once beside the checkpoints (`expert_rollouts.pt`), and a resume reads them back for the
behaviour-cloning term instead of warm-starting again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from datasets.checkpoints import CheckpointError, git_sha, load_checkpoint, rng_state, save_atomic, set_rng_state
from envs.config_io import to_yaml
from envs.distributed import SINGLE, Rank, check_world, env_share, gather, main_decides
from envs.errors import GapbridgeError, check_range
from envs.progress import stage_progress
from envs.task import task_of_config
from teacher.config import PPOConfig, TeacherPolicyConfig, WarmStartConfig
from teacher.policy import FORMAT_VERSION, TEACHER_KIND, ObsLayout, checkpoint_task
from teacher.rsl_adapter import build_ppo
from teacher.warm_start import EXPERT_FILE, EXPERT_KIND, BehaviourCloning, ExpertRollouts, run_warm_start

LogFn = Callable[[dict[str, float], int], None]


class TrainingDiverged(GapbridgeError, RuntimeError):
    """NaN or inf appeared in observations, rewards or losses."""


@dataclass(frozen=True)
class TrainerConfig:
    """Length, budget and bookkeeping of a teacher run."""

    iterations: int = 300
    """PPO iterations (rollout + update)"""
    max_minutes: float = 0.0
    """stop after this much wall time (0 = no limit); the last checkpoint and evaluation are still written"""
    eval_every: int = 10
    """evaluate every this many iterations (and at the end)"""
    save_every: int = 10
    """checkpoint every this many iterations (and at the end); every checkpoint is kept"""
    seed: int = 0
    """seed of torch's global RNG (policy sampling, mini-batches, dropout)"""
    device: str = "cpu"
    """device of the policy"""

    def __post_init__(self) -> None:
        check_range("trainer.iterations", self.iterations, 1, 10_000_000)
        check_range("trainer.max_minutes", self.max_minutes, 0.0, 1e6)
        check_range("trainer.eval_every", self.eval_every, 1, 10_000_000)
        check_range("trainer.save_every", self.save_every, 1, 10_000_000)


def check_finite(obs: TensorDict, rewards: torch.Tensor, iteration: int, step: int) -> None:
    for key, value in obs.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).any(dim=tuple(range(1, value.dim()))).nonzero()[0, 0])
            raise TrainingDiverged(
                f"non-finite value in observation group {key!r} at iteration {iteration}, "
                f"rollout step {step}, env {bad}"
            )
    if not bool(torch.isfinite(rewards).all()):
        raise TrainingDiverged(f"non-finite reward at iteration {iteration}, rollout step {step}")


class TeacherTrainer:
    """Owns the env, the PPO algorithm and the run directory. The task is the one whose env config `env_cfg` is; its
    env must offer the `teacher` and `env_factors` observation groups."""

    def __init__(
        self,
        env_cfg,
        policy_cfg: TeacherPolicyConfig,
        ppo_cfg: PPOConfig,
        trainer_cfg: TrainerConfig,
        eval_cfg,
        run_dir: str | Path,
        run_config_yaml: str = "",
        log: LogFn | None = None,
        wandb_run_id: str = "",
        rank: Rank = SINGLE,
        warm_start: WarmStartConfig | None = None,
    ) -> None:
        self.env_cfg, self.policy_cfg, self.ppo_cfg = env_cfg, policy_cfg, ppo_cfg
        self.cfg, self.eval_cfg = trainer_cfg, eval_cfg
        self.run_dir = Path(run_dir)
        self.run_config_yaml = run_config_yaml
        self.log = log or (lambda metrics, step: None)
        self.wandb_run_id = wandb_run_id
        self.rank = rank
        torch.manual_seed(trainer_cfg.seed)
        self.task = task_of_config(env_cfg)
        if not isinstance(eval_cfg, self.task.eval_config_cls):
            raise GapbridgeError(
                f"the {self.task.name!r} task evaluates with {self.task.eval_config_cls.__name__}, "
                f"got {type(eval_cfg).__name__}"
            )
        policy_cfg.check_factors(self.task.factor_names)
        self.warm_cfg = warm_start or WarmStartConfig()
        self.warm_cfg.check_task(self.task.name, self.task.expert is not None)
        self.task.require_groups(env_cfg, ("teacher", "env_factors"), "the teacher")
        self.env = self.task.make_env(env_share(env_cfg, rank))
        self.task.check_groups(self.env, ("teacher", "env_factors"), "the teacher")
        self.runner, self.alg = build_ppo(
            self.env, policy_cfg, ppo_cfg, self.task.factor_names, trainer_cfg.device, rank
        )  # fmt: skip
        if rank.distributed:  # same initial weights everywhere (above), then each rank its own sampling and dropout
            torch.manual_seed(rank.seed(trainer_cfg.seed))
        self.eval_env = self.task.make_eval_env(env_cfg, eval_cfg) if rank.is_main else None
        self.iteration = 0
        self.env_steps = 0
        self.history: list[dict[str, float]] = []
        self.layout = ObsLayout.of_env(self.env, self.task.factor_names)
        self.warm_started = False
        self.expert_rollouts: ExpertRollouts | None = None
        self.warm_figures: dict[str, float] = {}
        """the warm start's figures (its losses, the expert's rollouts), as logged under `warm_start/`"""
        self.bc_generator = torch.Generator().manual_seed(rank.seed(trainer_cfg.seed))
        """the warm start's shuffling and the behaviour-cloning term's draws"""

    # ------------------------------------------------------------------------------------------------ train
    def train(self, show_progress: bool = True) -> dict[str, float]:
        """Run until `iterations` (or the wall-clock budget); returns the last evaluation."""
        cfg, alg = self.cfg, self.alg
        start = time.time()
        if self.warm_cfg.enabled and not self.warm_started:
            self._warm_start()
        obs = self.env.get_observations()
        last_eval: dict[str, float] = {}
        progress = stage_progress("teacher", disable=not (show_progress and self.rank.is_main))
        with progress:
            task = progress.add_task("train", total=cfg.iterations, completed=self.iteration, status="")
            while self.iteration < cfg.iterations:
                t0 = time.time()
                # Rollouts act with the deterministic trunk (dropout off, as deployed); updates train with dropout.
                alg.eval_mode()
                obs, episode_logs, reward_sum = self._rollout(obs)
                collect = time.time() - t0
                alg.train_mode()
                alg.auxiliary_weight = self.warm_cfg.bc_weight_at(self.iteration)
                losses = alg.update()
                for name, value in losses.items():
                    if not math.isfinite(value):
                        self._diverged(f"non-finite {name} loss at iteration {self.iteration}")
                self.iteration += 1
                metrics = self._train_metrics(episode_logs, reward_sum, losses, collect, time.time() - t0)
                out_of_time = cfg.max_minutes > 0 and (time.time() - start) / 60.0 >= cfg.max_minutes
                out_of_time = main_decides(out_of_time, self.rank, self.cfg.device)
                last = self.iteration >= cfg.iterations or out_of_time
                if (self.iteration % cfg.eval_every == 0 or last) and self.rank.is_main:
                    last_eval = self.evaluate()
                    metrics.update({f"eval/{k}": v for k, v in last_eval.items()})
                    self.history.append({"iteration": self.iteration, "env_steps": self.env_steps, **last_eval})
                self.log(metrics, self.env_steps)
                if self.iteration % cfg.save_every == 0 or last:
                    self.save(self.checkpoint_path(self.iteration))
                status = f"reward {metrics['train/step_reward']:.3f}"
                if last_eval:
                    primary = self.task.primary_metric
                    status += f"  {primary} {last_eval.get(primary, float('nan')):.0%}"
                progress.update(task, completed=self.iteration, status=status)
                if out_of_time:
                    break
        self.wall_minutes = (time.time() - start) / 60.0
        return last_eval

    def _rollout(self, obs: TensorDict) -> tuple[TensorDict, list[dict], float]:
        alg, env = self.alg, self.env
        logs: list[dict] = []
        reward_sum = 0.0
        with torch.inference_mode():
            for step in range(self.ppo_cfg.num_steps_per_env):
                actions = alg.act(obs)
                obs, rewards, dones, extras = env.step(actions)
                try:
                    check_finite(obs, rewards, self.iteration, step)
                except TrainingDiverged as err:
                    self._diverged(str(err))
                alg.process_env_step(obs, rewards, dones, extras)
                if extras["log"]:
                    logs.append(extras["log"])
                reward_sum += float(rewards.mean())
            alg.compute_returns(obs)
        self.env_steps += env.num_envs * self.ppo_cfg.num_steps_per_env * self.rank.world_size
        return obs, logs, reward_sum / self.ppo_cfg.num_steps_per_env

    def _train_metrics(self, logs, reward, losses, collect_s, total_s) -> dict[str, float]:
        metrics: dict[str, float] = {
            "train/iteration": float(self.iteration),
            "train/step_reward": reward,
            "train/learning_rate": float(self.alg.learning_rate),
            "perf/env_steps_per_s": self.env.num_envs
            * self.rank.world_size
            * self.ppo_cfg.num_steps_per_env
            / max(collect_s, 1e-9),
            "perf/iteration_s": total_s,
        }
        metrics.update({f"loss/{k}": float(v) for k, v in losses.items()})
        if self.alg.auxiliary_loss is not None:
            metrics["train/bc_weight"] = float(self.alg.auxiliary_weight)
        for key in sorted({k for log in logs for k in log}):
            values = torch.cat([log[key].float().reshape(-1) for log in logs if key in log])
            if values.numel():
                metrics[f"train/{key.split('/')[-1]}"] = float(values.mean())
        return metrics

    # ------------------------------------------------------------------------------------------- warm start
    def _warm_start(self) -> None:
        """The expert's rollouts, the cloned actor and fitted critic; then the cloned policy's evaluation, logged with
        the warm start's figures, and checkpoints at iteration 0 (the rollouts beside them)."""
        expert = self.task.expert(self.env)
        act = getattr(expert, "act", expert)
        cfg = self.warm_cfg
        rollouts, figures = run_warm_start(self.alg, self.env, act, cfg, self.ppo_cfg, self.bc_generator, self.rank)
        finite = [bool(torch.isfinite(v).all()) for v in (*rollouts.obs.values(), rollouts.actions, rollouts.rewards)]
        if not all(finite):
            self._diverged("non-finite observation, action or reward in the expert's rollouts (warm start)")
        self.env_steps += rollouts.num_samples * self.rank.world_size  # the expert's steps and the DAgger rounds
        self._use_rollouts(rollouts)
        self.warm_started, self.warm_figures = True, figures
        metrics = {f"warm_start/{k}": v for k, v in figures.items()}
        if self.rank.is_main:
            evaluation = self.evaluate()
            metrics.update({f"eval/{k}": v for k, v in evaluation.items()})
            self.history.append({"iteration": 0, "env_steps": self.env_steps, **evaluation})
        self.log(metrics, self.env_steps)
        shares = gather(rollouts.to("cpu").to_dict(), self.rank)
        if self.rank.is_main:
            payload = {"kind": EXPERT_KIND, "ranks": shares, "warm_start_yaml": to_yaml(self.warm_cfg)}
            save_atomic(payload, self.run_dir / "checkpoints" / EXPERT_FILE)
        self.save(self.checkpoint_path(0))

    def _use_rollouts(self, rollouts: ExpertRollouts) -> None:
        """Keep the expert's rollouts and hand PPO the behaviour-cloning term drawn from them (when it has a weight)."""
        self.expert_rollouts = rollouts
        if self.warm_cfg.bc_weight > 0:
            discrete = self.env.action_space.kind == "discrete"
            term = BehaviourCloning(rollouts, self.warm_cfg.bc_batch_size, discrete, self.bc_generator)
            self.alg.auxiliary_loss = term

    def _resume_rollouts(self, path: Path, state: dict[str, Any]) -> None:
        """The warm start's state from a checkpoint at `path`: its rollouts read back from beside it (and written beside
        this run's checkpoints when those are elsewhere)."""
        self.warm_started, self.warm_figures = bool(state["done"]), dict(state.get("figures", {}))
        self.bc_generator.set_state(state["bc_generator"])
        if not self.warm_started or self.warm_cfg.bc_weight == 0:
            return  # without the term the rollouts are not needed again
        source = path.parent / EXPERT_FILE
        if not source.is_file():
            raise CheckpointError(
                f"{path}: the expert rollouts of its warm start ({source}) are missing; the behaviour-cloning term "
                f"needs them to continue"
            )
        data = load_checkpoint(source, kind=EXPERT_KIND, required=("ranks",))
        rollouts = ExpertRollouts.from_dict(data["ranks"][self.rank.rank])
        if rollouts.fingerprint() != state["fingerprint"]:
            raise CheckpointError(f"{source}: not the expert rollouts {path} was trained with")
        self._use_rollouts(rollouts.to(self.alg.device))
        own = self.run_dir / "checkpoints" / EXPERT_FILE
        if self.rank.is_main and not own.is_file():
            save_atomic(data, own)

    def _warm_state(self) -> dict[str, Any]:
        rollouts = self.expert_rollouts
        return {
            "done": self.warm_started,
            "bc_generator": self.bc_generator.get_state(),
            "fingerprint": rollouts.fingerprint() if rollouts is not None else 0.0,
            "figures": dict(self.warm_figures),
        }

    def _diverged(self, message: str) -> None:
        name = f"diverged_rank{self.rank.rank}.pt" if self.rank.distributed else "diverged.pt"
        payload = {**self.checkpoint(collective=False), "diverged": message}
        path = save_atomic(payload, self.run_dir / "checkpoints" / name)
        raise TrainingDiverged(f"{message}; state written to {path}")

    # --------------------------------------------------------------------------------------------- evaluate
    def policy_fn(self):
        actor = self.alg.get_policy()

        def act(obs: TensorDict) -> torch.Tensor:
            return actor(obs)

        return act

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The task's fixed-seed evaluation episodes (dropout off, greedy actions)."""
        self.alg.eval_mode()
        metrics = self.task.evaluate(self.policy_fn(), self.eval_env, self.eval_cfg)
        self.alg.train_mode()
        return metrics

    # ------------------------------------------------------------------------------------------- checkpoints
    def checkpoint(self, collective: bool = True) -> dict[str, Any]:
        """Everything a resume needs. On several ranks (`collective`: every rank calls it at the same point) it also
        holds every rank's env and RNG state; rank 0's are the top-level ones."""
        alg = self.alg
        payload = {
            "kind": TEACHER_KIND,
            "format_version": FORMAT_VERSION,
            "task": self.task.name,
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "actor": alg.get_policy().state_dict(),
            "critic": alg._raw_critic.state_dict(),
            "optimizer": alg.optimizer.state_dict(),
            "learning_rate": float(alg.learning_rate),
            "rng": rng_state(),
            "env_state": self.env.state_dict(),
            "policy_yaml": to_yaml(self.policy_cfg),
            "ppo_yaml": to_yaml(self.ppo_cfg),
            "env_yaml": to_yaml(self.env_cfg),
            "run_config_yaml": self.run_config_yaml,
            "action_space": json.dumps(self.env.action_space.to_dict()),
            "obs_layout": self.layout.to_dict(),
            "history": json.dumps(self.history),
            "git_sha": git_sha(),
            "wandb_run_id": self.wandb_run_id,
            "world_size": self.rank.world_size,
            "warm_start_yaml": to_yaml(self.warm_cfg),
            "warm_start": self._warm_state(),
        }
        if self.rank.distributed and collective:
            own = {key: payload[key] for key in ("env_state", "rng", "warm_start")}
            payload["ranks"] = gather(own, self.rank)
        return payload

    def selected_checkpoint(self) -> tuple[Path, dict[str, float]]:
        """The checkpoint whose periodic evaluation scored best (the task's primary metric, then its selection
        metric; ties go to the later one) and that evaluation. PPO's last update is not always its best: a final
        policy picked on the evaluation guards against a late dip. The warm start's cloned policy (iteration 0) is
        not a candidate: the run's teacher is one PPO trained."""
        saved = [
            h for h in self.history if int(h["iteration"]) > 0 and self.checkpoint_path(int(h["iteration"])).is_file()
        ]
        if not saved:
            raise CheckpointError(f"{self.run_dir / 'checkpoints'}: no evaluated checkpoint to select")
        primary, selection = self.task.primary_metric, self.task.selection_metric

        def score(h: dict[str, float]) -> tuple[float, float, int]:
            finite = [float(h.get(k, float("nan"))) for k in (primary, selection)]
            first, second = (v if math.isfinite(v) else float("-inf") for v in finite)
            return first, second, int(h["iteration"])

        best = max(saved, key=score)
        return self.checkpoint_path(int(best["iteration"])), best

    def checkpoint_path(self, iteration: int) -> Path:
        return self.run_dir / "checkpoints" / f"iter_{iteration:06d}.pt"

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint (rank 0; the other ranks only contribute their state). Every rank calls it."""
        payload = self.checkpoint()
        if extra:
            payload.update(extra)
        if not self.rank.is_main:
            return Path(path)
        return save_atomic(payload, path)

    def resume(self, path: str | Path) -> None:
        """Continue exactly where the checkpoint stopped (same configs, same device)."""
        data = load_checkpoint(path, kind=TEACHER_KIND, required=("actor", "critic", "optimizer", "env_state", "rng"))
        saved = checkpoint_task(data, str(path))
        if saved.name != self.task.name:
            raise CheckpointError(f"{path}: a teacher of task {saved.name!r}, this run trains task {self.task.name!r}")
        for key, mine in (("policy_yaml", self.policy_cfg), ("ppo_yaml", self.ppo_cfg), ("env_yaml", self.env_cfg)):
            if data.get(key) != to_yaml(mine):
                raise CheckpointError(
                    f"{path}: {key[:-5]} configuration differs from this run's; resume needs the same"
                )
        if data.get("warm_start_yaml", to_yaml(WarmStartConfig())) != to_yaml(self.warm_cfg):
            raise CheckpointError(f"{path}: warm_start configuration differs from this run's; resume needs the same")
        check_world(int(data.get("world_size", 1)), self.rank, str(path))
        alg = self.alg
        try:
            alg.get_policy().load_state_dict(data["actor"])
            alg._raw_critic.load_state_dict(data["critic"])
        except RuntimeError as err:
            raise CheckpointError(f"{path}: weights do not fit this policy ({str(err)[:300]})") from None
        alg.optimizer.load_state_dict(data["optimizer"])
        alg.learning_rate = float(data["learning_rate"])
        for group in alg.optimizer.param_groups:
            group["lr"] = alg.learning_rate
        own = data["ranks"][self.rank.rank] if self.rank.distributed else data
        self.env.load_state_dict(own["env_state"])
        set_rng_state(own["rng"])
        if "warm_start" in own:
            self._resume_rollouts(Path(path), own["warm_start"])
        self.iteration, self.env_steps = int(data["iteration"]), int(data["env_steps"])
        self.history = json.loads(data["history"])
        self.wandb_run_id = data["wandb_run_id"] or self.wandb_run_id


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest `iter_*.pt` of a run directory (what `--resume` continues from)."""
    ckpts = sorted((Path(run_dir) / "checkpoints").glob("iter_*.pt"))
    return ckpts[-1] if ckpts else None
