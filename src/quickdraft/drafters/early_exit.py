"""Self-speculation: the target's first L layers + its final norm and LM head draft.

Two forms. ``EarlyExitDrafter`` writes into the target's own KV cache for those layers (no second
cache); verification recomputes all layers for the drafted positions and overwrites those slots.
``QuantizedEarlyExitDrafter`` (where the target runs quickdraft's whole forwards and the kernels take
quantised weights) drafts through the draft-model path over the truncated target: a small KV cache of
its own, whole chains in one native call and quantised copies of those layers and the head, as a
self-draft does. Writing keys computed from quantised weights into the target's cache is what the first
form must never do: a slot the verification did not overwrite would change the target's output."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from quickdraft import kernels
from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.drafters.base import Draft, DraftContext, Drafter, draft_autoregressively
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.trees import TreeShape, grow_tree, model_expansion
from quickdraft.errors import QuickdraftError
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.loader import LoadedModel
from quickdraft.model.transformer import Transformer, shallow_copy
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


def truncated_target(target: Transformer, exit_layer: int) -> Transformer:
    """The target's embedding, first ``exit_layer`` layers, final norm and LM head as a Transformer of
    its own: shares every tensor (no copy of the weights), builds its own caches."""
    model = shallow_copy(target)
    model.config = replace(target.config, n_layer=exit_layer)
    model.layers = nn.ModuleList(list(target.layers[:exit_layer]))
    return model.eval()


class QuantizedEarlyExitDrafter(DraftModelDrafter):
    """Early exit as a draft model over ``truncated_target`` with quantised products (module docstring):
    the target's layers at 4 bits, its head at 8. On the embedded target at layer 2 a drafted token cost
    ~110 us in one call with 8-bit layers against ~220 us unquantised, and after a verify 149-243 us with
    4-bit layers against 190-291 at 8 (two runs of docs/bench/round38/draft_step_after_verify.py; tokens
    per target call unchanged); ``EarlyExitDrafter`` drafts token by token (c 0.42-0.53 in the bench)."""

    name = "early-exit"
    quantized_layer_bits = 4

    def __init__(self, target: LoadedModel, exit_layer: int) -> None:
        check_exit_layer(exit_layer, target.config.n_layer)
        self.exit_layer, self.n_layer = exit_layer, target.config.n_layer
        model = truncated_target(target.model, exit_layer)
        super().__init__(LoadedModel(model=model, config=model.config, tokenizer=target.tokenizer, path=target.path,
                                     name=f"early-exit:{exit_layer}", eos_token_ids=target.eos_token_ids),
                         quantized=True)

    @staticmethod
    def applies(target: LoadedModel, quantized_draft: bool = True) -> bool:
        """Quantised drafts are asked for (``quantized_draft``), the target runs whole native forwards (its
        packed weights) and the kernels take quantised weights: the form ``make_drafter`` builds and
        calibration keys by."""
        return quantized_draft and target.model.native is not None and kernels.int8_products()

    def check_compatible(self, target: LoadedModel) -> None:
        pass  # the target's own layers and head: its vocabulary

    @property
    def relative_cost_hint(self) -> float:
        return self.exit_layer / self.n_layer / 2
