"""Data-parallel DAgger over two gloo ranks launched by torchrun: every rank's shards in the manifest, the samples
counted over both, checkpoints holding both ranks' states, and a one-process resume refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}


def test_two_rank_dagger_writes_both_ranks_shards(teacher_path, tmp_path):
    run_dir = tmp_path / "student"
    args = ["-m", "experiments.distill_student", "smoke", "--teacher", str(teacher_path), "--run-dir", str(run_dir)]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *args, "--distributed"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text())
    names = [s["file"] for s in manifest["shards"]]
    assert names == ["round_000_rank0.h5", "round_000_rank1.h5", "round_001_rank0.h5", "round_001_rank1.h5"]
    episodes = []
    for entry in manifest["shards"]:
        with h5py.File(run_dir / "data" / entry["file"], "r") as f:
            assert int(f.attrs["n_valid"]) == entry["rows"] > 0 and int(f.attrs["rank"]) == entry["rank"]
            episodes.append(set(np.unique(f["episode"][: entry["rows"]]).tolist()))
    # Episode ids never collide across ranks.
    assert not (episodes[0] & episodes[1]) and not (episodes[2] & episodes[3])
    summary = json.loads((run_dir / "eval.json").read_text())
    assert summary["world_size"] == 2 and summary["samples"] == sum(s["rows"] for s in manifest["shards"])
    saved = torch.load(run_dir / "checkpoints" / "round_002.pt", weights_only=False)
    assert saved["world_size"] == 2 and min(r["episodes"] for r in saved["ranks"]) >= 2 * 2  # 2 envs, 2 rounds
    # The two ranks drove different worlds: their env states differ.
    a, b = (saved["ranks"][k]["env_state"] for k in range(2))
    assert any(not torch.equal(a[key], b[key]) for key in a if isinstance(a[key], torch.Tensor))
    proc = subprocess.run(
        [sys.executable, *args, "--resume", str(run_dir)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "world size 2" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
