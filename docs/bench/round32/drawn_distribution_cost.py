"""The rejection rule's q after a native draft of 4 tokens with the embedded draft's cut head (2,048 of 8,192
tokens): the softmax over the whole -inf-padded row (round 31) against over the head's rows, scattered
(round 32). Run: python docs/bench/round32/drawn_distribution_cost.py"""
import time

import torch

from quickdraft.assets import default_draft_path
from quickdraft.drafters.draft_model import drawn_distribution
from quickdraft.model.draft_head import load_draft_head, with_subset_head
from quickdraft.model.loader import load_model

torch.set_num_threads(1)
draft = load_model(default_draft_path(), dtype="bf16").model
model = with_subset_head(draft, load_draft_head(default_draft_path(), draft.config.vocab_size))
logits = torch.randn(4, 2048, generator=torch.Generator().manual_seed(0)) * 3


def whole_row(head_logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(model.full_vocabulary(head_logits) * (1.0 / 0.8), dim=-1)


for name, fn in (("whole row", whole_row), ("head rows, scattered", lambda x: drawn_distribution(model, x, 8192, 0.8, None))):
    for _ in range(200):
        fn(logits)
    start = time.perf_counter()
    for _ in range(5000):
        fn(logits)
    print(f"{name}: {(time.perf_counter() - start) / 5000 * 1e6:.1f} µs")
print("largest difference:", float((whole_row(logits) - drawn_distribution(model, logits, 8192, 0.8, None)).abs().max()))
