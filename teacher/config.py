"""Teacher policy and PPO hyper-parameters (frozen, validated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from envs.errors import ConfigError, check_range


@dataclass(frozen=True)
class TeacherPolicyConfig:
    """Actor-critic for the `teacher` + `env_factors` groups with an RMA factor encoder."""

    hidden_dims: tuple[int, ...] = (256, 128, 64)
    """policy trunk widths"""
    critic_hidden_dims: tuple[int, ...] = (256, 128, 64)
    """critic widths (asymmetric: the critic sees the raw factors, not z)"""
    activation: str = "elu"
    """activation of every hidden layer"""
    dropout: float = 0.0
    """dropout in the policy trunk. Off by default: rollouts run the deterministic network and PPO updates the dropped
    one, and at 0.3 the teacher stalls under full randomization (measured worse, see docs/results.md#teacher). The
    DeepRacer team's 0.3 is for the network that drives the car, the student (`--student.head-dropout`)"""
    dropout_layers: int = 1
    """how many of the last trunk layers dropout follows (more layers make PPO's ratios noisier)"""
    latent_dim: int = 8
    """size of z = mu(e), tanh-bounded"""
    encoder_hidden: tuple[int, ...] = (64,)
    """factor-encoder hidden widths"""
    hidden_factors: tuple[str, ...] = ()
    """env factors the actor does not see (held at mid-range; still randomized, and the critic still sees them). A
    teacher that acts on a factor its student cannot recover from the camera and its own actions asks the impossible
    of the student: on friction the student imitates the average teacher and leaves the track most in low-grip
    worlds. Hiding such factors trains a teacher that is robust to them instead (e.g. friction mass_scale
    motor_gain; none by default)"""
    obs_normalization: bool = True
    """running mean/std normalization of the observations"""
    init_std: float = 0.6
    """initial action std (continuous action spaces)"""

    def check_factors(self, factor_names: tuple[str, ...]) -> None:
        """Refuse hidden factors the task does not randomize (the task's `factor_names`)."""
        unknown = [f for f in self.hidden_factors if f not in factor_names]
        if unknown:
            raise ConfigError(f"policy.hidden_factors: unknown factors {unknown}; known: {list(factor_names)}")

    def __post_init__(self) -> None:
        check_range("policy.dropout", self.dropout, 0.0, 0.9)
        check_range("policy.dropout_layers", self.dropout_layers, 0, len(self.hidden_dims))
        check_range("policy.latent_dim", self.latent_dim, 1, 256)
        check_range("policy.init_std", self.init_std, 1e-3, 10.0)
        if not self.hidden_dims or not self.critic_hidden_dims:
            raise ConfigError("policy.hidden_dims and policy.critic_hidden_dims need at least one layer")


@dataclass(frozen=True)
class PPOConfig:
    """rsl_rl PPO settings."""

    num_steps_per_env: int = 24
    """rollout length per env between updates"""
    learning_rate: float = 1e-3
    """initial learning rate (adapted to the KL target with the adaptive schedule)"""
    num_learning_epochs: int = 5
    """passes over each rollout"""
    num_mini_batches: int = 4
    """mini-batches per pass"""
    clip_param: float = 0.2
    """PPO ratio clip"""
    gamma: float = 0.99
    """discount"""
    lam: float = 0.95
    """GAE lambda"""
    entropy_coef: float = 0.001
    """entropy bonus (the DeepRacer team found 0.001 helps transfer)"""
    value_loss_coef: float = 1.0
    """value-loss weight"""
    max_grad_norm: float = 1.0
    """gradient clip"""
    schedule: Literal["adaptive", "fixed"] = "adaptive"
    """learning-rate schedule"""
    desired_kl: float = 0.01
    """KL target of the adaptive schedule"""

    def __post_init__(self) -> None:
        check_range("ppo.num_steps_per_env", self.num_steps_per_env, 1, 10_000)
        check_range("ppo.learning_rate", self.learning_rate, 1e-7, 1.0)
        check_range("ppo.gamma", self.gamma, 0.0, 1.0)
        check_range("ppo.lam", self.lam, 0.0, 1.0)
        check_range("ppo.entropy_coef", self.entropy_coef, 0.0, 1.0)
        check_range("ppo.num_mini_batches", self.num_mini_batches, 1, 10_000)
        check_range("ppo.num_learning_epochs", self.num_learning_epochs, 1, 1000)


@dataclass(frozen=True)
class WarmStartConfig:
    """An expert warm start of the teacher (off at `expert_steps` 0): the task's scripted expert drives the training
    envs, the actor's mean is cloned from its actions and the critic fitted to its returns before PPO starts, and a
    behaviour-cloning term on those rollouts joins the PPO loss with a decaying weight (DAPG)."""

    expert_steps: int = 0
    """control steps the task's scripted expert drives every training env before PPO starts (auto-reset); 0 turns the
    warm start off"""
    bc_epochs: int = 50
    """passes of behaviour cloning over the expert's rollouts (MSE of the actor's mean to the expert's action), and
    again after each DAgger round over everything recorded"""
    dagger_rounds: int = 0
    """rounds in which the cloned actor drives (its mean) for `expert_steps` more steps while the expert labels every
    state it reaches, each followed by cloning on all labelled states so far (DAgger: the states a clone drifts into,
    which the expert's own rollouts never show)"""
    bc_batch_size: int = 512
    """samples per behaviour-cloning step, in the warm start and in each PPO mini-batch's term"""
    bc_learning_rate: float = 1e-3
    """Adam learning rate of the behaviour cloning and of the critic's fit"""
    critic_epochs: int = 20
    """passes of the critic's fit to the rollouts' lambda-returns (the targets recomputed every pass)"""
    init_std: float = 0.3
    """action std of the cloned policy when PPO starts (continuous action spaces)"""
    bc_weight: float = 0.0
    """weight of the behaviour-cloning term in the PPO loss at the first iteration (0: no term)"""
    bc_decay: float = 0.99
    """the term's weight is `bc_weight * bc_decay ** iteration`, so PPO can leave the expert as it improves"""

    def __post_init__(self) -> None:
        check_range("warm_start.expert_steps", self.expert_steps, 0, 1_000_000)
        check_range("warm_start.bc_epochs", self.bc_epochs, 0, 100_000)
        check_range("warm_start.dagger_rounds", self.dagger_rounds, 0, 100)
        check_range("warm_start.bc_batch_size", self.bc_batch_size, 1, 1_000_000)
        check_range("warm_start.bc_learning_rate", self.bc_learning_rate, 1e-7, 1.0)
        check_range("warm_start.critic_epochs", self.critic_epochs, 0, 100_000)
        check_range("warm_start.init_std", self.init_std, 1e-3, 10.0)
        check_range("warm_start.bc_weight", self.bc_weight, 0.0, 1e4)
        check_range("warm_start.bc_decay", self.bc_decay, 0.0, 1.0)
        if self.bc_weight > 0 and not self.enabled:
            raise ConfigError(
                f"warm_start.bc_weight={self.bc_weight} needs expert rollouts: set warm_start.expert_steps above 0"
            )

    @property
    def enabled(self) -> bool:
        return self.expert_steps > 0

    def bc_weight_at(self, iteration: int) -> float:
        """The behaviour-cloning term's weight in the update of PPO iteration `iteration` (0 the first)."""
        return self.bc_weight * self.bc_decay**iteration

    def check_task(self, task_name: str, has_expert: bool) -> None:
        """Refuse a warm start for a task without a scripted expert, naming the flag and the task."""
        if self.enabled and not has_expert:
            raise ConfigError(
                f"--warm-start.expert-steps {self.expert_steps}: the task {task_name!r} has no scripted expert "
                f"(Task.expert) to warm-start from; leave --warm-start.expert-steps at 0"
            )
