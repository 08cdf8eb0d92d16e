import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from datasets.rollouts import (
    SCHEMA_VERSION,
    ShardError,
    ShardWriter,
    WindowReader,
    add_shard,
    read_manifest,
    rollout_schema,
    validate_shard,
)
from datasets.staging import EpisodeStager

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = rollout_schema(num_outputs=3, latent_dim=2, num_factors=2, num_targets=7, privileged_dim=6, image_hw=(4, 5))


def episode_rows(episode: int, length: int) -> dict[str, np.ndarray]:
    rows = {k: np.zeros((length, *f.shape), dtype=f.dtype) for k, f in SCHEMA.items()}
    rows["episode"][:] = episode
    rows["step"][:] = np.arange(length)
    rows["camera"][:] = (np.arange(length) % 250).reshape(-1, 1, 1, 1) + 1  # frame value = step + 1
    rows["prev_action"][:, 0] = episode
    rows["truncated"][-1] = True
    return rows


def write_round(root: Path, name: str, episodes: list[tuple[int, int]]) -> Path:
    path = root / name
    w = ShardWriter(path, SCHEMA)
    for ep, length in episodes:
        w.append(episode_rows(ep, length))
    w.close()
    add_shard(root, path, {"rows": sum(n for _, n in episodes)})
    return path


def test_windows_never_cross_episode_boundaries_and_pad_at_the_start(tmp_path):
    write_round(tmp_path, "r0.h5", [(0, 7), (1, 30), (2, 3)])
    write_round(tmp_path, "r1.h5", [(3, 12)])
    reader = WindowReader(tmp_path, ("camera", "prev_action"), window=10, block_rows=8, cache_bytes=10_000)
    assert len(reader) == 52
    batch = reader.sample(400, np.random.default_rng(0))
    assert batch["camera"].shape == (400, 10, 1, 4, 5) and batch["mask"].shape == (400, 10)
    for b in range(400):
        m = batch["mask"][b]
        frames = batch["camera"][b, :, 0, 0, 0].astype(int)
        eps = batch["prev_action"][b, m, 0]
        assert len(set(eps.tolist())) == 1, "one episode per window"
        assert not m[: np.argmax(m)].any() and m[np.argmax(m) :].all(), "padding only on the left"
        real = frames[m]
        assert (np.diff(real) == 1).all(), "consecutive steps"
        if not m[0]:
            assert real[0] == 1, "a padded window starts at the episode's first step"
        assert (frames[~m] == 0).all()
    reader.close()


def test_manifest_and_shard_validation(tmp_path):
    write_round(tmp_path, "r0.h5", [(0, 5)])
    manifest = read_manifest(tmp_path)
    assert manifest["shards"][0]["file"] == "r0.h5" and manifest["schema_version"] == SCHEMA_VERSION
    assert validate_shard(tmp_path / "r0.h5", SCHEMA) == 5
    (tmp_path / "junk.h5").write_bytes(b"\x89HDF\r\n junk")
    with pytest.raises(ShardError, match="junk.h5: unreadable"):
        validate_shard(tmp_path / "junk.h5")
    with h5py.File(tmp_path / "r0.h5", "a") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(ShardError, match="schema version 99"):
        validate_shard(tmp_path / "r0.h5")


def test_the_privileged_observation_round_trips_and_older_shards_are_refused(tmp_path):
    path = tmp_path / "r0.h5"
    w = ShardWriter(path, SCHEMA)
    rows = episode_rows(4, 6)
    rows["privileged"][:] = np.arange(6 * 6, dtype=np.float32).reshape(6, 6) / 7.0
    w.append(rows)
    w.close()
    add_shard(tmp_path, path, {"rows": 6})
    reader = WindowReader(tmp_path, ("privileged", "step"), window=3, strict=True, schema=SCHEMA)
    batch = reader.sample(20, np.random.default_rng(0))
    reader.close()
    for b in range(20):
        m = batch["mask"][b]
        np.testing.assert_array_equal(batch["privileged"][b][m], rows["privileged"][batch["step"][b][m]])
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 2  # written before the field existed
    with pytest.raises(ShardError, match="schema version 2, expected 3 .*collect them again"):
        WindowReader(tmp_path, ("privileged",), window=3, strict=True)
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION
        del f["privileged"]
    with pytest.raises(ShardError, match="missing dataset 'privileged'"):
        validate_shard(path, SCHEMA)


