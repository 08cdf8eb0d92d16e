"""Test-session setup: W&B disabled and all caches in a temp dir; small env configs."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_TMP = tempfile.mkdtemp(prefix="gapbridge-tests-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # the session's caches go with it
os.environ["WANDB_MODE"] = "disabled"
os.environ["WANDB_SILENT"] = "true"
os.environ["WANDB_DIR"] = os.path.join(_TMP, "wandb")
os.environ["WANDB_CACHE_DIR"] = os.path.join(_TMP, "wandb-cache")
os.environ["WANDB_CONFIG_DIR"] = os.path.join(_TMP, "wandb-config")
os.environ.setdefault("XDG_CACHE_HOME_FOR_TESTS", os.path.join(_TMP, "xdg-cache"))
os.environ["MPLBACKEND"] = "Agg"


@pytest.fixture(scope="session")
def demo_smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`experiments.demo smoke` run once (each stage its script in its own process) and its output directory: the
    demo's test and the DAgger smoke test (its student stage is `distill_student smoke`) both read it."""
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.demo", "smoke", "--out-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    return proc, out
