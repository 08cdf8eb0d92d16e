"""The machine a measurement ran on, recorded next to every benchmark figure (figures compare only on one machine)."""

from __future__ import annotations

import os
import platform

import torch


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
