"""`maybe_compile` really compiles, also in a process that imported Genesis first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Prints "compiled" only when the compiled function ran without `maybe_compile` falling back to eager (which it
# reports with a "torch.compile unavailable" warning) and agreed with the eager result.
COMPILE_AFTER_GENESIS = """
import warnings

from envs.genesis_import import import_genesis

import_genesis()
import torch

from envs.jit import maybe_compile


def affine_sin(x):
    return torch.sin(x) * 2.0 + 1.0


x = torch.linspace(-3.0, 3.0, 16)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = maybe_compile(affine_sin, enabled=True)(x)
fallbacks = [str(w.message) for w in caught if "torch.compile unavailable" in str(w.message)]
assert not fallbacks, fallbacks
torch.testing.assert_close(y, affine_sin(x))
print("compiled")
"""


@pytest.mark.genesis
def test_maybe_compile_compiles_after_importing_genesis():
    """Genesis' import turned setuptools' distutils shim off, and Inductor's C++ build then failed in that process."""
    env = {k: v for k, v in os.environ.items() if k != "QD_MANYLINUX2014_OK"}  # as a fresh shell has it
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_AFTER_GENESIS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "compiled"
