"""The DAgger run: collection envs, shards and manifest, student training, evaluation, checkpoints and resume.

On several ranks (`envs.distributed`, launched by torchrun) each rank drives its share of the collection envs in its
own worlds and writes its own shard per round (`round_NNN_rankK.h5`); rank 0 lists every rank's shards in the
manifest, every rank samples its share of the training windows from all of them, and the gradients are averaged over
the ranks (data parallel, as DDP does). The β schedule and the rounds are the same as on one process. Rank 0 alone
evaluates, logs and writes checkpoints, which hold every rank's env and RNG state for an exact resume.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from adaptation.estimator_fit import episode_inputs, fit_estimator
from datasets.checkpoints import CheckpointError, git_sha, load_checkpoint, rng_state, save_atomic, set_rng_state
from datasets.rollouts import (
    SCHEMA_VERSION,
    ShardWriter,
    WindowReader,
    add_shard,
    read_manifest,
    rollout_schema,
    write_manifest,
)
from datasets.staging import EpisodeStager
from envs.augment import AugmentConfig, augment
from envs.config_io import to_yaml
from envs.distributed import (
    SINGLE,
    Rank,
    average_gradients,
    barrier,
    broadcast_parameters,
    check_world,
    env_share,
    gather,
    main_decides,
    per_rank,
)
from envs.errors import ConfigError
from envs.progress import stage_progress
from envs.task import Task, task_of_config
from student.dagger import (
    DaggerConfig,
    choose_actions,
    collection_world,
    round_learning_rate,
    teacher_probability,
    train_step,
    use_bf16,
)
from student.loaded import FORMAT_VERSION, STUDENT_KIND, checkpoint_spec
from student.model import OutputSpec, StudentConfig, StudentModel, StudentPolicy
from student.teacher_head import teacher_head_spec
from teacher.policy import ObsLayout, TeacherPolicy

LogFn = Callable[[dict[str, float], int], None]


def output_spec(
    task: Task,
    env,
    teacher: TeacherPolicy,
    privileged: bool = False,
    frozen_head: bool = False,
    proprio: str = "previous-action",
) -> OutputSpec:
    """What a student distilled from `teacher` in `env` of `task` reads and predicts: the env's camera frames and, of
    its `proprio` group, the previous action (`proprio` `previous-action`) or the whole group (`all`); `privileged`:
    also the teacher's own observation, the `teacher` group, as an auxiliary target; `frozen_head`: that estimate and
    z-hat feed the teacher's frozen trunk, which expects the env's observation layout."""
    space = env.action_space
    head = teacher_head_spec(teacher, task, ObsLayout.of_env(env, task.factor_names)) if frozen_head else None
    obs = env.get_observations()
    width = obs["proprio"].shape[-1] if proprio == "all" else task.previous_action_dim
    return OutputSpec(
        kind=space.kind,
        num_outputs=space.num_outputs,
        latent_dim=teacher.actor.factor_encoder.latent_dim,
        estimates=task.estimates,
        latency_classes=task.latency_classes(env.cfg),
        proprio_dim=width,
        task=task.name,
        privileged_dim=teacher.layout.teacher if privileged or frozen_head else 0,
        teacher_head=head,
        image_hw=tuple(obs["camera"].shape[-2:]),
        previous_action_dim=task.previous_action_dim if width != task.previous_action_dim else 0,
    )


class Distiller:
    def __init__(
        self,
        teacher: TeacherPolicy,
        env_cfg,
        student_cfg: StudentConfig,
        dagger_cfg: DaggerConfig,
        augment_cfg: AugmentConfig,
        eval_cfg,
        run_dir: str | Path,
        teacher_path: str = "",
        log: LogFn | None = None,
        rank: Rank = SINGLE,
    ) -> None:
        self.teacher, self.cfg, self.student_cfg, self.augment_cfg = teacher, dagger_cfg, student_cfg, augment_cfg
        self.eval_cfg, self.run_dir, self.teacher_path = eval_cfg, Path(run_dir), teacher_path
        self.log = log or (lambda metrics, step: None)
        self.rank = rank
        if student_cfg.head == "frozen-teacher" and dagger_cfg.privileged_weight <= 0:
            raise ConfigError(
                "--student.head frozen-teacher trains its estimate of the teacher's observation with "
                "--dagger.privileged-weight, which is 0: set it above 0 (e.g. 0.5)"
            )
        torch.manual_seed(dagger_cfg.seed)
        self.task = task_of_config(env_cfg)
        self.env_cfg = self.task.student_env_config(env_cfg, dagger_cfg.envs, dagger_cfg.steps_per_round)
        self.task.require_groups(self.env_cfg, ("teacher", "env_factors"), "the teacher")
        self.task.require_groups(self.env_cfg, ("camera", "proprio"), "the student")
        self.batch_windows = per_rank(dagger_cfg.batch_windows, rank, "dagger.batch_windows")
        self.env = self.task.make_env(collection_world(env_share(self.env_cfg, rank, "dagger.envs"), dagger_cfg))
        teacher.check_env(self.env)
        self.task.check_groups(self.env, ("camera", "proprio"), "the student")
        self.spec = output_spec(
            self.task, self.env, teacher, dagger_cfg.privileged_weight > 0, student_cfg.head == "frozen-teacher",
            student_cfg.proprio,
        )  # fmt: skip
        # The student and the teacher run where the env's tensors are (a CUDA env: on that GPU); the mixing draws stay
        # on the CPU, the augmentation's on the device.
        self.device = torch.device(getattr(self.env_cfg, "device", "cpu"))
        teacher.to(self.device)
        self.model = StudentModel(student_cfg, self.spec).to(self.device)
        # The privileged head's targets are normalized as the teacher's network reads them; a frozen head takes the
        # teacher's trunk (and the optimizer never sees it).
        self.model.adopt_teacher(teacher)
        broadcast_parameters(self.model, rank)
        self.optimizer = torch.optim.Adam(self.model.trainable_parameters(), lr=dagger_cfg.learning_rate)
        self.ema = (
            AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(dagger_cfg.ema_decay))
            if dagger_cfg.ema_decay > 0
            else None
        )  # its buffers (the privileged head's normalization, set above) are copied once and never change
        self.policy = StudentPolicy(self.student, self.env.num_envs, self.device)
        self.eval_env = (
            self.task.make_eval_env(self.task.student_env_config(env_cfg, env_cfg.num_envs, None), eval_cfg)
            if rank.is_main
            else None
        )
        self.data_dir = self.run_dir / "data"
        obs = self.env.get_observations()
        self.schema = rollout_schema(
            self.spec.num_outputs, self.spec.latent_dim, obs["env_factors"].shape[-1], len(self.task.estimates.targets),
            obs["teacher"].shape[-1], self.spec.proprio_dim, self.env.action_space.num_actions, self.spec.image_hw,
        )  # fmt: skip
        self.round, self.episodes, self.samples = 0, 0, 0
        self.wall_minutes = 0.0  # DAgger wall time so far, across resumes
        self.history: list[dict[str, float]] = []
        self.estimator_fit: dict[str, float] = {}  # the factor estimator's fit after the last round (scores)
        seed = rank.seed(dagger_cfg.seed)  # the run's seed on rank 0: a single-process run is unchanged
        if rank.distributed:
            torch.manual_seed(seed)  # the same initial student everywhere (above), then each rank its own draws
        self.aug_generator = torch.Generator(device=self.device).manual_seed(seed + 1)
        self.mix_generator = torch.Generator().manual_seed(seed + 2)
        self.np_rng = np.random.default_rng(seed + 3)

    @property
    def student(self) -> StudentModel:
        """The student that drives, is evaluated, saved as the checkpoint's `model` and exported: the trained weights'
        moving average with `--dagger.ema-decay`, else the trained weights themselves (`model`)."""
        return self.model if self.ema is None else self.ema.module

    # --------------------------------------------------------------------------------------------- collect
    @torch.no_grad()
    def collect(self) -> dict[str, float]:
        """Drive one round and write its shard (one whole episode per staged block)."""
        env, cfg, r = self.env, self.cfg, self.round
        obs, _ = env.reset()
        self.policy.resize(env.num_envs)
        stager = EpisodeStager(env.num_envs, cfg.steps_per_round, self.schema)
        rank = self.rank
        suffix = f"_rank{rank.rank}" if rank.distributed else ""
        path = self.data_dir / f"round_{r:03d}{suffix}.h5"
        attrs = {"round": r, "teacher": self.teacher_path, "rank": rank.rank}
        writer = ShardWriter(path, self.schema, attrs=attrs)
        # Episode ids are unique over the ranks: this rank's running count interleaved with the others'.
        episode_ids = (self.episodes + np.arange(env.num_envs)) * rank.world_size + rank.rank
        self.episodes += env.num_envs
        used_student, agree, rows_written = 0.0, 0.0, 0
        for _ in range(cfg.steps_per_round):
            step_in_ep = env.episode_length_buf.cpu().numpy().copy()
            teacher_logits = self.teacher.logits(obs)
            teacher_action = self.teacher.act(obs)
            student_action = self.policy.act(obs)
            executed, by_student = choose_actions(
                cfg, r, teacher_logits, teacher_action, student_action, self.mix_generator
            )
            row = {
                "camera": obs["camera"].cpu().numpy(),
                "prev_action": obs["proprio"][:, : self.spec.proprio_dim].cpu().numpy(),
                "teacher_logits": teacher_logits.cpu().numpy(),
                "teacher_action": teacher_action.cpu().numpy(),
                "student_action": student_action.cpu().numpy(),
                "executed_action": executed.cpu().numpy(),
                "z": self.teacher.z(obs).cpu().numpy(),
                "env_factors": obs["env_factors"].cpu().numpy(),
                "targets": self.task.estimate_targets(env).cpu().numpy(),
                "privileged": obs["teacher"].cpu().numpy(),  # raw: the teacher's normalizer is applied in the loss
                "episode": episode_ids.copy(),
                "step": step_in_ep.astype(np.int32),
            }
            obs, _, dones, extras = env.step(executed)
            self.policy.reset(dones)
            row["terminated"] = extras["terminated"].cpu().numpy()
            row["truncated"] = extras["time_outs"].cpu().numpy()
            stager.add(row)
            used_student += float(by_student.float().mean())
            agree += float((student_action == teacher_action).all(-1).float().mean())
            done_ids = np.nonzero(dones.cpu().numpy())[0]
            if len(done_ids):
                rows = stager.pop(done_ids)
                writer.append(rows)
                rows_written += len(rows["episode"])
                episode_ids[done_ids] = (self.episodes + np.arange(len(done_ids))) * rank.world_size + rank.rank
                self.episodes += len(done_ids)
        pending = stager.pending()
        if len(pending):
            rows = stager.pop(pending)
            rows["truncated"][-1] = True
            writer.append(rows)
            rows_written += len(rows["episode"])
        writer.close()
        shards = gather((path.name, rows_written), rank)  # every rank's shard of this round, in rank order
        if rank.is_main:
            for k, (name, rows) in enumerate(shards):
                add_shard(self.data_dir, name, {"round": r, "rows": rows, "rank": k})
        barrier(rank)  # the manifest lists every shard before any rank reads it
        self.samples += sum(rows for _, rows in shards)
        steps = cfg.steps_per_round
        return {
            "collect/beta": teacher_probability(cfg, r),
            "collect/student_share": used_student / steps,
            "collect/student_teacher_agreement": agree / steps,
            "collect/rows": float(rows_written),
        }

    # ----------------------------------------------------------------------------------------------- train
    def train(self) -> dict[str, float]:
        cfg = self.cfg
        window = self.student_cfg.context + cfg.labels_per_window
        fields = ("camera", "prev_action", "teacher_logits", "z", "targets")
        if cfg.privileged_weight > 0:
            fields += ("privileged",)
        reader = WindowReader(self.data_dir, fields, window, cache_bytes=cfg.cache_mb * 1024**2, schema=self.schema)
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = round_learning_rate(cfg, self.round)
        sums: dict[str, float] = {}
        sync = (lambda: average_gradients(self.model.parameters(), self.rank)) if self.rank.distributed else None
        try:
            for _ in range(cfg.train_steps):
                batch = reader.sample(self.batch_windows, self.np_rng)
                stats = train_step(
                    self.model, self.optimizer, batch, cfg, self.task.dt_physics(self.env_cfg),
                    lambda x: augment(x, self.augment_cfg, self.aug_generator, compiled=True),
                    sync_gradients=sync,
                )  # fmt: skip
                if self.ema is not None:
                    self.ema.update_parameters(self.model)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
        finally:
            reader.close()
        out = {k: v / cfg.train_steps for k, v in sums.items()}
        out["data/rows"] = float(reader.total_rows)
        return out

    def fit_estimator(self) -> dict[str, float]:
        """The factor estimator fitted alone on every recorded episode (after the last round's training)."""
        if self.student.estimator is None or self.cfg.estimator_fit_steps == 0:
            return {}
        cfg = self.cfg
        self.student.cpu()  # the replay and the fit read the shards on the CPU (the estimator is small)
        try:
            data = episode_inputs(self.student, self.data_dir, bf16=use_bf16(cfg))
            self.estimator_fit = fit_estimator(
                self.student.estimator,
                data,
                self.task.dt_physics(self.env_cfg),
                steps=cfg.estimator_fit_steps,
                seed=cfg.seed,
            )
        finally:
            self.student.to(self.device)
        return {f"estimator_fit/{k}": v for k, v in self.estimator_fit.items()}

    # --------------------------------------------------------------------------------------------- evaluate
    def evaluate(self) -> dict[str, float]:
        policy = StudentPolicy(self.student, self.eval_env.num_envs, self.device)
        return self.task.evaluate(policy.act, self.eval_env, self.eval_cfg, reset=policy.reset)

    # ---------------------------------------------------------------------------------------------- loop
    def run(self, show_progress: bool = True) -> dict[str, float]:
        cfg = self.cfg
        start = time.time() - 60.0 * self.wall_minutes  # wall time counts across resumes (the budget is the run's)
        last: dict[str, float] = {}
        rank = self.rank
        progress = stage_progress("DAgger", disable=not (show_progress and rank.is_main))
        if self.round == 0 and rank.is_main:
            # A fresh run owns its data: shards an earlier run left in this directory (perhaps of an older schema)
            # are no longer listed, so training never mixes them in; their files are overwritten round by round.
            write_manifest(self.data_dir, {"schema_version": SCHEMA_VERSION, "shards": []})
        barrier(rank)
        with progress:
            task = progress.add_task("dagger", total=cfg.rounds, completed=self.round, status="")
            while self.round < cfg.rounds:
                t0 = time.time()
                metrics = self.collect()
                t1 = time.time()
                metrics.update(self.train())
                out_of_time = cfg.max_minutes > 0 and (time.time() - start) / 60.0 >= cfg.max_minutes
                out_of_time = main_decides(out_of_time, rank)
                if self.round == cfg.rounds - 1 or out_of_time:
                    metrics.update(self.fit_estimator())  # on every rank: the same data, seed and result
                t2 = time.time()
                last = self.evaluate() if rank.is_main else {}
                metrics.update({f"eval/{k}": v for k, v in last.items()})
                metrics.update({"perf/collect_s": t1 - t0, "perf/train_s": t2 - t1, "perf/eval_s": time.time() - t2})
                metrics["dagger/round"] = float(self.round)
                self.round += 1
                self.history.append({"round": self.round, "samples": self.samples, **last})
                self.wall_minutes = (time.time() - start) / 60.0
                self.log(metrics, self.samples)
                self.save(self.run_dir / "checkpoints" / f"round_{self.round:03d}.pt")
                primary = self.task.primary_metric
                status = f"{primary} {last.get(primary, float('nan')):.0%}"
                if "train/agreement" in metrics:  # a discrete policy's; a continuous one shows its action loss
                    status += f"  agree {metrics['train/agreement']:.2f}"
                elif "loss/action" in metrics:
                    status += f"  action loss {metrics['loss/action']:.4f}"
                progress.update(task, completed=self.round, status=status)
                if out_of_time:  # decided before the estimator fit, so a run that stops has its estimator fitted
                    break
        self.wall_minutes = (time.time() - start) / 60.0
        return last

    # ------------------------------------------------------------------------------------------ checkpoints
    def _rank_state(self) -> dict[str, Any]:
        """What each rank has of its own: its envs, RNGs and episode count."""
        return {
            "env_state": self.env.state_dict(),
            "rng": rng_state(),
            "generators": {
                "augment": self.aug_generator.get_state(),
                "mix": self.mix_generator.get_state(),
                "numpy": json.dumps(self.np_rng.bit_generator.state),
            },
            "episodes": self.episodes,
        }

    def checkpoint(self) -> dict[str, Any]:
        """Everything a resume needs; on several ranks every rank calls it at the same point (it gathers their
        states)."""
        ranks = gather(self._rank_state(), self.rank) if self.rank.distributed else None
        payload = {
            "kind": STUDENT_KIND,
            "format_version": FORMAT_VERSION,
            "task": self.task.name,
            "round": self.round,
            "episodes": self.episodes,
            "samples": self.samples,
            "wall_minutes": self.wall_minutes,
            "model": self.student.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(),
            "generators": {
                "augment": self.aug_generator.get_state(),
                "mix": self.mix_generator.get_state(),
                "numpy": json.dumps(self.np_rng.bit_generator.state),
            },
            "env_state": self.env.state_dict(),
            "student_yaml": to_yaml(self.student_cfg),
            "dagger_yaml": to_yaml(self.cfg),
            "augment_yaml": to_yaml(self.augment_cfg),
            "env_yaml": to_yaml(self.env_cfg),
            "output_spec": self.spec.to_dict(),
            "action_space": json.dumps(self.env.action_space.to_dict()),
            "manifest": json.dumps(read_manifest(self.data_dir)),
            "history": json.dumps(self.history),
            "estimator_fit": json.dumps(self.estimator_fit),
            "teacher_path": self.teacher_path,
            "git_sha": git_sha(),
            "world_size": self.rank.world_size,
        }
        if self.ema is not None:  # the weights being trained, and how many steps the average holds
            payload["trained_model"] = self.model.state_dict()
            payload["ema_steps"] = int(self.ema.n_averaged)
        if ranks is not None:
            payload["ranks"] = ranks
        return payload

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint (rank 0; the other ranks only contribute their state). Every rank calls it."""
        payload = self.checkpoint()
        return save_atomic(payload, path) if self.rank.is_main else Path(path)

    def resume(self, path: str | Path) -> None:
        """Continue after the checkpoint's round; a round interrupted later is redone from its start."""
        data = load_checkpoint(path, kind=STUDENT_KIND, required=("model", "optimizer", "round", "env_state"))
        saved = checkpoint_spec(data, str(path))
        if saved.task != self.task.name:
            raise CheckpointError(
                f"{path}: a student of task {saved.task!r}, this run distills task {self.task.name!r}"
            )
        for key, mine in (("student_yaml", self.student_cfg), ("dagger_yaml", self.cfg), ("env_yaml", self.env_cfg)):
            if data.get(key) != to_yaml(mine):
                raise CheckpointError(
                    f"{path}: {key[:-5]} configuration differs from this run's; resume needs the same"
                )
        check_world(int(data.get("world_size", 1)), self.rank, str(path))
        own = data["ranks"][self.rank.rank] if self.rank.distributed else data
        self.model.load_state_dict(data.get("trained_model", data["model"]))
        if self.ema is not None:
            self.ema.module.load_state_dict(data["model"])
            self.ema.n_averaged.fill_(int(data.get("ema_steps", 0)))
        self.optimizer.load_state_dict(data["optimizer"])
        set_rng_state(own["rng"])
        self.aug_generator.set_state(own["generators"]["augment"])
        self.mix_generator.set_state(own["generators"]["mix"])
        self.np_rng.bit_generator.state = json.loads(own["generators"]["numpy"])
        self.env.load_state_dict(own["env_state"])
        self.round, self.episodes, self.samples = int(data["round"]), int(own["episodes"]), int(data["samples"])
        self.wall_minutes = float(data["wall_minutes"])
        self.history = json.loads(data["history"])
        self.estimator_fit = json.loads(data["estimator_fit"])
        # Drop shards of rounds after the checkpoint (an interrupted round is collected again).
        if self.rank.is_main:
            write_manifest(self.data_dir, json.loads(data["manifest"]))
        barrier(self.rank)
