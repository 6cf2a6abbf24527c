"""What a prompt's prefill costs with and without the LM head, in one process (round 11).

    .venv/bin/python docs/bench/prefill_cost.py [--threads 1]

On the embedded target (dtype auto): for prompts of several lengths, a forward that computes every
row's logits (``model(tokens, 0, cache)``, as prefill did before) against ``model.prefill`` (cache
writes only; a prompt longer than one native call goes in native chunks). Then the batch
scheduler's prefill of the 16 bench prompts plus one step (``generate_batch(prompts, 1)``).
Medians of repeated calls.
"""

from __future__ import annotations

import argparse

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.engine import Engine
from timing import median_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine(str(default_target_path()), str(default_draft_path()), exact=True, dtype="auto")
    model = engine.model
    print(f"embedded target, {model.dtype}, native forward: {model.native is not None}, {args.threads} thread(s)")
    print("| prompt tokens | forward with logits (ms) | prefill (ms) | ratio |")
    print("|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for length in (16, 64, 128, 256):
            tokens = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
            cache = model.new_cache(512)
            with_logits = median_ms(lambda: model(tokens, 0, cache), calls=7, warmup=1)
            prefill = median_ms(lambda: model.prefill(tokens, 0, cache), calls=7, warmup=1)
            print(f"| {length} | {with_logits:.1f} | {prefill:.1f} | {with_logits / prefill:.2f}x |")
    bench = [p["prompt"] for p in load_prompts()]
    prompts = [bench[i % len(bench)] for i in range(16)]
    n_tokens = sum(len(engine.encode(p)) for p in prompts)
    batch_ms = median_ms(lambda: engine.generate_batch(prompts, 1, max_batch=16), calls=3, warmup=1)
    print(f"\nbatch scheduler, 16 bench prompts ({n_tokens} tokens): prefill + 1 step {batch_ms:.0f} ms")


if __name__ == "__main__":
    main()
