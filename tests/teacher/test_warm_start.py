"""The expert warm start of the teacher on a toy task with a scripted expert (a point mass whose expert pushes it to the
goal through its actuator gain): the cloning fits the expert, the critic's targets are rsl_rl's returns, the cloning
term joins PPO's loss with its decaying weight, a resume neither warm-starts again nor departs from the uninterrupted
run, a task without an expert is refused, and every flag is range-checked."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tests.toy_task as toy
from datasets.checkpoints import CheckpointError
from envs.errors import ConfigError
from teacher import trainer as trainer_module
from teacher.config import PPOConfig, TeacherPolicyConfig, WarmStartConfig
from teacher.rsl_adapter import build_ppo
from teacher.trainer import TeacherTrainer, TrainerConfig
from teacher.warm_start import EXPERT_FILE, lambda_returns, run_warm_start
from tests.teacher.expert_task import TASK, ExpertPointMassConfig, PointMassExpert

ENV = ExpertPointMassConfig(num_envs=16, camera=False)
EVAL = toy.PointMassEvalConfig(episodes=64)
POLICY = TeacherPolicyConfig(hidden_dims=(64, 64), critic_hidden_dims=(32, 32), latent_dim=2)
PPO = PPOConfig(num_steps_per_env=8, num_mini_batches=2, num_learning_epochs=2)
WARM = WarmStartConfig(
    expert_steps=120, bc_epochs=40, bc_batch_size=128, bc_learning_rate=3e-3, critic_epochs=5, bc_weight=0.5,
    bc_decay=0.8,
)  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    """Networks this small run faster on one thread (and far faster beside another busy process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_trainer(run_dir: Path, iterations: int, warm: WarmStartConfig = WARM, env=ENV) -> TeacherTrainer:
    cfg = TrainerConfig(iterations=iterations, eval_every=2, save_every=2, seed=3)
    return TeacherTrainer(env, POLICY, PPO, cfg, EVAL, run_dir, warm_start=warm)


def collect(t: TeacherTrainer) -> list[dict]:
    seen: list[dict] = []
    t.log = lambda metrics, step: seen.append(
        {"step": step, **{k: v for k, v in metrics.items() if not k.startswith("perf/") and "seconds" not in k}}
    )
    return seen


def test_cloning_fits_the_expert_on_held_out_states():
    """After the warm start the actor's mean matches the expert's action on states of other worlds (another seed)
    many times better than before, through the factor encoder (the expert divides by the gain)."""
    torch.manual_seed(0)
    env = toy.PointMassEnv(ENV)
    _, alg = build_ppo(env, POLICY, PPO, TASK.factor_names)
    actor = alg.get_policy()
    fresh = toy.PointMassEnv(replace(ENV, num_envs=256, seed=77))
    expert = PointMassExpert(fresh)
    states, targets = [], []
    for _ in range(8):  # held-out states along the expert's own paths in 256 worlds it never drove in
        obs = fresh.get_observations()
        states.append(obs.select("teacher", "env_factors"))
        targets.append(expert.act())
        fresh.step(targets[-1])
    obs, target = torch.cat(states), torch.cat(targets)
    encoder = [p.detach().clone() for p in actor.factor_encoder.parameters()]
    with torch.no_grad():
        before = float((actor(obs) - target).square().mean())
    rollouts, figures = run_warm_start(alg, env, PointMassExpert(env).act, WARM, PPO, torch.Generator().manual_seed(0))
    alg.eval_mode()
    with torch.no_grad():
        after = float((actor(obs) - target).square().mean())
    assert rollouts.num_samples == 120 * 16 and rollouts.obs["teacher"].shape == (120, 16, 4)
    assert figures["bc_loss"] < 0.2 * figures["bc_loss_first"], figures
    assert figures["bc_heldout_loss"] < 0.2 * figures["bc_heldout_loss_before"], figures  # an env it never saw
    assert after < 0.02 and after < 0.1 * before, (before, after)
    assert any(not torch.equal(a, b) for a, b in zip(encoder, actor.factor_encoder.parameters()))
    assert torch.allclose(actor.distribution.std_param, torch.full((2,), WARM.init_std))
    assert int(actor.obs_normalizer.count) == 120 * 16 and int(alg._raw_critic.obs_normalizer.count) == 120 * 16
    assert 0.0 <= figures["critic_loss"] < float("inf"), figures


def test_dagger_rounds_label_the_clones_states_with_the_expert():
    """In a DAgger round the clone steps the env (the velocity change is its action, not the label) while every
    recorded label is the expert's action on that state; the rounds' rollouts sit beside the expert's as more envs."""
    torch.manual_seed(0)
    env = toy.PointMassEnv(ENV)
    _, alg = build_ppo(env, POLICY, PPO, TASK.factor_names)
    warm = replace(WARM, dagger_rounds=1, bc_epochs=10)
    rollouts, figures = run_warm_start(alg, env, PointMassExpert(env).act, warm, PPO, torch.Generator().manual_seed(0))
    assert rollouts.actions.shape == (120, 32, 2) and "dagger1_bc_loss" in figures and "bc_loss" in figures
    teacher, factor = rollouts.obs["teacher"], rollouts.obs["env_factors"][..., 0]  # (T, N, 4), (T, N)
    low, high = toy.GAIN_RANGE
    gain = low + (factor + 1.0) / 2.0 * (high - low)
    pos, vel = teacher[..., :2], teacher[..., 2:]
    label = ((-4.0 * pos - 2.0 * vel) / gain[..., None]).clamp(-1.0, 1.0)
    assert torch.allclose(rollouts.actions, label, atol=1e-5)
    applied = (vel[1:] - 0.8 * vel[:-1]) / (0.2 * gain[:-1, :, None])  # what stepped the env (where no reset came)
    kept = ~rollouts.dones[:-1]
    gap = (applied - rollouts.actions[:-1]).abs().amax(-1)[kept].reshape(-1)
    expert_gap = (applied - rollouts.actions[:-1]).abs().amax(-1)[:, :16][kept[:, :16]]
    clone_gap = (applied - rollouts.actions[:-1]).abs().amax(-1)[:, 16:][kept[:, 16:]]
    assert gap.numel() and expert_gap.max() < 1e-4 and clone_gap.max() > 1e-3


def test_lambda_returns_by_hand():
    """gamma 0.5, lambda 1 (plain discounted returns): env 0 times out at step 1 (its value 2 bootstrapped), env 1
    terminates at step 0; both bootstrap from the last values (4, 8) at the end."""
    values = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    rewards = torch.tensor([[1.0, 5.0], [1.0, 1.0], [1.0, 1.0]])
    dones = torch.tensor([[False, True], [True, False], [False, False]])
    time_outs = torch.tensor([[False, False], [True, False], [False, False]])
    out = lambda_returns(values, torch.tensor([4.0, 8.0]), rewards, dones, time_outs, gamma=0.5, lam=1.0)
    # env 0: R2 = 1 + 0.5*4 = 3; R1 = 1 + 0.5*2 (time-out bootstrap) = 2; R0 = 1 + 0.5*2 = 2
    # env 1: R2 = 1 + 0.5*8 = 5; R1 = 1 + 0.5*5 = 3.5; R0 = 5 (terminal)
    assert torch.allclose(out, torch.tensor([[2.0, 5.0], [2.0, 3.5], [3.0, 5.0]]))


def test_the_term_weight_decays_and_joins_the_ppo_loss(tmp_path):
    """The trainer logs the cloned policy's evaluation at iteration 0 (it already succeeds), the warm start's
    figures, then PPO iterations whose cloning term has weight 0.5 * 0.8^k and is reported as a loss."""
    assert [WarmStartConfig(expert_steps=1, bc_weight=2.0, bc_decay=0.5).bc_weight_at(k) for k in range(4)] == [
        2.0, 1.0, 0.5, 0.25,
    ]  # fmt: skip
    assert WarmStartConfig(expert_steps=1).bc_weight_at(0) == 0.0
    t = make_trainer(tmp_path, 3)
    seen = collect(t)
    t.train(show_progress=False)
    first, *ppo = seen
    assert first["step"] == 120 * 16 and first["eval/success"] >= 0.9, first
    assert first["warm_start/bc_loss"] < first["warm_start/bc_loss_first"]
    assert [m["train/bc_weight"] for m in ppo] == pytest.approx([0.5, 0.4, 0.32])
    assert all(m["loss/bc"] >= 0 for m in ppo)
    assert (tmp_path / "checkpoints" / "iter_000000.pt").is_file() and (
        tmp_path / "checkpoints" / EXPERT_FILE
    ).is_file()
    assert t.selected_checkpoint()[0].name != "iter_000000.pt"  # the run's teacher is one PPO trained
    off = make_trainer(tmp_path / "off", 1, replace(WARM, bc_weight=0.0))
    off_log = collect(off)
    off.train(show_progress=False)
    assert "loss/bc" not in off_log[-1] and "train/bc_weight" not in off_log[-1]


def test_auxiliary_loss_moves_the_update():
    """The same rollout updated with and without a large pull of the mean toward 0.7: the hook's term changes the
    update in its direction."""
    torch.manual_seed(0)
    env = toy.PointMassEnv(ENV)
    _, alg = build_ppo(env, POLICY, PPO, TASK.factor_names)
    obs = env.get_observations()
    start = {k: v.clone() for k, v in alg.get_policy().state_dict().items()}
    critic = {k: v.clone() for k, v in alg._raw_critic.state_dict().items()}
    world = env.state_dict()

    def update(weight: float) -> tuple[float, dict]:
        env.load_state_dict(world)
        alg.get_policy().load_state_dict(start)
        alg._raw_critic.load_state_dict(critic)
        torch.manual_seed(1)
        alg.train_mode()
        o = obs
        for _ in range(PPO.num_steps_per_env):
            a = alg.act(o)
            o, r, d, extras = env.step(a)
            alg.process_env_step(o, r, d, extras)
        alg.compute_returns(o)
        alg.auxiliary_loss = lambda actor: (actor(obs) - 0.7).square().mean()
        alg.auxiliary_weight = weight
        losses = alg.update()
        alg.eval_mode()
        with torch.no_grad():
            return float((alg.get_policy()(obs) - 0.7).square().mean()), losses

    plain, plain_losses = update(0.0)
    pulled, pulled_losses = update(50.0)
    assert "bc" not in plain_losses and pulled_losses["bc"] > 0
    assert pulled < 0.8 * plain, (plain, pulled)


def test_resume_after_the_warm_start_continues_identically_without_redoing_it(tmp_path, monkeypatch):
    full = make_trainer(tmp_path / "full", 4)
    full_log = collect(full)
    full.train(show_progress=False)

    part = make_trainer(tmp_path / "part", 2)
    collect(part)
    part.train(show_progress=False)  # "interrupted" after iteration 2 (its last checkpoint)

    def refuse(*args, **kwargs):
        raise AssertionError("the warm start ran again on resume")

    monkeypatch.setattr(trainer_module, "run_warm_start", refuse)
    for stop, name in ((2, "resumed"), (0, "from_zero")):  # after PPO began, and right after the warm start
        resumed = make_trainer(tmp_path / name, 4)  # another run directory: the rollouts are read from the source
        resumed.resume(tmp_path / "part" / "checkpoints" / f"iter_{stop:06d}.pt")
        resumed_log = collect(resumed)
        resumed.train(show_progress=False)
        assert [m["train/iteration"] for m in resumed_log] == [float(k) for k in range(stop + 1, 5)]
        assert json.dumps(resumed_log) == json.dumps(full_log[stop + 1 :])
        a, b = full.alg.get_policy().state_dict(), resumed.alg.get_policy().state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert (tmp_path / name / "checkpoints" / EXPERT_FILE).is_file()
        assert resumed.warm_started and resumed.warm_figures == part.warm_figures and "bc_loss" in part.warm_figures

    lost = tmp_path / "lost"
    (lost / "checkpoints").mkdir(parents=True)
    (lost / "checkpoints" / "iter_000002.pt").write_bytes((tmp_path / "part/checkpoints/iter_000002.pt").read_bytes())
    with pytest.raises(CheckpointError, match="expert rollouts of its warm start .* are missing"):
        make_trainer(tmp_path / "x", 4).resume(lost / "checkpoints" / "iter_000002.pt")
    with pytest.raises(CheckpointError, match="warm_start configuration differs"):
        make_trainer(tmp_path / "y", 4, replace(WARM, bc_decay=0.9)).resume(lost / "checkpoints" / "iter_000002.pt")


def test_a_task_without_an_expert_is_refused_naming_the_flag_and_the_task(tmp_path):
    with pytest.raises(
        ConfigError, match=r"--warm-start.expert-steps 120: the task 'point-mass' has no scripted expert"
    ):
        make_trainer(tmp_path, 1, env=toy.PointMassConfig(num_envs=4, camera=False))
    from experiments.train_teacher import BIMANUAL_PRESETS, TrainTeacherConfig

    with pytest.raises(ConfigError, match=r"--warm-start.expert-steps 10: the task 'racing' has no scripted expert"):
        TrainTeacherConfig(warm_start=WarmStartConfig(expert_steps=10))  # what `--warm-start.expert-steps 10` builds
    assert TrainTeacherConfig().warm_start == WarmStartConfig() and not WarmStartConfig().enabled  # off for racing
    assert all(cfg.warm_start.enabled for _, cfg in BIMANUAL_PRESETS.values())


@pytest.mark.parametrize(
    "field,value",
    [("expert_steps", -1), ("bc_epochs", -1), ("bc_batch_size", 0), ("bc_learning_rate", 0.0), ("critic_epochs", -2),
     ("init_std", 0.0), ("bc_weight", -0.1), ("bc_decay", 1.5)],
)  # fmt: skip
def test_flags_are_range_checked_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=f"warm_start.{field}="):
        WarmStartConfig(**{"expert_steps": 10, field: value})


def test_a_cloning_term_without_rollouts_is_refused():
    with pytest.raises(ConfigError, match=r"warm_start.bc_weight=0.5 needs expert rollouts.*expert_steps"):
        WarmStartConfig(bc_weight=0.5)
