"""The embedded model pairs, shipped inside the package (trained by quickdraft.train).

- ``embedded`` (the default; ``target/`` + ``draft/``): the pair of the benchmark's headline figures.
- ``embedded-copy`` (``copy/target/`` + ``copy/draft/``): the same target after copy-augmented
  fine-tuning, which continues text it has already seen, and a draft that copies too. For
  input-grounded work (editing, summarising, retrieval), where prompt lookup pays; MODEL_CARD.md.

``--target NAME`` accepts these names wherever it accepts a directory; an embedded target without
an explicit drafter speculates with its own pair's draft.
"""

from __future__ import annotations

from pathlib import Path

from quickdraft.errors import ModelNotFoundError

ASSETS = Path(__file__).parent
DEFAULT_PAIR = "embedded"
EMBEDDED_PAIRS = {"embedded": ASSETS, "embedded-copy": ASSETS / "copy"}


def _require(path: Path) -> str:
    if not (path / "config.json").exists():
        raise ModelNotFoundError(
            f"the embedded model {path} is not installed; pass --target PATH, or train it with `quickdraft train all`"
        )
    return str(path)


def embedded_target_path(pair: str = DEFAULT_PAIR) -> str:
    return _require(EMBEDDED_PAIRS[pair] / "target")


def embedded_draft_path(pair: str = DEFAULT_PAIR) -> str:
    return _require(EMBEDDED_PAIRS[pair] / "draft")


def default_target_path() -> str:
    return embedded_target_path(DEFAULT_PAIR)


def default_draft_path() -> str:
    return embedded_draft_path(DEFAULT_PAIR)


def embedded_pair_of(target: str | Path) -> str | None:
    """The embedded pair that ``target`` (a name, or a path to an embedded target) belongs to, if any."""
    text = str(target)
    if text in EMBEDDED_PAIRS:
        return text
    resolved = Path(text).expanduser().resolve()
    return next((name for name, root in EMBEDDED_PAIRS.items() if resolved == (root / "target").resolve()), None)


def embedded_draft_for(target: str | Path) -> str | None:
    """The draft of the embedded pair whose target ``target`` is (by name or path), else None."""
    pair = embedded_pair_of(target)
    return embedded_draft_path(pair) if pair is not None else None


def embedded_pair_available(pair: str = DEFAULT_PAIR) -> bool:
    root = EMBEDDED_PAIRS[pair]
    return (root / "target" / "config.json").exists() and (root / "draft" / "config.json").exists()
