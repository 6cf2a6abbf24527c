"""Where quickdraft keeps what it computes once per machine: early-exit calibrations, the native
steps' row timings and its compiled CPU kernels. ``$QUICKDRAFT_CACHE_DIR``, else
``$XDG_CACHE_HOME/quickdraft``, else ``~/.cache/quickdraft``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    root = os.environ.get("QUICKDRAFT_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quickdraft"


def read_json(path: Path) -> dict:
    """A cache file's entries; none for a missing or damaged file (computed again and rewritten)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    """Replace a cache file atomically (a concurrent reader sees the old or the new file, never half);
    a cache that cannot be written only costs the next process the computation again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not write the cache file %s (%s); the result holds for this process", path, exc)
