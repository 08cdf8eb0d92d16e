"""Data-parallel PPO over two gloo ranks launched by torchrun: the update equals the single-process one on the same
batch, a two-rank run trains, checkpoints and resumes exactly, a killed rank stops the run, and bad launches are
refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from envs.distributed import Rank, env_share, per_rank
from envs.errors import ConfigError
from tests.helpers import small_env_config

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


def run(args, timeout=180, **kw):
    return subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def test_two_rank_update_equals_the_single_process_update(tmp_path):
    """Same recorded rollout of 8 envs: one process updates on all of them, two ranks on 4 each (gradients, KL,
    advantage and normalizer statistics reduced); the weights agree to 1e-5 and the update moved them. So do they with
    the warm start's behaviour-cloning term in the loss (each rank cloning its half of the expert samples), which
    changes the update."""
    worker = str(ROOT / "tests" / "teacher" / "ppo_update_worker.py")
    single, double = tmp_path / "single.pt", tmp_path / "double.pt"
    proc = run([sys.executable, worker, str(single)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run([*TORCHRUN, worker, str(double)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = torch.load(single), torch.load(double)
    for part in ("actor", "critic", "actor_bc", "critic_bc"):
        for key, value in a[part].items():
            assert torch.allclose(value.double(), b[part][key].double(), atol=1e-5, rtol=0), (part, key)
    moved = max(float((a["actor"][k] - a["before"][k]).abs().max()) for k in a["actor"] if "normalizer" not in k)
    cloned = max(float((a["actor_bc"][k] - a["actor"][k]).abs().max()) for k in a["actor"] if "normalizer" not in k)
    assert moved > 1e-3 and cloned > 1e-4


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("iter_*.pt"))


def test_two_rank_teacher_kill_one_rank_then_resume(tmp_path):
    """A two-rank smoke run checkpoints every iteration; killing rank 1 ends the whole run (non-zero, well within the
    timeout); `--resume` continues from the last checkpoint with two ranks and finishes; one process is refused."""
    run_dir = tmp_path / "run"
    args = ["-m", "experiments.train_teacher", "smoke", "--run-dir", str(run_dir), "--distributed",
            "--distributed-timeout-s", "60", "--trainer.save-every", "1", "--trainer.eval-every", "1000"]  # fmt: skip
    proc = subprocess.Popen(
        [*TORCHRUN, *args, "--trainer.iterations", "100000"], cwd=ROOT, env=ENV,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while len(_checkpoints(run_dir)) < 3 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(_checkpoints(run_dir)) >= 3, "the two-rank run wrote no checkpoints"
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        assert workers, "no rank-1 worker found"
        killed_at = time.time()
        workers[0].send_signal(signal.SIGKILL)
        code = proc.wait(timeout=90)
        assert code != 0 and time.time() - killed_at < 90
    finally:
        if proc.poll() is None:
            proc.kill()
    last = _checkpoints(run_dir)[-1]
    saved = torch.load(last, weights_only=False)
    assert saved["world_size"] == 2 and len(saved["ranks"]) == 2
    stop = int(saved["iteration"])
    proc = run([*TORCHRUN, *args, "--trainer.iterations", str(stop + 2), "--resume", str(run_dir)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"at iteration {stop}" in proc.stdout
    assert json.loads((run_dir / "eval.json").read_text())["iterations"] == stop + 2
    single = [a for a in args if a != "--distributed"]
    proc = run([sys.executable, *single, "--trainer.iterations", str(stop + 4), "--resume", str(run_dir)])
    assert proc.returncode == 2 and "world size 2" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_two_rank_resume_is_exact(tmp_path):
    """A two-rank run resumed from its iteration-2 checkpoint ends with the same weights as the uninterrupted one."""
    base = ["-m", "experiments.train_teacher", "smoke", "--distributed", "--trainer.iterations", "4"]
    proc = run([*TORCHRUN, *base, "--run-dir", str(tmp_path / "a")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    (tmp_path / "b" / "checkpoints" / "iter_000002.pt").write_bytes(
        (tmp_path / "a" / "checkpoints" / "iter_000002.pt").read_bytes()
    )
    proc = run([*TORCHRUN, *base, "--run-dir", str(tmp_path / "b"), "--resume", str(tmp_path / "b")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = torch.load(tmp_path / "a" / "checkpoints" / "iter_000004.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "checkpoints" / "iter_000004.pt", weights_only=False)
    for key, value in a["actor"].items():
        assert torch.equal(value, b["actor"][key]), key
    for k in range(2):
        assert torch.equal(a["ranks"][k]["rng"]["torch"], b["ranks"][k]["rng"]["torch"])


def test_bad_launches_are_refused_in_one_line(tmp_path):
    args = ["-m", "experiments.train_teacher", "smoke", "--run-dir", str(tmp_path / "r")]
    proc = run([sys.executable, *args, "--distributed"])
    assert proc.returncode == 2 and "torchrun" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run([*TORCHRUN, *args])  # torchrun without --distributed
    assert proc.returncode != 0 and "without --distributed" in proc.stderr
    proc = run([*TORCHRUN, *args, "--distributed", "--env.num-envs", "33"])
    assert proc.returncode != 0 and "env.num_envs 33 is not divisible by the world size 2" in proc.stderr


def test_env_share_and_per_rank():
    cfg = small_env_config(num_envs=8, seed=3)
    one, two = env_share(cfg, Rank(0, 2, 0)), env_share(cfg, Rank(1, 2, 1))
    assert (one.num_envs, two.num_envs) == (4, 4) and one.seed == 3 and two.seed != 3
    assert env_share(cfg, Rank()) is cfg
    assert per_rank(12, Rank(1, 3, 1), "dagger.batch_windows") == 4
    with pytest.raises(ConfigError, match="dagger.batch_windows 12 is not divisible by the world size 5"):
        per_rank(12, Rank(0, 5, 0), "dagger.batch_windows")


def test_two_rank_warm_start_keeps_the_ranks_equal_and_resumes_exactly(tmp_path):
    """Each rank records the expert in its own envs; after the cloning (gradients averaged, normalizer statistics
    reduced) and after PPO with the cloning term, both ranks hold the same weights; a resume from iteration 1 reads each
    rank's rollouts back and ends with the uninterrupted run's weights."""
    proc = run([*TORCHRUN, str(ROOT / "tests" / "teacher" / "warm_start_worker.py"), str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(tmp_path / "result.pt")
    assert result["rollouts"] == [20 * 16, 20 * 16]  # the expert's 8 envs and a DAgger round's
    for stage in ("cloned", "final", "resumed"):
        zero, one = result[stage]
        assert all(torch.allclose(zero[k], one[k], atol=1e-6, rtol=0) for k in zero), stage
    final, resumed = result["final"][0], result["resumed"][0]
    assert all(torch.equal(final[k], resumed[k]) for k in final)
    saved = torch.load(tmp_path / "a" / "checkpoints" / "expert_rollouts.pt")
    assert len(saved["ranks"]) == 2 and (tmp_path / "b" / "checkpoints" / "expert_rollouts.pt").is_file()
