"""The task contract and registry: what the teacher, DAgger, the history encoder, evaluation and export read of a task.

A task registers itself by name (ManiSkill's `register_env`, IsaacLab's `gym.register`):

    register_task(Task(name="racing", config_cls=EnvConfig, make_env=RacingEnv, ...))

and every consumer asks the registry (`get_task("racing")`, or `task_of_config(cfg)` for the task whose env config
`cfg` is) instead of importing a particular env. A task provides:

- its env config dataclass and `make_env(cfg)`, returning a batched rsl_rl-style VecEnv (`num_envs`,
  `num_actions`, `max_episode_length`, `episode_length_buf`, `device`, `cfg`, `action_space`, `get_observations()`,
  `step()`, `reset()`, `state_dict()` / `load_state_dict()`) whose observations are a TensorDict with any of the
  groups in `OBS_GROUPS`;
- `factor_names`, the randomized world in the order of the `env_factors` group;
- the named **estimate targets** the history encoder learns online (`EstimateSpec`) and `estimate_targets(env)`,
  their per-env ground truth at the current step (DAgger's labels);
- an **action spec**: a categorical choice over a table (`kind == "discrete"`, one index per step) or a bounded box
  (`kind == "continuous"`, a Gaussian policy's clamped mean), rebuilt from its saved form by
  `action_spec_from_dict`, and what an export writes for it (`export_files`);
- **episode evaluation**: `eval_config_cls`, `make_eval_env(env_cfg, eval_cfg)`, `run_episodes(act, env, eval_cfg,
  reset)` running fixed-seed episodes into records and `summarize(records, env)` into a flat dict of metrics that
  holds `primary_metric` (what reports rank by: lap completion, success) and `selection_metric` (what checkpoint
  selection ranks by), with `episode_score(record)` each episode's share of the latter;
- optionally a **reality proxy** builder (`reality_env_config(env_cfg, reality_cfg)`) for transfer evaluation.

Built-in tasks live in their own packages and are imported the first time the registry is asked for them, so that
importing this module pulls in no simulator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from envs.errors import ConfigError, GapbridgeError

OBS_GROUPS = ("teacher", "env_factors", "proprio", "camera")
"""observation groups a task's env may offer (any may be absent; each consumer asks for the ones it reads)"""

BUILTIN_TASKS = {
    "racing": "envs.racing.task",
    "bimanual-lift": "envs.bimanual.task",
    "bimanual-handover": "envs.bimanual.handover_task",
}
"""task name -> module that registers it when imported"""


