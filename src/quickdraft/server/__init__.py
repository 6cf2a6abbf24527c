"""OpenAI-compatible HTTP server (FastAPI + uvicorn): ``quickdraft serve``.

FastAPI is an optional dependency (``pip install quickdraft[serve]``), so nothing here imports it
until it is used: the CLI can list ``serve`` without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from quickdraft.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
