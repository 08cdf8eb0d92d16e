"""The machine a measurement ran on, recorded next to every benchmark figure (figures compare only on one machine)."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import torch

from envs.errors import ConfigError


def machine() -> dict:
    """Platform, CPU, torch and Python versions, torch threads, and the load average before the measurements."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        # Other work on the machine shifts every figure: the 1-minute load average before the measurements started.
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def check_device(device: str) -> torch.device:
    """The device, refused in one line naming `--device` when it is CUDA and torch sees none."""
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"--device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA device on this machine; use --device cpu")
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so that a timer sees it done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_info(device: torch.device) -> dict:
    """The device's name (the CPU's when not CUDA), and for CUDA its memory, compute capability and CUDA version."""
    if device.type != "cuda":
        return {"type": device.type, "name": machine()["processor"]}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": torch.cuda.get_device_name(device), "memory_gib": props.total_memory / 2**30,
            "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}  # fmt: skip


def package_versions() -> dict:
    """Installed versions of the packages a GPU-path figure depends on (None where one is missing)."""
    found = {}
    for name in ("torch", "genesis-world", "quadrants", "rsl-rl-lib", "triton", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
