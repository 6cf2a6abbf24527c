"""llama.cpp as a benchmark peer, on GGUF conversions of the same checkpoints.

``scripts/llama_cpp/build.sh`` builds llama.cpp into a directory (by default
``~/.cache/quickdraft/llama.cpp``) and ``scripts/llama_cpp/convert.sh`` writes the embedded pairs
there as ``gguf/<pair>-<model>-<f32|bf16>.gguf``. That directory is what ``quickdraft bench
--llama-cpp DIR`` (or ``QUICKDRAFT_LLAMA_CPP``) takes.

Two runs per prompt, each a fresh process, greedy, EOS ignored:
- plain: ``llama-completion``; its time is llama.cpp's own context timer ("eval time": the
  one-token decodes after the prompt) plus its sampling time, loading and prompt processing left out;
- speculative: ``llama-speculative-simple`` with the draft GGUF and a fixed draft of 8 tokens; its
  time is the "decoded N tokens in T seconds" line: everything after prompt processing (drafting,
  verifying, sampling).
Both print the generated text, not token ids: identity with our output is checked on bytes.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.errors import QuickdraftError

ENV_VAR = "QUICKDRAFT_LLAMA_CPP"
PLAIN_TOOL = "llama-completion"
SPECULATIVE_TOOL = "llama-speculative-simple"
TOKENIZE_TOOL = "llama-tokenize"
DRAFT_MAX = 8
# Our dtype names -> the converter's GGUF type, which also names the KV cache type we ask for.
GGUF_TYPES = {"fp32": "f32", "bf16": "bf16"}
RUN_TIMEOUT_S = 600
BUILD_HINT = "build it with scripts/llama_cpp/build.sh [DIR]"


class LlamaCppError(QuickdraftError):
    pass


@dataclass(frozen=True)
class LlamaCppRun:
    """One llama.cpp generation, as its output reports it."""

    text: bytes  # the generated continuation, bytes as llama.cpp printed them
    n_tokens: int  # generated tokens
    decode_seconds: float  # llama.cpp's own timer, prompt processing and loading excluded
    decode_tokens: int  # the tokens that decode_seconds covers
    drafted: int = 0
    accepted: int = 0
    prompt_tokens: int | None = None  # as llama.cpp tokenized the prompt, where it says

    def seconds_for(self, tokens: int) -> float:
        """Decode time at llama.cpp's measured rate for ``tokens`` tokens."""
        return self.decode_seconds / self.decode_tokens * tokens


# ---- locating the build and the GGUF files ----------------------------------------------------
def find_bin_dir(root: Path) -> Path:
    """The directory holding llama.cpp's tools: ``root`` itself, ``root/bin`` or ``root/build/bin``."""
    if not root.is_dir():
        raise LlamaCppError(f"llama.cpp directory {root} does not exist; {BUILD_HINT}")
    for candidate in (root, root / "bin", root / "build" / "bin"):
        if all((candidate / tool).is_file() for tool in (PLAIN_TOOL, SPECULATIVE_TOOL)):
            return candidate
    raise LlamaCppError(f"no {PLAIN_TOOL} and {SPECULATIVE_TOOL} in {root}, {root}/bin or {root}/build/bin; "
                        f"{BUILD_HINT}")


def gguf_stem(model_path: str | Path) -> str:
    """``<pair>-<target|draft>`` for a model of an embedded pair (the models convert.sh converts);
    a pair's name (``--target embedded-copy``) stands for its target."""
    from quickdraft.assets import EMBEDDED_PAIRS

    if str(model_path) in EMBEDDED_PAIRS:
        return f"{model_path}-target"
    resolved = Path(model_path).expanduser().resolve()
    for pair, root in EMBEDDED_PAIRS.items():
        for role in ("target", "draft"):
            if resolved == (root / role).resolve():
                return f"{pair}-{role}"
    raise LlamaCppError(f"the llama.cpp peer runs the embedded pairs only (scripts/llama_cpp/convert.sh converts "
                        f"them); {model_path} is not one of them")


def gguf_path(root: Path, model_path: str | Path, dtype: str) -> Path:
    if dtype not in GGUF_TYPES:
        raise LlamaCppError(f"the llama.cpp peer runs {' and '.join(GGUF_TYPES)} only, not {dtype}")
    path = root / "gguf" / f"{gguf_stem(model_path)}-{GGUF_TYPES[dtype]}.gguf"
    if not path.is_file():
        raise LlamaCppError(f"{path} does not exist; convert the embedded pairs with "
                            f"scripts/llama_cpp/convert.sh {root}")
    return path


