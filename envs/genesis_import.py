"""The one way to import Genesis, so that torch.compile still works in the same process.

Importing Genesis imports quadrants (its kernel compiler), which checks the installed pip's version with `import pip`.
On Python < 3.12, setuptools' distutils shim answers a first `import pip` by turning itself off for the rest of the
process (pip wants the stdlib distutils). Inductor's C++ build later imports `torch.utils.cpp_extension`, hence
setuptools, which loads distutils again — now the stdlib copy — and fails its own check
(`AssertionError: .../distutils/core.py`); every compiled function then falls back to eager.

Two guards: quadrants skips that version check when `QD_MANYLINUX2014_OK` is set (the check only prints advice
about old glibc or pip), and setuptools is imported first, so its distutils is in place before anything can turn
the shim off.
"""

from __future__ import annotations

import os
from types import ModuleType


def import_genesis() -> ModuleType:
    """`import genesis`, without leaving setuptools' distutils shim switched off for the rest of the process."""
    import setuptools  # noqa: F401  (before genesis: see the module docstring)

    os.environ.setdefault("QD_MANYLINUX2014_OK", "1")
    import genesis

    return genesis
