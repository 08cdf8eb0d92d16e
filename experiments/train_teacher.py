"""Train the privileged teacher with PPO (rsl_rl) on ground-truth state and the randomized world.

    python -m experiments.train_teacher default                      # a 5-minute budget
    python -m experiments.train_teacher smoke --run-dir /tmp/t
    python -m experiments.train_teacher default --resume runs/teacher  # continue the latest checkpoint exactly
    python -m experiments.train_teacher fast-throttle                # higher max speed in training
    torchrun --nproc-per-node 2 -m experiments.train_teacher default --distributed   # data-parallel over 2 ranks
    python -m experiments.train_teacher default --task bimanual-lift  # the bar lift, warm-started from its expert
    python -m experiments.train_teacher default --task bimanual-handover  # the cube handover, likewise

`--warm-start.expert-steps N` (on in the bimanual presets) starts from the task's scripted expert: N control steps of
its rollouts per env, behaviour cloning of the actor's mean on them (and `--warm-start.dagger-rounds` rounds in which
the clone drives while the expert labels its states, each followed by cloning on all labels), a critic fit, the cloned
policy evaluated and checkpointed at iteration 0, then PPO with a cloning term of weight
`bc_weight * bc_decay ** iteration` in its loss.

A run directory holds `config.yaml`, `checkpoints/iter_*.pt` (every checkpoint kept), `teacher.pt` (the checkpoint
whose periodic evaluation scored best, the latest of equals: the teacher to distill), `eval.json`, plots, and the
W&B files (`--wandb.mode online|offline|disabled`, default offline). With `--distributed` under torchrun every rank
steps `env.num_envs / world size` envs of its own and rank 0 logs, evaluates and writes the run directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.table import Table

from datasets.checkpoints import load_checkpoint, save_atomic
from datasets.run_layout import TEACHER_FILE
from datasets.run_logger import RunLogger, WandbConfig, check_login
from envs.bimanual.config import BimanualConfig, ObservationConfig
from envs.bimanual.handover import HandoverConfig
from envs.bimanual.task import BimanualEvalConfig
from envs.camera_model import CameraConfig
from envs.config_io import to_yaml, write_text_atomic
from envs.console import make_console
from envs.distributed import init_distributed, shutdown
from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from envs.racing.effects import EffectsConfig
from envs.racing.evaluation import EvalConfig, evaluate
from envs.racing.randomization import RandomizationConfig
from envs.racing.sensor import SensorConfig
from envs.racing.visualize import plot_trajectories
from envs.task import task_of_config
from experiments.cli import run
from teacher.config import PPOConfig, TeacherPolicyConfig, WarmStartConfig
from teacher.policy import TEACHER_KIND
from teacher.trainer import TeacherTrainer, TrainerConfig, latest_checkpoint


@dataclass(frozen=True)
class TrainTeacherConfig:
    """A teacher training run."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=512, compile=True))
    """training env (bicycle physics, full randomization, no camera)"""
    policy: TeacherPolicyConfig = field(default_factory=TeacherPolicyConfig)
    """actor-critic"""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO"""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """length, budget, evaluation and checkpoint cadence"""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """a warm start from the task's scripted expert (behaviour cloning, critic fit, a decaying cloning term in PPO's
    loss); off at `expert_steps` 0"""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(start_points=6, laps=1, max_seconds=30.0))
    """periodic evaluation: fixed start points, both directions, the training randomization"""
    final_eval: EvalConfig = field(
        default_factory=lambda: EvalConfig(start_points=50, repeats=2, laps=1, max_seconds=30.0, seed=4321)
    )
    """the final report's evaluation (100 episodes per direction and track, a seed the periodic evaluation never
    used)"""
    generalization_tracks: tuple[str, ...] = ()
    """tracks the final teacher is also evaluated on (it never trained there)"""
    run_dir: str = "runs/teacher"
    """run directory"""
    resume: str = ""
    """checkpoint file, or a run directory (its latest checkpoint), to continue exactly"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """W&B logging"""
    distributed: bool = False
    """data-parallel training over the processes torchrun starts (`torchrun --nproc-per-node N -m
    experiments.train_teacher ... --distributed`): gloo on CPU, nccl on CUDA; `env.num_envs` is the total over ranks"""
    distributed_timeout_s: float = 300.0
    """how long a rank waits for the others at a collective before the run fails (a rank that dies fails the others
    at once)"""

    def __post_init__(self) -> None:
        task = task_of_config(self.env)
        self.policy.check_factors(task.factor_names)
        self.warm_start.check_task(task.name, task.expert is not None)
        if self.env.camera != "none":
            raise ConfigError("env.camera must be 'none' for the teacher (it reads ground truth, not images)")


TEACHER_OBS = ObservationConfig(proprio=False, camera=False)
"""the bimanual teacher's observation groups: ground truth and the world (the student's env turns the rest on)"""


@dataclass(frozen=True)
class TrainBimanualTeacherConfig(TrainTeacherConfig):
    """A teacher training run of the two-arm bar lift (`--task bimanual-lift`)."""

    env: BimanualConfig = field(default_factory=lambda: BimanualConfig(num_envs=64, observations=TEACHER_OBS))
    """training env (full randomization; the groups the teacher reads, no camera)"""
    eval: BimanualEvalConfig = field(default_factory=lambda: BimanualEvalConfig(episodes=32))
    """periodic evaluation: fixed-seed episodes in the training randomization"""
    final_eval: BimanualEvalConfig = field(default_factory=lambda: BimanualEvalConfig(episodes=100, seed=4321))
    """the final report's evaluation (a seed the periodic evaluation never used)"""

    def __post_init__(self) -> None:
        task = task_of_config(self.env)
        self.policy.check_factors(task.factor_names)
        self.warm_start.check_task(task.name, task.expert is not None)
        if self.env.observations.camera:
            raise ConfigError("env.observations.camera must be off for the teacher (it reads ground truth, not images)")
        if self.generalization_tracks:
            raise ConfigError("generalization_tracks are racing's; the bimanual task has none")


