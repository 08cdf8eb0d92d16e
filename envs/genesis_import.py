"""The one way to import Genesis, so that torch.compile still works in the same process.

Importing Genesis imports quadrants (its kernel compiler), which checks the installed pip's version with `import pip`.
On Python < 3.12, setuptools' distutils shim answers a first `import pip` by turning itself off for the rest of the
process (pip wants the stdlib distutils). Inductor's C++ build later imports `torch.utils.cpp_extension`, hence
setuptools, which loads distutils again — now the stdlib copy — and fails its own check
(`AssertionError: .../distutils/core.py`); every compiled function then falls back to eager.

Two guards: quadrants skips that version check when `QD_MANYLINUX2014_OK` is set (the check only prints advice
about old glibc or pip), and setuptools is imported first, so its distutils is in place before anything can turn
the shim off.

`init_genesis` runs `gs.init` once per process for every task's scenes, with the settings of `GenesisConfig`.
"""

from __future__ import annotations

import os
import platform
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from envs.errors import ConfigError, check_range

_GS_STATE: dict[str, object] = {}


def import_genesis() -> ModuleType:
    """`import genesis`, without leaving setuptools' distutils shim switched off for the rest of the process."""
    import setuptools  # noqa: F401  (before genesis: see the module docstring)

    os.environ.setdefault("QD_MANYLINUX2014_OK", "1")
    import genesis

    return genesis


@dataclass(frozen=True)
class GenesisConfig:
    """Genesis engine settings. `gs.init` runs once per process, so the first Genesis env of a process fixes them."""

    performance_mode: bool = False
    """static-array kernels: faster physics steps, but Genesis' kernel fast cache does not apply to them, so every
    process traces its kernels again and a warm scene build is several times slower (docs/results.md#throughput);
    for long runs"""
    msaa_samples: int = 0
    """multisample anti-aliasing of the Genesis rasterizer (0 = off); on a software rasterizer samples multiply the
    render time of a frame, and the sensor model blurs edges anyway"""
    fisheye_scale: float = 0.75
    """resolution of the pinhole render behind a fisheye lens, as a fraction of the fisheye's focal length at the
    image centre (the render covers the whole fisheye frame; 1.0 keeps the centre at full resolution, at ~1.8x the
    pixels of 0.75)"""

    def __post_init__(self) -> None:
        if self.msaa_samples not in (0, 2, 4):
            raise ConfigError(f"genesis.msaa_samples={self.msaa_samples}; use 0 (off), 2 or 4")
        check_range("genesis.fisheye_scale", self.fisheye_scale, 0.25, 2.0)


class _CpuName:
    """Stands in for py-cpuinfo while `gs.init` runs: the name of the CPU from /proc/cpuinfo (or `platform`)."""

    @staticmethod
    def get_cpu_info() -> dict[str, str]:
        name = ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        return {"brand_raw": name or platform.processor() or platform.machine() or "cpu"}


@contextmanager
def _cpu_name_without_subprocess():
    """`gs.init` on the CPU backend asks py-cpuinfo for the CPU's name, for its start-up banner only, and py-cpuinfo
    answers from a Python subprocess, a noticeable part of every Genesis start-up. The name is read from /proc/cpuinfo
    instead while `gs.init` runs; where Genesis no longer looks the name up that way, nothing is replaced."""
    import_genesis()
    import genesis.utils.misc as gs_misc

    original = getattr(gs_misc, "cpuinfo", None)
    if original is None or not hasattr(original, "get_cpu_info"):
        yield
        return
    gs_misc.cpuinfo = _CpuName
    try:
        yield
    finally:
        gs_misc.cpuinfo = original


def init_genesis(device: torch.device, cfg: GenesisConfig | None = None) -> object:
    """`gs.init` once per process, on the CPU backend (or CUDA when the env lives on a GPU)."""
    cfg = cfg or GenesisConfig()
    if "gs" in _GS_STATE:
        if _GS_STATE["performance_mode"] != cfg.performance_mode:
            raise ConfigError(
                f"genesis.performance_mode={cfg.performance_mode}, but Genesis is already initialized in this process "
                f"with performance_mode={_GS_STATE['performance_mode']}; use one setting per process"
            )
        return _GS_STATE["gs"]
    try:
        gs = import_genesis()
    except ImportError as err:  # pragma: no cover - genesis is a core dependency
        raise ConfigError(f"env.physics=genesis needs genesis-world ({err})") from None
    backend = gs.gpu if device.type == "cuda" else gs.cpu
    with _cpu_name_without_subprocess():
        gs.init(backend=backend, precision="32", logging_level="warning", performance_mode=cfg.performance_mode, seed=0)
    _GS_STATE["gs"], _GS_STATE["performance_mode"] = gs, cfg.performance_mode
    return gs
