"""quickdraft: lossless speculative decoding: a library, a CLI and an OpenAI-compatible server.

The names below are imported on first use, so that the server's HTTP process, which imports
``quickdraft.server`` and runs no model, does not load torch (~340 MiB)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quickdraft.engine import Engine
    from quickdraft.errors import QuickdraftError
    from quickdraft.output import GenerationResult, StreamEvent
    from quickdraft.sampling_params import SamplingParams
    from quickdraft.stats import GenerationStats

_EXPORTS = {"Engine": "quickdraft.engine", "GenerationResult": "quickdraft.output", "StreamEvent": "quickdraft.output",
            "QuickdraftError": "quickdraft.errors", "SamplingParams": "quickdraft.sampling_params",
            "GenerationStats": "quickdraft.stats"}
__all__ = sorted(_EXPORTS)
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'quickdraft' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
