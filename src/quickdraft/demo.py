"""`make demo`: speculative generation on the embedded pair, streamed, then one line of figures
measured in the same run (speculative vs plain on the same model and prompt)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from quickdraft.assets import default_draft_path, default_target_path, embedded_pair_available
from quickdraft.engine import Engine

DEMO_PROMPT = 'def read_config(path):\n    """Read a JSON configuration file and return it as a dict."""\n'
MAX_NEW_TOKENS = 160


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
    engine = Engine(target, draft, exact=False)
    engine.generate(prompt, 8, gamma=0)  # warm-up
    if isinstance(prompt, str):
        sys.stdout.write(prompt)
    result = None
    for event in engine.stream(prompt, MAX_NEW_TOKENS, gamma="auto"):
        sys.stdout.write(event.text if isinstance(prompt, str) else " ".join(map(str, event.token_ids)) + " ")
        sys.stdout.flush()
        result = event.result
    assert result is not None
    plain = engine.generate(prompt, MAX_NEW_TOKENS, gamma=0)
    spec, base = result.stats, plain.stats
    same = "identical to" if plain.token_ids == result.token_ids else "DIFFERENT from"
    print(
        f"\n\n{spec.generated_tokens} tokens at {spec.tokens_per_s:.1f} tokens/s speculative vs "
        f"{base.tokens_per_s:.1f} plain = {spec.tokens_per_s / base.tokens_per_s:.2f}x speedup; "
        f"acceptance {spec.acceptance_rate:.2f}, {spec.mean_accepted_length:.2f} tokens per target pass; "
        f"output {same} plain greedy decoding"
    )
    return 0
