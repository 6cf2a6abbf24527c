"""The embedded default model pair, shipped inside the package (trained by quickdraft.train)."""

from __future__ import annotations

from pathlib import Path

from quickdraft.errors import ModelNotFoundError

ASSETS = Path(__file__).parent


def _require(path: Path) -> str:
    if not (path / "config.json").exists():
        raise ModelNotFoundError(
            f"the embedded model {path} is not installed; pass --target PATH, or train it with `quickdraft train all`"
        )
    return str(path)


def default_target_path() -> str:
    return _require(ASSETS / "target")


def default_draft_path() -> str:
    return _require(ASSETS / "draft")


def embedded_pair_available() -> bool:
    return (ASSETS / "target" / "config.json").exists() and (ASSETS / "draft" / "config.json").exists()