# ---- parsing their output ---------------------------------------------------------------------
_EVAL = re.compile(r"common_perf_print:\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_SAMPLING = re.compile(r"common_perf_print:\s+sampling time =\s*([\d.]+) ms")
_PROMPT_EVAL = re.compile(r"common_perf_print: prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
# What each tool prints on stdout around the generated text. llama.cpp's logger is asynchronous and
# left running at exit, so a process's last lines are sometimes lost: the speculative tool's closing
# "\n\n" (its last line) may be missing, and a run whose timing lines are missing is run again.
PLAIN_TAIL = b"\n\n"
SPECULATIVE_HEAD, SPECULATIVE_TAIL = b"\n\n", b"\n\n"
ATTEMPTS = 3


def _search(pattern: re.Pattern[str], log: str, tool: str) -> re.Match[str]:
    match = pattern.search(log)
    if match is None:
        raise LlamaCppError(f"{tool} printed no line matching {pattern.pattern!r}; is it the llama.cpp that "
                            "scripts/llama_cpp/build.sh builds?")
    return match


def _strip(text: bytes, head: bytes, tail: bytes, tool: str) -> bytes:
    if not (text.startswith(head) and text.endswith(tail)) or len(text) < len(head) + len(tail):
        raise LlamaCppError(f"{tool}'s output is not framed as expected: {text[:60]!r}...{text[-20:]!r}")
    return text[len(head):len(text) - len(tail)]


def parse_plain(stdout: bytes, log: str, requested: int) -> LlamaCppRun:
    """llama-completion's output (run with --no-display-prompt): ``stdout`` the generated text,
    ``log`` its stderr with the timings.

    Its eval line counts one-token decodes: the first generated token comes from the prompt's
    forward, so ``requested`` tokens take ``requested - 1`` runs; the rate is runs / (eval time +
    sampling time)."""
    eval_ms, runs = _search(_EVAL, log, PLAIN_TOOL).groups()
    sampling_ms = _search(_SAMPLING, log, PLAIN_TOOL).group(1)
    if int(runs) != requested - 1:
        raise LlamaCppError(f"{PLAIN_TOOL} decoded {runs} tokens after the prompt, expected {requested - 1}")
    return LlamaCppRun(text=_strip(stdout, b"", PLAIN_TAIL, PLAIN_TOOL), n_tokens=requested,
                       decode_seconds=(float(eval_ms) + float(sampling_ms)) / 1000, decode_tokens=int(runs),
                       prompt_tokens=int(_search(_PROMPT_EVAL, log, PLAIN_TOOL).group(1)))


def parse_speculative(stdout: bytes, log: str, prompt: bytes) -> LlamaCppRun:
    """llama-speculative-simple's output: ``stdout`` is the prompt as llama.cpp detokenizes it, then
    the generated text; ``log`` its stderr. It generates more than asked for (it stops once past the
    count, keeping every token of its last step), so its text is compared as a prefix, and that
    text may end with the tool's closing "\n\n" (see SPECULATIVE_TAIL)."""
    n_tokens, seconds = _search(_DECODED, log, SPECULATIVE_TOOL).groups()
    echoed = _strip(stdout, SPECULATIVE_HEAD, SPECULATIVE_TAIL, SPECULATIVE_TOOL)
    if not echoed.startswith(prompt):
        raise LlamaCppError(f"{SPECULATIVE_TOOL} echoed a different prompt ({echoed[:60]!r}...): its "
                            "tokenization of the prompt differs from ours")
    return LlamaCppRun(text=echoed[len(prompt):], n_tokens=int(n_tokens), decode_seconds=float(seconds),
                       decode_tokens=int(n_tokens),
                       drafted=int(_search(_DRAFTED, log, SPECULATIVE_TOOL).group(1)),
                       accepted=int(_search(_ACCEPTED, log, SPECULATIVE_TOOL).group(1)))


# ---- our side of the comparison ---------------------------------------------------------------
def _byte_level_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable character table (GPT-2's): bytes that are
    printable stand for themselves, the others for 256, 257, ... in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    table = {chr(b): b for b in kept}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


_BYTE_OF = _byte_level_decoder()


def token_bytes(tokenizer: Any, ids: Sequence[int]) -> bytes:
    """The bytes a byte-level BPE tokenizer's ``ids`` stand for, as llama.cpp prints them (special
    tokens as their text). Comparing bytes, not decoded text, keeps a token that ends inside a UTF-8
    character exact."""
    special = {i: t for t, i in tokenizer.special_tokens().items()}
    out = bytearray()
    for i in ids:
        if i in special:
            out += special[i].encode()
        else:
            out += bytes(_BYTE_OF[c] for c in tokenizer.backend.id_to_token(i))
    return bytes(out)


def same_output(run: LlamaCppRun, ours: bytes, our_tokens: int) -> bool:
    """Whether llama.cpp generated what we did: the same bytes for the same token count, or (when
    it generated more) ours as a prefix of its."""
    if run.n_tokens == our_tokens:
        return run.text == ours
    return run.n_tokens > our_tokens and run.text.startswith(ours)


# ---- running it -------------------------------------------------------------------------------
class LlamaCpp:
    """llama.cpp's tools on one target (and optionally a draft) GGUF, greedy, EOS ignored."""

    def __init__(self, bin_dir: Path, target: Path, draft: Path | None = None, *, threads: int = 1,
                 cache_type: str = "f32", draft_cache_type: str = "f32", draft_max: int = DRAFT_MAX) -> None:
        self.bin_dir, self.target, self.draft = bin_dir, target, draft
        self.threads, self.draft_max = threads, draft_max
        self.cache_type, self.draft_cache_type = cache_type, draft_cache_type

    @classmethod
    def for_models(cls, root: str | Path, target: str | Path, draft: str | Path | None, dtype: str,
                   draft_dtype: str, threads: int) -> LlamaCpp:
        """The build under ``root`` (a build.sh directory) with the GGUF conversions of ``target`` and
        ``draft`` in our dtypes; the KV caches are kept in the same dtypes."""
        root = Path(root).expanduser()
        return cls(find_bin_dir(root), gguf_path(root, target, dtype),
                   gguf_path(root, draft, draft_dtype) if draft is not None else None, threads=threads,
                   cache_type=GGUF_TYPES[dtype], draft_cache_type=GGUF_TYPES[draft_dtype])

    def version(self) -> str:
        out = subprocess.run([str(self.bin_dir / PLAIN_TOOL), "--version"], capture_output=True, text=True,
                             timeout=60)
        line = next((x for x in (out.stdout + out.stderr).splitlines() if x.startswith("version:")), "")
        return line.removeprefix("version:").strip() or "unknown version"

    def _common(self, prompt: str, max_new: int) -> list[str]:
        return ["-m", str(self.target), "-p", prompt, "-n", str(max_new), "-t", str(self.threads),
                "-tb", str(self.threads), "--temp", "0", "--ignore-eos",
                "-ctk", self.cache_type, "-ctv", self.cache_type]

    def plain_command(self, prompt: str, max_new: int) -> list[str]:
        return [str(self.bin_dir / PLAIN_TOOL), *self._common(prompt, max_new),
                "-no-cnv", "--no-escape", "--no-display-prompt"]

    def speculative_command(self, prompt: str, max_new: int) -> list[str]:
        if self.draft is None:
            raise LlamaCppError("speculative decoding needs a draft GGUF")
        # This tool has no --no-escape: double the backslashes its escape processing would eat.
        escaped = prompt.replace("\\", "\\\\")
        return [str(self.bin_dir / SPECULATIVE_TOOL), *self._common(escaped, max_new),
                "-md", str(self.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(self.draft_max),
                "-td", str(self.threads), "-tbd", str(self.threads),
                "-ctkd", self.draft_cache_type, "-ctvd", self.draft_cache_type]

    def plain(self, prompt: str, max_new: int) -> LlamaCppRun:
        return self._run_parsed(self.plain_command(prompt, max_new), lambda out, log: parse_plain(out, log, max_new))

    def speculative(self, prompt: str, max_new: int) -> LlamaCppRun:
        return self._run_parsed(self.speculative_command(prompt, max_new),
                                lambda out, log: parse_speculative(out, log, prompt.encode()))

    def _run_parsed(self, command: list[str], parse: Callable[[bytes, str], LlamaCppRun]) -> LlamaCppRun:
        for attempt in range(ATTEMPTS):
            try:
                return parse(*self._run(command))
            except LlamaCppError:  # output lost at exit (see SPECULATIVE_TAIL): the run is deterministic, rerun it
                if attempt == ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def tokenize(self, text: str) -> list[int]:
        tool = self.bin_dir / TOKENIZE_TOOL
        if not tool.is_file():
            raise LlamaCppError(f"no {TOKENIZE_TOOL} in {self.bin_dir}; {BUILD_HINT}")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            stdout, _ = self._run([str(tool), "-m", str(self.target), "-f", f.name, "--ids", "--log-disable"])
        return [int(v) for v in re.findall(rb"-?\d+", stdout.strip().splitlines()[-1])]

    @staticmethod
    def _run(command: list[str]) -> tuple[bytes, str]:
        try:
            done = subprocess.run(command, capture_output=True, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise LlamaCppError(f"{Path(command[0]).name} ran past {RUN_TIMEOUT_S} s") from exc
        log = done.stderr.decode(errors="replace")
        if done.returncode != 0:
            tail = "\n".join(log.splitlines()[-5:])
            raise LlamaCppError(f"{Path(command[0]).name} exited with {done.returncode}:\n{tail}")
        return done.stdout, log
