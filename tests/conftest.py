"""Test-session setup: W&B disabled and all caches in a temp dir; small env configs."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_TMP = tempfile.mkdtemp(prefix="gapbridge-tests-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # the session's caches go with it
os.environ["WANDB_MODE"] = "disabled"
os.environ["WANDB_SILENT"] = "true"
os.environ["WANDB_DIR"] = os.path.join(_TMP, "wandb")
os.environ["WANDB_CACHE_DIR"] = os.path.join(_TMP, "wandb-cache")
os.environ["WANDB_CONFIG_DIR"] = os.path.join(_TMP, "wandb-config")
os.environ.setdefault("XDG_CACHE_HOME_FOR_TESTS", os.path.join(_TMP, "xdg-cache"))
os.environ["MPLBACKEND"] = "Agg"
