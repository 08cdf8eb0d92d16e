"""HDF5 rollout shards (one per DAgger round) with a manifest, and a reader of contiguous windows.

Layout of a shard: flat datasets with one row per env-step, chunked and resizable along rows. Whole episodes are
appended at once (the collector stages them per env), so an episode's rows are contiguous and a window of K steps is
one contiguous row range — read with a slice, never with HDF5 fancy indexing. After every append the shard is
flushed and its `n_valid` attribute says how many rows are complete: a writer killed mid-append leaves a shard
whose first `n_valid` rows are intact. `manifest.json` (rewritten atomically) lists the finished shards.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from envs.config_io import write_text_atomic
from envs.errors import GapbridgeError

SCHEMA_VERSION = 3
"""2: `targets` gained lateral speed and yaw rate; 3: `privileged`, the teacher's own observation"""
MANIFEST = "manifest.json"


class ShardError(GapbridgeError, ValueError):
    """A shard is corrupt, truncated, or of another schema."""


@dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]
    dtype: str


def rollout_schema(
    num_outputs: int,
    latent_dim: int,
    num_factors: int,
    num_targets: int,
    privileged_dim: int,
    proprio_dim: int = 2,
    num_actions: int = 1,
    image_hw: tuple[int, int] = (120, 160),
) -> dict[str, Field]:
    """Per-row fields of a DAgger shard. `teacher_logits` holds the teacher's action distribution (or mean),
    `targets` the task's estimate targets (`EstimateSpec.targets` order), `privileged` the teacher's privileged
    observation (its `teacher` group, raw: before the teacher's normalizer), `prev_action` the previous action as the
    student reads it."""
    h, w = image_hw
    return {
        "camera": Field((1, h, w), "uint8"),
        "prev_action": Field((proprio_dim,), "float32"),
        "teacher_logits": Field((num_outputs,), "float32"),
        "teacher_action": Field((num_actions,), "float32"),
        "student_action": Field((num_actions,), "float32"),
        "executed_action": Field((num_actions,), "float32"),
        "z": Field((latent_dim,), "float32"),
        "env_factors": Field((num_factors,), "float32"),
        "targets": Field((num_targets,), "float32"),
        "privileged": Field((privileged_dim,), "float32"),
        "terminated": Field((), "bool"),
        "truncated": Field((), "bool"),
        "episode": Field((), "int64"),  # global episode id
        "step": Field((), "int32"),  # step within the episode
    }


