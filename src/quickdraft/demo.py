"""`make demo`: speculative generation on the embedded pair, greedy and a seeded sample, each
streamed, then a line of figures for each measured in the same run (speculative vs plain on the
same model and prompt)."""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quickdraft.assets import default_draft_path, default_target_path, embedded_pair_available
from quickdraft.cli import apply_threads
from quickdraft.engine import Engine, GenerationResult
from quickdraft.model.loader import dtype_name
from quickdraft.sampling import GREEDY, SamplingParams

DEMO_PROMPT = 'def read_config(path):\n    """Read a JSON configuration file and return it as a dict."""\n'
MAX_NEW_TOKENS = 160
ROUNDS = 9  # each run is ~0.1 s: enough alternations that a burst of load elsewhere does not move a median
# A seeded sample is lossless too: the coupled rule (randomness.py) makes it the very text that plain
# sampling with the same seed writes.
DEMO_SAMPLING = SamplingParams(temperature=0.7, top_p=0.95, seed=0)


@dataclass
class DemoRun:
    result: GenerationResult
    spec_rates: list[float]
    plain_rates: list[float]
    same_as_plain: bool

    def line(self, label: str, plain: str) -> str:
        s = self.result.stats
        spec, base = statistics.median(self.spec_rates), statistics.median(self.plain_rates)
        same = "identical to" if self.same_as_plain else "DIFFERENT from"
        return (f"{label}: {s.generated_tokens} tokens at {spec:.0f} tokens/s speculative vs {base:.0f} plain = "
                f"{spec / base:.2f}x; acceptance {s.acceptance_rate:.2f}, {s.mean_accepted_length:.2f} tokens per "
                f"target pass; output {same} {plain}")


def _show_and_measure(engine: Engine, baseline: Engine, prompt: str | list[int], sampling: SamplingParams,
                      title: str) -> DemoRun:
    """Stream one speculative generation, then time it against plain decoding: a ratio of medians
    over alternating runs in this process, so that a noisy machine slows both sides alike."""
    print(f"--- {title} ---")
    if isinstance(prompt, str):
        sys.stdout.write(prompt)
    result = None
    for event in engine.stream(prompt, MAX_NEW_TOKENS, sampling, gamma="auto"):
        sys.stdout.write(event.text if isinstance(prompt, str) else " ".join(map(str, event.token_ids)) + " ")
        sys.stdout.flush()
        result = event.result
    assert result is not None
    print("\n")
    spec_rates, plain_rates = [result.stats.tokens_per_s], []
    for _ in range(ROUNDS):
        plain_rates.append(baseline.generate(prompt, MAX_NEW_TOKENS, sampling, gamma=0).stats.tokens_per_s)
        spec_rates.append(engine.generate(prompt, MAX_NEW_TOKENS, sampling, gamma="auto").stats.tokens_per_s)
    plain = engine.generate(prompt, MAX_NEW_TOKENS, sampling, gamma=0)  # the same engine: exact mode's bits
    return DemoRun(result, spec_rates, plain_rates, plain.token_ids == result.token_ids)


def _random_pair(workdir: Path) -> tuple[str, str]:
    """A small random Llama pair, for when the embedded models are not installed."""
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer
    from quickdraft.model.weights import save_pretrained

    import torch

    torch.manual_seed(0)
    paths = []
    for name, layers, width in (("target", 6, 256), ("draft", 1, 64)):
        config = ModelConfig(model_type="llama", vocab_size=512, n_embd=width, n_layer=layers, n_head=4, n_kv_head=4,
                             head_dim=width // 4, intermediate_size=2 * width, block_size=1024, norm_eps=1e-6,
                             tie_word_embeddings=True)
        path = workdir / name
        save_pretrained(Transformer(config), path)
        paths.append(str(path))
    return paths[0], paths[1]


def run_demo() -> int:
    if embedded_pair_available():
        target, draft = default_target_path(), default_draft_path()
        prompt: str | list[int] = DEMO_PROMPT
        print(f"quickdraft demo: embedded target {target}\n", file=sys.stderr)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="quickdraft-demo-"))
        target, draft = _random_pair(workdir)
        prompt = list(range(1, 33))
        print("quickdraft demo: the embedded model pair is not installed, so this runs on a small RANDOM "
              "model pair built on the fly (token ids, no text).\n", file=sys.stderr)
    governor = apply_threads()  # $QUICKDRAFT_THREADS, else the cores free, at start-up and as it runs
    # dtype auto: bf16 on CPUs with bf16 dot products. Target and draft run compiled steps; exact
    # mode keeps the output bit-identical to plain greedy decoding of the same engine. The baseline
    # is the fastest plain decoding: the same engine's 1-row steps when exact mode runs on compiled
    # row buckets, else a compiled engine outside exact mode.
    print("compiling the target's and the draft's steps (about a minute on a first run)...", file=sys.stderr)
    # The pair's default drafter, as in `quickdraft generate`: prompt lookup where the context repeats
    # itself, the draft model elsewhere.
    engine = Engine(target, f"prompt-lookup+{draft}", exact=True, dtype="auto", compile_drafter=True,
                    compile_target=True)
    engine.follow_free_cores(governor)
    engine.generate(prompt, 16, gamma="auto")  # warm-up: builds the graphs, outside every clock
    steps = engine.target_steps
    baseline = engine if steps is not None and steps.row_buckets[0] == 1 else \
        Engine(engine.target, None, exact=False, compile_target=True)
    baseline.generate(prompt, 16, gamma=0)
    greedy = _show_and_measure(engine, baseline, prompt, GREEDY, "greedy")
    sample = _show_and_measure(engine, baseline, prompt, DEMO_SAMPLING, f"sampled: temperature "
                               f"{DEMO_SAMPLING.temperature}, top-p {DEMO_SAMPLING.top_p}, seed {DEMO_SAMPLING.seed}")
    print()
    print(greedy.line("greedy ", "plain greedy decoding"))
    print(sample.line("sampled", "plain sampling with the same seed"))
    threads = f"{engine.threads} thread{'s' if engine.threads > 1 else ''}"
    print(f"({dtype_name(engine.model.dtype)}, exact mode, {threads}, prompt lookup then the draft model; speeds are medians "
          f"of {ROUNDS + 1} speculative and {ROUNDS} plain runs, alternating)")
    return 0
