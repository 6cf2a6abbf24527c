"""Self-speculation: the target's first L layers + its final norm and LM head draft, writing
into the target's own KV cache for those layers (no second cache). Verification recomputes all
layers for the drafted positions and overwrites those slots."""

from __future__ import annotations

import torch

from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.drafters.base import Draft, DraftContext, Drafter, draft_autoregressively
from quickdraft.drafters.trees import TreeShape, grow_tree, model_expansion
from quickdraft.errors import QuickdraftError
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.transformer import Transformer
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams
from quickdraft.tree import TokenTree


def check_exit_layer(exit_layer: int, n_layer: int) -> None:
    if not 1 <= exit_layer <= n_layer - 1:
        raise QuickdraftError(f"early-exit layer {exit_layer} is outside 1..{n_layer - 1} for a {n_layer}-layer target")


class EarlyExitDrafter(Drafter):
    name = "early-exit"

    def __init__(self, exit_layer: int, n_layer: int) -> None:
        check_exit_layer(exit_layer, n_layer)
        self.exit_layer, self.n_layer = exit_layer, n_layer
        self.target: Transformer | None = None
        self.cache: KVCache | None = None
        self.vocab_limit = 0
        self.adjuster: LogitAdjuster | None = None  # the request's penalties and logit bias, on the drafts too

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        self.target, self.cache, self.vocab_limit = context.target, context.target_cache, context.vocab_limit
        self.adjuster = context.adjuster

    def _forward(self, tokens: list[int], start: int) -> torch.Tensor:
        assert self.target is not None and self.cache is not None
        x = torch.tensor([tokens], device=self.target.device)
        return self.target(x, start, self.cache, exit_layer=self.exit_layer)[0, -1, : self.vocab_limit]

    @torch.inference_mode()
    def propose(
        self,
        tokens: list[int],
        k: int,
        sampling: SamplingParams,
        sampler: TokenSampler,
        confidence_stop: float | None = None,
    ) -> Draft:
        assert self.cache is not None
        # The target cache holds every committed token but the last; draft slots past it are scratch.
        position = self.cache.length
        logits = self._forward(tokens[position:], position)
        next_position = iter(range(len(tokens), len(tokens) + k))
        return draft_autoregressively(
            logits, lambda t: self._forward([t], next(next_position)), k, sampling, sampler, len(tokens),
            confidence_stop, self.adjuster.row if self.adjuster is not None else None,
        )

    @torch.inference_mode()
    def propose_tree(self, tokens: list[int], shape: TreeShape, sampling: SamplingParams,
                     sampler: TokenSampler) -> TokenTree:
        """Grown node j writes the exit layers' keys at target slot len(tokens) + j, scratch the
        verifying forward overwrites."""
        assert self.target is not None and self.cache is not None
        position = self.cache.length
        root_logits = self._forward(tokens[position:], position)
        base = len(tokens)  # slots [0, base) hold the committed tokens (the root last) for these layers
        expand = model_expansion(self.target, self.cache, base, self.vocab_limit, exit_layer=self.exit_layer)
        return grow_tree(root_logits, expand, shape, sampling, sampler, base)[0]

    @property
    def relative_cost_hint(self) -> float:
        return self.exit_layer / self.n_layer