class ShardWriter:
    """Appends whole episodes to one HDF5 shard; `close()` marks it complete."""

    def __init__(self, path: str | Path, schema: dict[str, Field], attrs: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Default (oldest) file format on purpose: no "open for writing" flag in the superblock, so a shard whose
        # writer was killed opens normally and its first `n_valid` rows (flushed) are intact.
        self.file = h5py.File(self.path, "w")
        self.schema = schema
        for name, f in schema.items():
            row_bytes = int(np.prod(f.shape or (1,))) * np.dtype(f.dtype).itemsize
            chunk_rows = max(1, min(4096, (1024 * 1024) // max(row_bytes, 1)))  # ~1 MiB chunks: fast block reads
            self.file.create_dataset(
                name, shape=(0, *f.shape), maxshape=(None, *f.shape), dtype=f.dtype, chunks=(chunk_rows, *f.shape)
            )
        self.file.attrs["schema_version"] = SCHEMA_VERSION
        self.file.attrs["n_valid"] = 0
        self.file.attrs["complete"] = False
        for k, v in (attrs or {}).items():
            self.file.attrs[k] = v
        self.n_valid = 0

    def append(self, rows: dict[str, np.ndarray]) -> None:
        """Append `M` rows (every schema field, first axis M), then flush and advance `n_valid`."""
        missing = set(self.schema) - set(rows)
        if missing:
            raise ShardError(f"{self.path}: append is missing fields {sorted(missing)}")
        m = len(rows["episode"])
        end = self.n_valid + m
        for name, f in self.schema.items():
            arr = np.asarray(rows[name], dtype=f.dtype)
            if arr.shape != (m, *f.shape):
                raise ShardError(f"{self.path}: field {name!r} has shape {arr.shape}, expected {(m, *f.shape)}")
            ds = self.file[name]
            ds.resize(end, axis=0)
            ds[self.n_valid : end] = arr
        self.n_valid = end
        self.file.attrs["n_valid"] = end
        self.file.flush()

    def close(self) -> None:
        if self.file.id.valid:
            self.file.attrs["complete"] = True
            self.file.flush()
            self.file.close()


def read_manifest(root: str | Path) -> dict[str, Any]:
    path = Path(root) / MANIFEST
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION, "shards": []}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ShardError(f"{path}: manifest is not valid JSON ({err})") from None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ShardError(f"{path}: manifest schema {data.get('schema_version')}, expected {SCHEMA_VERSION}")
    return data


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> None:
    write_text_atomic(Path(root) / MANIFEST, json.dumps(manifest, indent=2))


def add_shard(root: str | Path, shard: str | Path, info: dict[str, Any]) -> dict[str, Any]:
    """Record a finished shard in the manifest (atomic rewrite); returns the new manifest."""
    manifest = read_manifest(root)
    name = Path(shard).name
    manifest["shards"] = [s for s in manifest["shards"] if s["file"] != name] + [{"file": name, **info}]
    write_manifest(root, manifest)
    return manifest


def validate_shard(path: str | Path, schema: dict[str, Field] | None = None) -> int:
    """Check schema version, fields and `n_valid`; returns the number of valid rows or raises ShardError."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            version = f.attrs.get("schema_version")
            if version != SCHEMA_VERSION:
                raise ShardError(
                    f"{path}: schema version {version}, expected {SCHEMA_VERSION} (shards of another version are not "
                    "read: collect them again)"
                )
            n_valid = int(f.attrs.get("n_valid", -1))
            if n_valid < 0:
                raise ShardError(f"{path}: no n_valid attribute")
            for name, fld in (schema or {}).items():
                if name not in f:
                    raise ShardError(f"{path}: missing dataset {name!r}")
                if f[name].shape[1:] != fld.shape:
                    raise ShardError(f"{path}: dataset {name!r} rows are {f[name].shape[1:]}, expected {fld.shape}")
            for name in f:
                if f[name].shape[0] < n_valid:
                    raise ShardError(f"{path}: dataset {name!r} has {f[name].shape[0]} rows < n_valid {n_valid}")
            return n_valid
    except OSError as err:
        raise ShardError(f"{path}: unreadable HDF5 shard ({err})") from None


def read_shards(root: str | Path, fields: tuple[str, ...]) -> Iterator[dict[str, np.ndarray]]:
    """The valid rows of `fields` of every finished shard in the manifest, one shard at a time (each checked by
    `validate_shard` first: a corrupt one raises ShardError naming it)."""
    for entry in read_manifest(root)["shards"]:
        path = Path(root) / entry["file"]
        n = validate_shard(path)
        with h5py.File(path, "r") as f:
            yield {k: f[k][:n] for k in fields}


class _BlockCache:
    """LRU cache of row blocks `(shard, field, block) -> array`, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self.blocks: OrderedDict[tuple[int, str, int], np.ndarray] = OrderedDict()

    def get(self, key: tuple[int, str, int], load) -> np.ndarray:
        block = self.blocks.get(key)
        if block is not None:
            self.blocks.move_to_end(key)
            return block
        block = load()
        self.blocks[key] = block
        self.bytes += block.nbytes
        while self.bytes > self.max_bytes and len(self.blocks) > 1:
            _, old = self.blocks.popitem(last=False)
            self.bytes -= old.nbytes
        return block


class WindowReader:
    """Samples windows of K consecutive steps (never crossing an episode start) from the manifest's shards.

    A window ends at a uniformly chosen row; if its episode began fewer than K - 1 steps earlier the window is
    left-padded with zeros and `mask` marks the padding (exactly what a deployed history encoder sees after a
    reset). Rows are read as contiguous slices in blocks held by an LRU cache of `cache_bytes`, so memory stays flat
    however large the dataset grows. Corrupt or truncated shards are reported by name and skipped
    (`strict=True` refuses them instead).
    """

    def __init__(
        self,
        root: str | Path,
        fields: tuple[str, ...],
        window: int,
        cache_bytes: int = 512 * 1024**2,
        block_rows: int = 256,
        strict: bool = False,
        schema: dict[str, Field] | None = None,
    ) -> None:
        self.root, self.fields, self.window, self.block_rows = Path(root), fields, window, block_rows
        self.cache = _BlockCache(cache_bytes)
        self.skipped: list[str] = []
        self.files: list[h5py.File] = []
        starts, ends = [], []
        for entry in read_manifest(root)["shards"]:
            path = self.root / entry["file"]
            try:
                n_valid = validate_shard(path, schema)
            except ShardError as err:
                if strict:
                    raise
                self.skipped.append(str(err))
                continue
            if n_valid == 0:
                continue
            f = h5py.File(path, "r")
            step = f["step"][:n_valid].astype(np.int64)
            self.files.append(f)
            starts.append(np.arange(n_valid) - step)  # first row of each row's episode
            ends.append(n_valid)
        self._episode_start = starts
        self._sizes = np.array(ends, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)])
        self.total_rows = int(self._offsets[-1])

    def __len__(self) -> int:
        return self.total_rows

    def _block(self, shard: int, field: str, block: int) -> np.ndarray:
        def load() -> np.ndarray:
            lo = block * self.block_rows
            hi = min(lo + self.block_rows, int(self._sizes[shard]))
            return self.files[shard][field][lo:hi]

        return self.cache.get((shard, field, block), load)

    def _rows(self, shard: int, field: str, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of one field as one array (a view when they sit in one cached block)."""
        b0, b1 = lo // self.block_rows, (hi - 1) // self.block_rows
        if b0 == b1:
            base = b0 * self.block_rows
            return self._block(shard, field, b0)[lo - base : hi - base]
        parts = []
        for b in range(b0, b1 + 1):
            base = b * self.block_rows
            blk = self._block(shard, field, b)
            parts.append(blk[max(lo, base) - base : min(hi, base + len(blk)) - base])
        return np.concatenate(parts)

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """`batch` windows: each field `(B, K, ...)`, plus `mask (B, K)` (True on real steps)."""
        if self.total_rows == 0:
            raise ShardError(f"{self.root}: no readable rows (skipped: {self.skipped})")
        flat = rng.integers(0, self.total_rows, size=batch)
        shard_ids = np.searchsorted(self._offsets, flat, side="right") - 1
        rows = flat - self._offsets[shard_ids]
        k = self.window
        out = {f: None for f in self.fields}
        mask = np.zeros((batch, k), dtype=bool)
        for b in range(batch):
            s, end = int(shard_ids[b]), int(rows[b])
            lo = max(int(self._episode_start[s][end]), end - k + 1)
            pad = k - (end + 1 - lo)
            mask[b, pad:] = True
            for f in self.fields:
                data = self._rows(s, f, lo, end + 1)
                if out[f] is None:
                    out[f] = np.zeros((batch, k, *data.shape[1:]), dtype=data.dtype)
                out[f][b, pad:] = data
        return {**out, "mask": mask}

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
