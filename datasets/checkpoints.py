"""Checkpoint files: written atomically (temporary file + `os.replace`), loaded with `weights_only=True`.

A checkpoint is a dict of tensors, numbers, strings and nested dicts/lists only — RNG states are tensors, configs
are YAML text — so loading one from elsewhere cannot execute code. A kill mid-write leaves the previous file intact.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.errors import GapbridgeError


class CheckpointError(GapbridgeError, ValueError):
    """A checkpoint file is missing, corrupt, or does not match what loads it."""


def save_atomic(payload: dict[str, Any], path: str | Path) -> Path:
    """torch.save to `path` via a temporary file in the same directory and an atomic rename (fsynced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, kind: str | None = None, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a checkpoint safely and check its `kind` and required keys; errors name the file and the mismatch."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(_unpickling_message(path, err)) from None
    except Exception as err:  # torch raises several types for truncated/corrupt files
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(err).__name__}: {str(err)[:200]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a dict checkpoint, got {type(data).__name__}")
    if kind is not None and data.get("kind") != kind:
        raise CheckpointError(f"{path}: is a {data.get('kind')!r} checkpoint, expected {kind!r}")
    missing = [k for k in required if k not in data]
    if missing:
        raise CheckpointError(f"{path}: missing keys {missing}")
    return data


def _unpickling_message(path: Path, err: pickle.UnpicklingError) -> str:
    """What the refusal of a file holding pickled objects says: what it holds, and that it stays unloaded. torch's own
    message advises loading it unprotected, which could run any code the file carries; that advice is not repeated."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found is None:  # not an object the safe loader refused: the bytes are not a checkpoint
        reason = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
        return f"{path}: not a readable checkpoint ({reason.group(1).strip() if reason else 'unpickling failed'})"
    what = f" (first: {found.group(1)})"
    return (
        f"{path}: holds objects other than tensors and plain data{what}; it is not loaded, since unpickling them could "
        "run code. A checkpoint holds tensors, numbers, strings, lists and dicts only"
    )


def rng_state() -> dict[str, Any]:
    """Global RNG states as tensors/ints (torch CPU, numpy, python)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])},
        "python": {"version": int(py_state[0]), "state": torch.tensor(py_state[1], dtype=torch.int64)},
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    keys = state["numpy"]["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["numpy"]["pos"], 0, 0.0))
    random.setstate((state["python"]["version"], tuple(int(v) for v in state["python"]["state"].tolist()), None))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def git_sha(default: str = "unknown") -> str:
    """The repository's HEAD commit (with `-dirty` when the tree has changes), or `default` outside a checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return default
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return default