def test_corrupt_shards_are_named_and_skipped_or_refused(tmp_path):
    write_round(tmp_path, "good.h5", [(0, 10)])
    bad = write_round(tmp_path, "bad.h5", [(1, 10)])
    with h5py.File(bad, "a") as f:
        f.attrs["n_valid"] = 50  # claims more rows than exist: truncated
    reader = WindowReader(tmp_path, ("camera",), window=4)
    assert len(reader) == 10 and "bad.h5" in reader.skipped[0] and "n_valid" in reader.skipped[0]
    reader.close()
    with pytest.raises(ShardError, match="bad.h5"):
        WindowReader(tmp_path, ("camera",), window=4, strict=True)


def test_shard_survives_kill_minus_9_mid_write(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.datasets.test_rollouts import SCHEMA, episode_rows
        from datasets.rollouts import ShardWriter
        w = ShardWriter({str(tmp_path / "live.h5")!r}, SCHEMA)
        for ep in range(100000):
            w.append(episode_rows(ep, 17))
            if ep == 20:
                print("ready", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_valid = validate_shard(tmp_path / "live.h5", SCHEMA)
    assert n_valid >= 21 * 17 and n_valid % 17 == 0
    with h5py.File(tmp_path / "live.h5", "r") as f:
        assert not f.attrs["complete"]
        episodes = f["episode"][:n_valid]
    assert (np.bincount(episodes) == 17).all(), "every valid row belongs to a whole episode"


def test_stager_keeps_episodes_contiguous():
    stager = EpisodeStager(num_envs=3, capacity=6, schema=SCHEMA)
    for t in range(4):
        step = {k: np.zeros((3, *f.shape), dtype=f.dtype) for k, f in SCHEMA.items()}
        step["episode"][:] = [10, 11, 12]
        step["step"][:] = t
        stager.add(step)
    rows = stager.pop(np.array([2, 0]))
    assert rows["episode"].tolist() == [12] * 4 + [10] * 4
    assert rows["step"].tolist() == [0, 1, 2, 3] * 2
    assert stager.pending().tolist() == [1]
    for _ in range(2):
        stager.add({k: np.zeros((3, *f.shape), dtype=f.dtype) for k, f in SCHEMA.items()})
    with pytest.raises(ValueError, match="staging capacity"):
        stager.add({k: np.zeros((3, *f.shape), dtype=f.dtype) for k, f in SCHEMA.items()})


def test_manifest_is_json_and_rewritten_atomically(tmp_path, monkeypatch):
    for i in range(3):
        write_round(tmp_path, f"r{i}.h5", [(i, 4)])
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["file"] for s in data["shards"]] == ["r0.h5", "r1.h5", "r2.h5"]
    assert not list(tmp_path.glob(".manifest.json.tmp*"))

    # A rewrite that dies before its rename leaves the previous manifest whole (and no temporary file).
    def killed(src, dst):
        raise KeyboardInterrupt

    before = (tmp_path / "manifest.json").read_text()
    w = ShardWriter(tmp_path / "r3.h5", SCHEMA)
    w.append(episode_rows(3, 4))
    w.close()
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        add_shard(tmp_path, tmp_path / "r3.h5", {"rows": 4})
    monkeypatch.undo()
    assert (tmp_path / "manifest.json").read_text() == before
    assert not list(tmp_path.glob(".manifest.json.tmp*"))
