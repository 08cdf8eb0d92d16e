"""Save and restore every piece of a `RacingEnv`'s mutable state, so a resumed run continues bit-exactly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict
from torch import Tensor

from envs.errors import ConfigError

if TYPE_CHECKING:
    from envs.racing.env import RacingEnv

WORLD_TENSORS = ("action_latency", "camera_latency", "action_noise", "battery")
"""the per-env world factors held as tensors on the `WorldSample` itself (the car's are in its `params`)"""
BUFFERS = (
    "direction", "segment", "s", "travel", "laps", "lap_start_step", "last_lap_time", "stuck_mark",
    "stuck_steps", "episode_length_buf", "episode_count", "prev_action", "prev_vel", "start_index",
)  # fmt: skip
"""the env's own per-env buffers"""


def _dataclasses(env: RacingEnv):
    return (("world_params", env.world.params), ("visuals", env.visuals), ("proj", env._proj))


def _delay_lines(env: RacingEnv):
    return (("action_delay", env.action_delay), ("pose_delay", env.pose_delay))


def env_state(env: RacingEnv) -> dict[str, Tensor | int]:
    """Every piece of `env`'s mutable state (tensors and ints only)."""
    out: dict[str, Tensor | int] = {f"buf.{k}": getattr(env, k).clone() for k in BUFFERS}
    for prefix, obj in _dataclasses(env):
        for name in obj.__dataclass_fields__:
            out[f"{prefix}.{name}"] = getattr(obj, name).clone()
    for name, line in _delay_lines(env):
        out[f"{name}.buffer"], out[f"{name}.head"] = line.buffer.clone(), int(line.head)
    for name in WORLD_TENSORS:
        out[f"world.{name}"] = getattr(env.world, name).clone()
    if env.effects is not None:
        out.update({f"effects.{k}": v for k, v in env.effects.state_dict().items()})
    out["accel"] = getattr(env, "_accel", torch.zeros(env.num_envs, 2, device=env.device)).clone()
    out["generator"] = env.generator.get_state()
    for key, value in env.get_observations().items():
        out[f"obs.{key}"] = value.clone()
    for key, value in env.physics.state_dict().items():
        out[f"physics.{key}"] = value
    return out


def load_env_state(env: RacingEnv, state: dict[str, Tensor | int]) -> None:
    """Restore `env_state` output into `env` (same config and env count); a missing or misshapen entry is refused by
    name before anything changes."""
    mine = env_state(env)
    missing = set(mine) - set(state)
    if missing:
        raise ConfigError(f"env state is missing {sorted(missing)[:5]} (saved by a different env configuration?)")
    for key, value in state.items():
        ref = mine.get(key)
        if isinstance(ref, Tensor) and (not isinstance(value, Tensor) or value.shape != ref.shape):
            raise ConfigError(f"env state {key!r} has shape {getattr(value, 'shape', None)}, expected {ref.shape}")
    for k in BUFFERS:
        getattr(env, k).copy_(state[f"buf.{k}"])
    for prefix, obj in _dataclasses(env):
        for name in obj.__dataclass_fields__:
            getattr(obj, name).copy_(state[f"{prefix}.{name}"])
    for name, line in _delay_lines(env):
        line.buffer.copy_(state[f"{name}.buffer"])
        line.head = int(state[f"{name}.head"])
    for name in WORLD_TENSORS:
        getattr(env.world, name).copy_(state[f"world.{name}"])
    if env.effects is not None:
        env.effects.load_state_dict({k[len("effects.") :]: v for k, v in state.items() if k.startswith("effects.")})
    env._accel = state["accel"].clone()
    env.generator.set_state(state["generator"])
    env.physics.load_state_dict({k[len("physics.") :]: v for k, v in state.items() if k.startswith("physics.")})
    groups = {k[len("obs.") :]: v.clone() for k, v in state.items() if k.startswith("obs.")}
    env._obs = TensorDict(groups, batch_size=[env.num_envs], device=env.device)