class UnknownTaskError(GapbridgeError, KeyError):
    """A task name the registry does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; this is a sentence
        return str(self.args[0])


class TaskMismatchError(GapbridgeError, ValueError):
    """A checkpoint, config or env of one task used where another task (or layout) is expected."""


class ActionSpec(Protocol):
    """What a policy acting in a task must output. `num_actions` is the width of the env's action tensor (1 for a
    categorical index), `num_outputs` the width of the policy's raw output (logits of each choice, or the means)."""

    kind: str

    @property
    def num_actions(self) -> int: ...

    @property
    def num_outputs(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BoxActionSpec:
    """A continuous action in a box: the policy's clamped mean, `dim` values in [`low`, `high`]."""

    dim: int
    low: float = -1.0
    high: float = 1.0
    kind: str = "continuous"

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ConfigError(f"action spec: dim={self.dim} must be at least 1")
        if not self.low < self.high:
            raise ConfigError(f"action spec: low={self.low} must be below high={self.high}")
        if self.kind != "continuous":
            raise ConfigError(f"action spec: a box is continuous, not {self.kind!r}")

    @property
    def num_actions(self) -> int:
        return self.dim

    @property
    def num_outputs(self) -> int:
        return self.dim

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "continuous", "dim": self.dim, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BoxActionSpec:
        return cls(int(data["dim"]), float(data["low"]), float(data["high"]))


@dataclass(frozen=True)
class EstimateSpec:
    """The quantities the history encoder estimates online, as columns of the per-step ground truth `targets`:
    first the `latencies` (classified in physics substeps, up to each one's maximum), then the `regressions`
    (regressed after `(value - centre) / scale`). `factors` are the regressions that are constant over an episode
    (per-world factors; the others vary per frame, like a body velocity)."""

    latencies: tuple[str, ...] = ()
    regressions: tuple[str, ...] = ()
    scale: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    factors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = [name for name in self.regressions if name not in self.scale]
        if missing:
            raise ConfigError(f"estimate spec: no (centre, scale) for {missing}")
        stray = [name for name in self.factors if name not in self.regressions]
        if stray:
            raise ConfigError(f"estimate spec: factors {stray} are not among the regressions {self.regressions}")
        if len(set(self.targets)) != len(self.targets):
            raise ConfigError(f"estimate spec: repeated target names in {self.targets}")

    @property
    def targets(self) -> tuple[str, ...]:
        """Columns of the dataset's `targets` field."""
        return (*self.latencies, *self.regressions)

    def column(self, name: str) -> int:
        return self.targets.index(name)

    def normalize(self, targets: Tensor) -> Tensor:
        """`(..., len(targets))` ground truth -> `(..., len(regressions))` normalized regression targets."""
        cols = [
            (targets[..., self.column(name)] - self.scale[name][0]) / self.scale[name][1] for name in self.regressions
        ]
        return torch.stack(cols, dim=-1) if cols else targets[..., :0]

    def denormalize(self, estimates: Tensor) -> dict[str, Tensor]:
        """`(..., len(regressions))` normalized estimates -> physical values by name."""
        return {
            name: estimates[..., i] * self.scale[name][1] + self.scale[name][0]
            for i, name in enumerate(self.regressions)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "latencies": list(self.latencies),
            "regressions": list(self.regressions),
            "scale": {k: list(v) for k, v in self.scale.items()},
            "factors": list(self.factors),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EstimateSpec:
        return cls(
            tuple(data["latencies"]),
            tuple(data["regressions"]),
            {k: (float(v[0]), float(v[1])) for k, v in data["scale"].items()},
            tuple(data["factors"]),
        )


Act = Callable[[Any], Tensor]


@dataclass(frozen=True)
class Task:
    """One registered task (see the module docstring for what each entry means)."""

    name: str
    config_cls: type
    make_env: Callable[[Any], Any]
    factor_names: tuple[str, ...]
    estimates: EstimateSpec
    estimate_targets: Callable[[Any], Tensor]
    action_spec_from_dict: Callable[[Mapping[str, Any]], ActionSpec]
    eval_config_cls: type
    make_eval_env: Callable[[Any, Any], Any]
    run_episodes: Callable[..., list]
    """`(act, env, eval_cfg, reset)` -> one record per env of an env built by `make_eval_env`: its episode's outcome"""
    summarize: Callable[[list, Any], dict[str, float]]
    """`(records, env)` -> flat metrics (with confidence intervals where they apply), holding `primary_metric`"""
    primary_metric: str
    """what reports rank by first (racing: lap completion; arms: success)"""
    selection_metric: str
    """the metric checkpoint selection and transfer ranking use (racing: progress, a finer lap completion)"""
    episode_score: Callable[[Any], float]
    """one record's share of `selection_metric` (its mean over the records is the metric)"""
    previous_action_dim: int = 0
    """leading columns of the `proprio` group holding the previous action: what a student reads besides the camera"""
    teacher_previous_action: int | None = None
    """where the `teacher` group holds the previous action, if it does: the first of its `previous_action_dim` columns,
    counted from the group's end (racing: -2, its last two columns), holding the same values as the `proprio` group's
    leading columns. A student acting through the teacher's frozen trunk feeds its own previous action there rather
    than an estimate (None: the group does not hold it)"""
    student_env_config: Callable[[Any, int, int | None], Any] = lambda cfg, num_envs, max_steps: cfg
    """`(cfg, num_envs, max_steps)` -> the env config a student drives in: its sensors on (the camera), `num_envs`
    envs, episodes of at most `max_steps` control steps (None: the config's own length)"""
    observation_groups: Callable[[Any], tuple[str, ...]] | None = None
    """`cfg` -> the observation groups an env of that config offers, so that a consumer needing one it lacks is refused
    from the config alone, before any env is built (None: checked on the built env)"""
    factor_bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """physical range of each factor that maps linearly onto [-1, 1] in `env_factors`"""
    latency_classes: Callable[[Any], dict[str, int]] = lambda cfg: {}
    """classes of each latency estimate (physics substeps, 0 to the most the config can draw) for an env config"""
    dt_physics: Callable[[Any], float] = lambda cfg: 1.0
    """the physics step of an env config (the unit latencies are classified in)"""
    export_files: Callable[[Any, Any], dict[str, str]] = lambda spec, cfg: {}
    """files an export writes beside the model for an action spec and env config (racing: model_metadata.json)"""
    reality_env_config: Callable[..., Any] | None = None
    """`(env_cfg, reality_cfg, part)` -> the reality proxy's env config (`part`: all, dynamics, perception, none)"""
    command_mapper: Callable[[Any, dict[str, Any]], Any] | None = None
    """`(export folder, options)` -> how a deployed policy's outputs become actuator commands: an object with
    `num_outputs`, `previous_action_dim`, `command(action_logits) -> (command, previous_action (1, P))` and
    `stop() -> command` (racing: the DeepRacer action space, calibration table and speed setting)"""
    expert: Callable[[Any], Any] | None = None
    """`expert(env) -> policy`: a scripted privileged policy of the task (`act(obs)` on the training env, reading its
    true state), which a teacher's warm start imitates; None when the task has none"""
    description: str = ""

    def evaluate(self, act: Act, env: Any, eval_cfg: Any, reset: Callable[[Tensor], None] | None = None) -> dict:
        """Fixed-seed episodes, one per env of `env` (built by `make_eval_env`), summarized."""
        return self.summarize(self.run_episodes(act, env, eval_cfg, reset), env)

    def normalized_factor(self, name: str, value: float) -> float:
        """A factor's physical value as it reads in `env_factors`."""
        lo, hi = self.factor_bounds[name]
        return 2.0 * (value - lo) / (hi - lo) - 1.0

    def require_groups(self, cfg: Any, needed: tuple[str, ...], consumer: str) -> None:
        """Refuse, from the env config alone, an env that would lack an observation group a consumer reads, naming
        the group (a task without `observation_groups` is checked once its env is built: `check_groups`)."""
        if self.observation_groups is not None:
            self._refuse_missing(set(self.observation_groups(cfg)), needed, consumer)

    def check_groups(self, env: Any, needed: tuple[str, ...], consumer: str) -> None:
        """Refuse an env that lacks an observation group a consumer reads, naming the group."""
        self._refuse_missing(set(env.get_observations().keys()), needed, consumer)

    def _refuse_missing(self, have: set[str], needed: tuple[str, ...], consumer: str) -> None:
        missing = [g for g in needed if g not in have]
        if missing:
            raise TaskMismatchError(
                f"task {self.name!r}: {consumer} reads the observation group(s) {missing}, which this env does not "
                f"offer (it has {sorted(have)})"
            )


_REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task to the registry (a second registration under the same name replaces the first)."""
    _REGISTRY[task.name] = task
    return task


def _load_builtin(name: str) -> None:
    module = BUILTIN_TASKS.get(name)
    if module is not None and name not in _REGISTRY:
        importlib.import_module(module)


def task_names() -> tuple[str, ...]:
    """Every known task: the built-in ones and any registered since."""
    return tuple(sorted(set(BUILTIN_TASKS) | set(_REGISTRY)))


def get_task(name: str) -> Task:
    """The task registered as `name`; an unknown name is refused with the known ones listed."""
    _load_builtin(name)
    if name not in _REGISTRY:
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
    return _REGISTRY[name]


def task_of_config(cfg: Any) -> Task:
    """The task whose env config class `cfg` is an instance of."""
    for name in BUILTIN_TASKS:
        _load_builtin(name)
    for task in _REGISTRY.values():
        if type(cfg) is task.config_cls:
            return task
    raise UnknownTaskError(f"no registered task has the env config {type(cfg).__name__}; known: {task_names()}")


def check_task(source: str, saved: str, expected: str) -> None:
    """Refuse something saved for task `saved` where task `expected` is used, naming both."""
    if saved != expected:
        raise TaskMismatchError(f"{source}: made for task {saved!r}, used with task {expected!r}")