@dataclass(frozen=True)
class TrainHandoverTeacherConfig(TrainBimanualTeacherConfig):
    """A teacher training run of the two-arm cube handover (`--task bimanual-handover`)."""

    env: HandoverConfig = field(default_factory=lambda: HandoverConfig(num_envs=64, observations=TEACHER_OBS))
    """training env (full randomization; the groups the teacher reads, no camera)"""


def resume_path(spec: str) -> Path:
    path = Path(spec)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise ConfigError(f"--resume {spec}: no checkpoints/iter_*.pt in that run directory")
        return found
    return path


def racing_report(cfg, policy, summary: dict, logger, env_steps: int, run_dir: Path, title: str) -> Table:
    """The final racing report: the training track (with trajectories) and the held-out tracks."""
    table = Table(title=title)
    for col in ("track", "laps done (fwd / rev)", "lap time (s)", "lap / optimal", "off-track"):
        table.add_column(col)
    for track in (cfg.env.track, *cfg.generalization_tracks):
        metrics, records, env = evaluate(policy, replace(cfg.env, track=track), cfg.final_eval)
        summary[f"eval/{track}"] = metrics
        table.add_row(
            env.track.name, f"{metrics['forward/lap_completion']:.0%} / {metrics['reverse/lap_completion']:.0%}",
            f"{metrics['lap_time']:.2f}", f"{metrics['lap_time_ratio']:.2f}", f"{int(metrics['offtrack_count'])}",
        )  # fmt: skip
        plot = plot_trajectories(
            env.track, [r.path for r in records], run_dir / f"trajectories_{env.track.name}.png",
            colors=["tab:blue" if r.direction == "forward" else "tab:orange" for r in records],
            title=f"teacher on {env.track.name}: {metrics['lap_completion']:.0%} laps (blue fwd, orange rev)",
        )  # fmt: skip
        logger.image(f"plots/trajectories_{env.track.name}", plot, env_steps)
    return table


def task_report(cfg, trainer: TeacherTrainer, policy, summary: dict, title: str) -> Table:
    """The final report of a task other than racing: its own evaluation (`final_eval`), every metric it returns (the
    periodic evaluation's env is reused when `final_eval` equals `eval`)."""
    task = trainer.task
    env = trainer.eval_env if cfg.final_eval == cfg.eval else task.make_eval_env(cfg.env, cfg.final_eval)
    metrics = task.evaluate(policy, env, cfg.final_eval)
    summary["final_eval"] = metrics
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value")
    for name, value in metrics.items():
        table.add_row(name, f"{value:.3g}")
    return table


