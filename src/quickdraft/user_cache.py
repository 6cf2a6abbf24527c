"""Where quickdraft keeps what it computes once per machine: early-exit calibrations and its compiled
CPU kernels. ``$QUICKDRAFT_CACHE_DIR``, else ``$XDG_CACHE_HOME/quickdraft``, else ``~/.cache/quickdraft``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("QUICKDRAFT_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quickdraft"
