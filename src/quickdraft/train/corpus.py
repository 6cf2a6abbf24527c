"""The training corpus: the Python standard library source of the running interpreter.

One domain done well: ~700 modules of idiomatic, well documented Python, under the PSF licence,
present wherever Python is. The file list is sorted and the held-out split is decided by a hash of
each file's relative path, so the same interpreter always gives the same corpus and split.

Output (``out_dir``): ``train.jsonl`` and ``val.jsonl`` (one ``{"path", "text"}`` per file) and
``manifest.json`` (provenance, licence, file and byte counts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import sysconfig
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# Directories that are not library code (test suites, vendored packages, generated data tables).
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "pydoc_data", "encodings",
                 "__pycache__"}
EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")
MAX_FILE_BYTES = 400_000
HELD_OUT_PERCENT = 3  # ~3% of files, chosen by path hash: validation text and held-out prompts
LICENCE = "Python Software Foundation License Version 2 (PSF-2.0)"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str, percent: int = HELD_OUT_PERCENT) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def source_files(root: Path) -> list[Path]:
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith(EXCLUDED_PREFIXES) for part in rel.parts):
            continue
        if path.stat().st_size > MAX_FILE_BYTES or path.stat().st_size == 0:
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        log.warning("skipping %s: %s", path, exc)
        return None
    return text.replace("\r\n", "\n")


def iter_documents(path: Path) -> Iterator[dict[str, str]]:
    """The records of a corpus .jsonl file, one per non-blank line."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def build_corpus(out_dir: Path, root: Path | None = None, *, limit_files: int | None = None,
                 held_out_percent: int = HELD_OUT_PERCENT) -> dict[str, object]:
    """Write train.jsonl, val.jsonl and manifest.json under ``out_dir``; return the manifest."""
    root = root or stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"standard library not found at {root}")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = source_files(root)[:limit_files]
    counts = {"train": [0, 0], "val": [0, 0]}  # files, bytes
    held_out_paths = []
    with (out_dir / "train.jsonl").open("w") as train, (out_dir / "val.jsonl").open("w") as val:
        for path in files:
            text = _read(path)
            if text is None:
                continue
            rel = path.relative_to(root).as_posix()
            split = "val" if is_held_out(rel, held_out_percent) else "train"
            (val if split == "val" else train).write(json.dumps({"path": rel, "text": text}) + "\n")
            counts[split][0] += 1
            counts[split][1] += len(text.encode())
            if split == "val":
                held_out_paths.append(rel)
    manifest = {
        "source": "Python standard library source (*.py)",
        "root": str(root),
        "python": platform.python_version(),
        "licence": LICENCE,
        "excluded": sorted(EXCLUDED_DIRS) + [p + "*" for p in EXCLUDED_PREFIXES] + [f"files > {MAX_FILE_BYTES} bytes"],
        "split": f"held out when sha256(relative path) % 100 < {held_out_percent}",
        "train_files": counts["train"][0],
        "train_bytes": counts["train"][1],
        "val_files": counts["val"][0],
        "val_bytes": counts["val"][1],
        "val_paths": held_out_paths,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log.info("corpus: %d train files (%d bytes), %d held-out files (%d bytes) from %s", *counts["train"],
             *counts["val"], root)
    return manifest