def main(cfg: TrainTeacherConfig) -> dict:
    check_login(cfg.wandb)
    rank = init_distributed(cfg.distributed, cfg.trainer.device, cfg.distributed_timeout_s, "experiments.train_teacher")
    console = make_console()
    run_dir = Path(cfg.run_dir)
    ckpt = resume_path(cfg.resume) if cfg.resume else None
    config_yaml = to_yaml(cfg)
    if rank.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", config_yaml)
    t0 = time.time()
    trainer = TeacherTrainer(
        cfg.env, cfg.policy, cfg.ppo, cfg.trainer, cfg.eval, run_dir, config_yaml, rank=rank, warm_start=cfg.warm_start
    )
    if ckpt is not None:
        trainer.resume(ckpt)
        if rank.is_main:
            console.print(f"resumed from {ckpt} at iteration {trainer.iteration}")
    if not rank.is_main:  # rank 0 logs, evaluates and writes; the others train
        trainer.train(show_progress=False)
        shutdown(rank)
        return {}
    logger = RunLogger(cfg.wandb, run_dir, name=run_dir.name, config=cfg, run_id=trainer.wandb_run_id)
    trainer.log, trainer.wandb_run_id = logger.log, logger.run_id
    final = trainer.train()
    shutdown(rank)
    # The run's teacher: the best-evaluated checkpoint (PPO's last update is not always its best).
    selected, selected_eval = trainer.selected_checkpoint()
    payload = load_checkpoint(selected, kind=TEACHER_KIND, required=("actor",))
    teacher_file = save_atomic(payload, run_dir / TEACHER_FILE)
    trainer.alg.get_policy().load_state_dict(payload["actor"])
    summary = {"train_eval": final, "iterations": trainer.iteration, "env_steps": trainer.env_steps}
    summary["world_size"] = rank.world_size
    cloned = [h for h in trainer.history if int(h["iteration"]) == 0]
    if trainer.warm_started:  # the warm start's figures and its cloned policy's evaluation, before PPO
        summary["warm_start"] = {**trainer.warm_figures, "eval": cloned[0] if cloned else {}}
    summary["checkpoint"] = str(teacher_file)
    summary["selected"] = {"checkpoint": str(selected), "iteration": int(selected_eval["iteration"]), **selected_eval}
    summary["wall_minutes"] = (time.time() - t0) / 60.0
    # Final report: racing's tracks (with trajectories); another task's own evaluation through the task contract.
    policy = trainer.policy_fn()
    trainer.alg.eval_mode()
    chosen, minutes = int(selected_eval["iteration"]), summary["wall_minutes"]
    title = f"teacher: iteration {chosen} of {trainer.iteration} ({minutes:.1f} min)"
    if trainer.task.name == "racing":
        summary["optimal_lap_time"] = trainer.eval_env.optimal_lap_time
        table = racing_report(cfg, policy, summary, logger, trainer.env_steps, run_dir, title)
    else:
        table = task_report(cfg, trainer, policy, summary, title)
    console.print(table)
    write_text_atomic(run_dir / "eval.json", json.dumps(summary, indent=2))
    logger.artifact(teacher_file, f"teacher-{run_dir.name}", "model")
    logger.finish()
    console.print(
        f"teacher: [bold]{teacher_file.resolve()}[/] (iteration {chosen}); run directory: "
        f"{run_dir.resolve()} (checkpoints/, eval.json, trajectories_*.png)"
    )
    return summary


TRANSFER_ENV = EnvConfig(
    num_envs=512, compile=True,
    optics=CameraConfig(lens="fisheye"),  # the car's lens, as calibrated (the teacher passes it on to its student)
    sensor=SensorConfig(vignetting=0.2, read_noise=3.0),
    randomization=RandomizationConfig(
        friction_range=(0.6, 1.2), action_latency_ms=(0.0, 120.0), camera_latency_ms=(0.0, 80.0), rear_grip=True
    ),
    effects=EffectsConfig(
        randomize=True, battery_floor=0.8, servo_rate_dps=300.0, steering_deadband_deg=1.5, throttle_exponent=1.35,
        latency_jitter_ms=30.0, steering_offset_deg=1.5,
    ),
)  # fmt: skip
"""a training world for transfer: wider than the default randomization, with the unmodeled effects drawn per env"""

