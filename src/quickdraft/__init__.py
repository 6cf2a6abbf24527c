"""quickdraft: lossless speculative decoding: a library, a CLI and an OpenAI-compatible server."""

from quickdraft.engine import Engine, GenerationResult, StreamEvent
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import SamplingParams
from quickdraft.stats import GenerationStats

__all__ = ["Engine", "GenerationResult", "GenerationStats", "QuickdraftError", "SamplingParams", "StreamEvent"]
__version__ = "0.1.0"
