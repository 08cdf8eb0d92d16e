"""Per-env staging of episodes, so that each episode reaches a shard as one contiguous block of rows."""

from __future__ import annotations

import numpy as np

from datasets.rollouts import Field


class EpisodeStager:
    """Preallocated `(N, capacity, ...)` buffers per field; `add` one step for all envs, `pop` finished envs."""

    def __init__(self, num_envs: int, capacity: int, schema: dict[str, Field]) -> None:
        self.capacity, self.schema = capacity, schema
        self.buffers = {k: np.zeros((num_envs, capacity, *f.shape), dtype=f.dtype) for k, f in schema.items()}
        self.length = np.zeros(num_envs, dtype=np.int64)

    def add(self, step: dict[str, np.ndarray]) -> None:
        """One row per env; every env must have room (episodes longer than `capacity` are a configuration error)."""
        if (self.length >= self.capacity).any():
            raise ValueError(f"episode longer than the staging capacity of {self.capacity} steps")
        n = np.arange(len(self.length))
        for k, buf in self.buffers.items():
            buf[n, self.length] = step[k]
        self.length += 1

    def pop(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Concatenate the staged episodes of `env_ids` (in that order) and clear them."""
        rows = {
            k: np.concatenate([buf[i, : self.length[i]] for i in env_ids]) if len(env_ids) else buf[:0, 0]
            for k, buf in self.buffers.items()
        }
        self.length[env_ids] = 0
        return rows

    def pending(self) -> np.ndarray:
        return np.nonzero(self.length > 0)[0]