PRESETS = {
    "default": ("bicycle physics, full randomization, 5-minute budget", TrainTeacherConfig(
        trainer=TrainerConfig(iterations=400, max_minutes=5.0, eval_every=10, save_every=10),
        generalization_tracks=("oval", "technical"),
    )),
    "fast-throttle": ("as default with higher speeds in the action space", TrainTeacherConfig(
        env=EnvConfig(num_envs=512, compile=True, action_space="fast-throttle"),
        trainer=TrainerConfig(iterations=400, max_minutes=5.0, eval_every=10, save_every=10),
        generalization_tracks=("oval", "technical"),
    )),
    "transfer": ("as default, trained for the real car: the calibrated fisheye lens and sensor, wider friction and "
                 "latency ranges, the grip balance between the axles and the unmodeled actuation effects randomized",
                 TrainTeacherConfig(
        env=TRANSFER_ENV,
        trainer=TrainerConfig(iterations=400, max_minutes=5.0, eval_every=10, save_every=10),
    )),
    "smoke": ("a few iterations at 32 envs, no compile (checks the pipeline)", TrainTeacherConfig(
        env=EnvConfig(num_envs=32, compile=False),
        ppo=PPOConfig(num_steps_per_env=8),
        trainer=TrainerConfig(iterations=3, eval_every=2, save_every=1),
        eval=EvalConfig(start_points=1, laps=1, max_seconds=4.0),
        final_eval=EvalConfig(start_points=1, laps=1, max_seconds=4.0),
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

BIMANUAL_PRESETS = {
    "default": ("the two-arm bar lift at 64 envs, full randomization, 30-minute budget, warm-started from the "
                "scripted expert", TrainBimanualTeacherConfig(
        ppo=PPOConfig(num_steps_per_env=32),
        trainer=TrainerConfig(iterations=2000, max_minutes=30.0, eval_every=25, save_every=25),
        warm_start=WarmStartConfig(
            expert_steps=480, bc_epochs=50, dagger_rounds=3, critic_epochs=20, bc_weight=1.0, bc_decay=0.995
        ),
    )),
    "smoke": ("a few iterations at 4 envs, 2-second episodes (checks the pipeline)", TrainBimanualTeacherConfig(
        env=BimanualConfig(num_envs=4, episode_seconds=2.0, observations=TEACHER_OBS),
        ppo=PPOConfig(num_steps_per_env=8),
        trainer=TrainerConfig(iterations=2, eval_every=2, save_every=1),
        warm_start=WarmStartConfig(
            expert_steps=8, bc_epochs=2, dagger_rounds=1, bc_batch_size=16, critic_epochs=1, bc_weight=1.0
        ),
        eval=BimanualEvalConfig(episodes=2),
        final_eval=BimanualEvalConfig(episodes=2),
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

HANDOVER_PRESETS = {
    "default": ("the two-arm cube handover at 64 envs, full randomization, 20-minute budget, warm-started from the "
                "scripted expert (five DAgger rounds, a narrow exploration std) and held near it by a constant "
                "cloning term at a low learning rate", TrainHandoverTeacherConfig(
        ppo=PPOConfig(num_steps_per_env=32, learning_rate=1e-4),
        trainer=TrainerConfig(iterations=2000, max_minutes=20.0, eval_every=25, save_every=25),
        warm_start=replace(BIMANUAL_PRESETS["default"][1].warm_start, dagger_rounds=5, init_std=0.1, bc_weight=5.0,
                           bc_decay=1.0),
    )),
    "smoke": ("a few iterations at 4 envs, 2-second episodes (checks the pipeline)", TrainHandoverTeacherConfig(
        env=HandoverConfig(num_envs=4, episode_seconds=2.0, observations=TEACHER_OBS),
        ppo=PPOConfig(num_steps_per_env=8),
        trainer=TrainerConfig(iterations=2, eval_every=2, save_every=1),
        warm_start=BIMANUAL_PRESETS["smoke"][1].warm_start,
        eval=BimanualEvalConfig(episodes=2),
        final_eval=BimanualEvalConfig(episodes=2),
        wandb=WandbConfig(mode="disabled"),
    )),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS, "bimanual-lift": BIMANUAL_PRESETS, "bimanual-handover": HANDOVER_PRESETS},
        description=__doc__)  # fmt: skip
