"""The coupled rule's sampling kernels on one thread: Exp(1) noise for 16 rows of the embedded
vocabulary, and the top-p race over the embedded target's own rows (its last 64 positions on each
bench prompt) at T = 0.8 / top-p 0.95, T = 1 / top-p 0.9 and T = 0.8 without top-p; each race checked
against its torch definition. Compare builds by running it under each checkout, alternating:

    .venv/bin/python docs/bench/round36/sampling_kernels.py
    PYTHONPATH=/tmp/old/src .venv/bin/python docs/bench/round36/sampling_kernels.py   # a worktree
"""

from __future__ import annotations

import statistics
import time

import torch

import quickdraft
from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams, nucleus_kept, tempered_probabilities


def per_call(f, calls: int, rounds: int = 7) -> float:
    for _ in range(max(1, calls // 10)):
        f()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    assert kernels.available(), "quickdraft's CPU kernels do not build here"
    print(f"quickdraft from {quickdraft.__file__}, kernels {kernels.loaded_isa()}")
    keys = torch.randint(0, 2**62, (16,), generator=torch.Generator().manual_seed(0))
    print(f"exponential_noise, 16 rows x 8,192: {per_call(lambda: kernels.exponential_noise(keys, 8192), 100) * 1e6:.0f} us")
    model = load_model(default_target_path(), dtype="bf16")
    prompts = [p["prompt"] for p in load_prompts()]
    with torch.inference_mode():
        logits = torch.cat([model.model(torch.tensor([model.tokenizer.encode(p)]))[0, -64:].float() for p in prompts])
    noise = kernels.exponential_noise(torch.randint(0, 2**62, (logits.shape[0],), generator=torch.Generator().manual_seed(1)),
                                      logits.shape[1])
    for temperature, top_p in ((0.8, 0.95), (1.0, 0.9), (0.8, 1.0)):
        probs = tempered_probabilities(logits, SamplingParams(temperature=temperature, top_p=top_p))
        tokens = kernels.nucleus_race(probs, noise, top_p, 1e-5)
        kept = probs if top_p >= 1.0 else nucleus_kept(probs, top_p)
        assert torch.equal(tokens, (kept / noise).argmax(-1))
        seconds = per_call(lambda: kernels.nucleus_race(probs, noise, top_p, 1e-5), 3)
        print(f"nucleus_race, {logits.shape[0]} rows, T = {temperature}, top-p {top_p}: "
              f"{seconds / logits.shape[0] * 1e6:.2f} us a row")


if __name__ == "__main__":
    main()
