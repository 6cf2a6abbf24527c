"""A Llama-family model's whole forward over a step's rows as one C++ call (``kernels.forward``).

A compiled graph still returns to Python between its kernels, and an eager forward dispatches ~100
ops: on the embedded target that is ~0.3-0.5 ms of a ~1.3 ms step, and most of a draft model's step.
Here the layers run back to back in C++ on the packed weights (``Transformer.pack_products``), with
the same kernels as the per-op path, so a row's logits do not depend on the other rows of the call,
on the batch, on the attention window or on where a tree's ancestors sit in the cache. Nothing is
compiled: there is no graph to build before the first request.

Used by ``Transformer`` for cached forwards of up to NATIVE_MAX_ROWS rows (decode, verify, tree,
batched and early-exit steps) when the model is bf16 or fp32 on a CPU the kernels are built for (AVX512-BF16 or
AVX2) and its architecture
is covered: RMSNorm, RoPE, a gated SiLU MLP without biases, no sliding window. Other models keep the
per-op path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from quickdraft import kernels
from quickdraft.huge_pages import on_huge_pages
from quickdraft.model.kv_cache import KVCache

if TYPE_CHECKING:
    from quickdraft.model.transformer import Transformer

NATIVE_MAX_ROWS = 288  # a batched step of 16 sequences x 17 rows; longer prefills keep the per-op path


def packed(layer: torch.nn.Linear) -> torch.Tensor | None:
    """The layer's weight packed for the whole forward of its dtype, if ``pack_products`` packed it."""
    return layer._buffers.get("packed_bf16", layer._buffers.get("packed_f32"))


def packed_quantized(layer: torch.nn.Linear, bits: int) -> torch.Tensor | None:
    """The layer's weight quantised to ``bits`` (8: ``kernels.pack_int8``, 4: ``kernels.pack_int4``), or
    its ``packed`` copy when its input size is not a multiple of 4."""
    if layer.in_features % 4:
        return packed(layer)
    return (kernels.pack_int4 if bits == 4 else kernels.pack_int8)(layer.weight)


class NativeForward:
    def __init__(self, model: Transformer, layer_bits: int | None = None) -> None:
        """``layer_bits`` (8 or 4), for a draft: its decoder layers' weight products quantised to that
        many bits, its LM head's (and a feature draft's token projection's) to 8 (``kernels.int8_products()``):
        its step streams a half or a quarter of the bytes, and only its guesses change (the target
        verifies them). The head stays at 8 bits because it picks the drafted token: at 4 the self-draft's
        tokens per target call fell from 4.73 to 4.49, at 4-bit layers they stayed at 4.74."""
        if layer_bits not in (None, 4, 8):
            raise ValueError(f"quantised products have 4 or 8 bits, not {layer_bits}")
        self.model = model
        self.layer_bits = layer_bits

        quantized: list[torch.Tensor] = []  # made here, not the modules' packed buffers

        def product(layer: torch.nn.Linear, bits: int | None = layer_bits) -> torch.Tensor | None:
            if bits is None:
                return packed(layer)
            weight = packed_quantized(layer, bits)
            if weight is not packed(layer):  # its packed copy where the input size is not a multiple of 4
                quantized.append(weight)
            return weight

        head_bits = None if layer_bits is None else 8
        c = model.config
        empty = torch.empty(0)
        weights = [model.embed.weight.detach()]
        for block in model.layers:
            bias = block.attn.qkv.bias
            mlp = ([empty] * 3 if block.mlp is None  # an attention-only layer: the kernel skips its MLP
                   else [block.mlp_norm.weight.detach(), product(block.mlp.up), product(block.mlp.down)])
            weights += [block.attn_norm.weight.detach(), product(block.attn.qkv),
                        empty if bias is None else bias.detach().float().contiguous(), product(block.attn.out), *mlp]
        weights += [model.norm.weight.detach(), product(model.lm_head, head_bits)]
        token_proj = getattr(model, "fuse_token", None)  # a feature draft's W_token, not folded into its table
        if token_proj is not None:
            weights.append(product(token_proj, head_bits))
        moved = dict(zip(map(id, quantized), on_huge_pages(quantized), strict=True))
        self.weights = [moved.get(id(weight), weight) for weight in weights]
        self.shape = (c.n_head, c.n_kv_head, c.head_dim, c.intermediate_size, model.lm_head.out_features)
        self.eps = c.norm_eps
        self._head_limits: tuple[torch.Tensor | None, dict[int, int]] = (None, {})  # see _head_rows_below

    @staticmethod
    def covers(model: Transformer) -> bool:
        """The architecture is one the whole forward computes."""
        from quickdraft.model.transformer import RMSNorm

        c = model.config
        if len(model.layers) == 0:
            return False
        block = model.layers[0]
        return (not c.is_gpt2 and c.activation == "silu" and c.sliding_window is None and c.head_dim % 2 == 0
                and c.head_dim <= 256 and isinstance(model.norm, RMSNorm) and block.attn.out.bias is None
                and (block.mlp is None or (block.mlp.up.bias is None and block.mlp.down.bias is None)))

    @staticmethod
    def supports(model: Transformer) -> bool:
        """``covers`` the model, and ``pack_products`` packed every weight it reads."""
        block = model.layers[0] if len(model.layers) else None
        products = [] if block is None else [block.attn.qkv, block.attn.out]
        if block is not None and block.mlp is not None:
            products += [block.mlp.up, block.mlp.down]
        for fusion in ("fuse_feature", "fuse_token"):  # a feature draft's (model/feature_draft.py)
            if getattr(model, fusion, None) is not None:
                products.append(getattr(model, fusion))
        return (NativeForward.covers(model) and block is not None and packed(model.lm_head) is not None
                and all(packed(layer) is not None for layer in products))

    def _cache_inputs(self, cache: KVCache, batch: int, positions_end: int) -> tuple[torch.Tensor, ...]:
        """The RoPE tables, covering positions [0, positions_end), and the keys, values and key blocks
        (none where the cache keeps none) of the cache's first ``batch`` entries, as the kernels take them."""
        cos, signed_sin = self.model.rope_table(positions_end)
        # A batched step's cache is already a view of exactly its entries (KVCache.first)
        entries = cache if cache.batch == batch else cache.first(batch)
        return cos, signed_sin, entries.keys, entries.values, entries.key_blocks or []

    def _head_rows_below(self, vocab_limit: int) -> int:
        """How many of a subset head's rows (ascending ids) lie below ``vocab_limit``; the limit itself
        for a full head. Kept per limit: a search per draft call cost ~5 µs of a draft's Python."""
        head_ids = self.model.head_ids
        if head_ids is None:
            return vocab_limit
        if self._head_limits[0] is not head_ids:
            self._head_limits = (head_ids, {})
        rows = self._head_limits[1].get(vocab_limit)
        if rows is None:
            rows = self._head_limits[1][vocab_limit] = int(torch.searchsorted(head_ids, vocab_limit))
        return rows

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                 cache: KVCache, n_layers: int | None = None, logits_rows: int | None = None,
                 input_features: torch.Tensor | None = None, feature_proj: torch.Tensor | None = None,
                 positions_end: int | None = None) -> torch.Tensor:
        """tokens, positions (RoPE), slots (cache slot per row): [B, T] on the first B cache entries;
        mask [B or 1, T, W] bool over cache slots [0, W) -> logits [B, T, vocab], or of each
        sequence's last ``logits_rows`` rows (0: a prefill, cache writes only). A full forward writes
        the rows' last residual streams to ``cache.features`` when the cache keeps them;
        ``input_features`` [B * T, E] (projected by the packed ``feature_proj``) are added to the
        rows' embeddings (a feature draft). ``positions_end``: the largest position + 1, when the caller
        knows it (saves a reduction over ``positions``)."""
        full = n_layers is None or n_layers == self.model.config.n_layer
        if input_features is not None and feature_proj is None:
            feature_proj = packed(self.model.fuse_feature)
        logits = kernels.forward(
            tokens.contiguous(), positions.contiguous(), slots.contiguous(), mask.contiguous(),
            *self._cache_inputs(cache, tokens.shape[0], int(positions.max()) + 1 if positions_end is None else positions_end),
            self.weights,
            self.model.config.n_layer if n_layers is None else n_layers, *self.shape, self.eps,
            tokens.shape[1] if logits_rows is None else logits_rows, input_features, feature_proj,
            cache.features if full else None)
        return self.model.full_vocabulary(logits)

    def draft_greedy(self, tokens: list[int], k: int, vocab_limit: int, cache: KVCache,
                     gumbel: torch.Tensor | None = None, temperature: float = 1.0,
                     uniforms: torch.Tensor | None = None, logits_out: torch.Tensor | None = None,
                     input_features: torch.Tensor | None = None, hold_features: bool = False,
                     step_seconds: torch.Tensor | None = None) -> list[int]:
        """Feed ``tokens`` after the cache's ``length`` tokens, then draft k tokens greedily (each
        the first maximum of its logits below ``vocab_limit``), all in one C++ call: the same
        forwards as feeding them one by one, without Python between the steps. The cache's length
        is left to the caller: it then holds ``length + len(tokens) + k - 1`` tokens.

        A subset head's rows are searched up to the last id below ``vocab_limit`` (its ids ascend, so
        the first maximum is the one the full-vocabulary logits give). With ``gumbel`` [k, V] each
        step draws instead: the maximum of logit / temperature + gumbel[step, token]. With ``uniforms``
        [k] each step draws from softmax(logit / temperature + gumbel) at that point of its cumulative
        distribution (the rejection rule's draft). ``logits_out`` [k, head rows] float32 receives each
        step's head logits. A feature draft passes ``input_features`` [len(tokens), E] for the fed
        tokens; each drafted token is then fed with the feature its step wrote to ``cache.features``, or
        with ``hold_features`` the last of ``input_features`` again. ``step_seconds`` [k] float64
        receives each step's time (the first's feeds ``tokens`` too)."""
        head_ids = self.model.head_ids
        vocab_limit = self._head_rows_below(vocab_limit)
        start = cache.length
        if start + len(tokens) + k - 1 > cache.capacity:
            raise ValueError(f"drafting {k} tokens after {start + len(tokens)} exceeds the cache capacity {cache.capacity}")
        drafted = kernels.draft_greedy(
            torch.tensor([tokens], dtype=torch.long), start, k, vocab_limit,
            *self._cache_inputs(cache, 1, start + len(tokens) + k), self.weights, self.model.config.n_layer,
            *self.shape, self.eps, head_ids, gumbel, temperature, uniforms, logits_out, input_features,
            None if input_features is None else packed(self.model.fuse_feature),
            None if input_features is None else cache.features, hold_features, step_seconds)
        return drafted.tolist()

    def draft_batch(self, feeds: list[tuple[list[int], int] | None], ks: list[int], vocab_limit: int, cache: KVCache,
                    window: int, gumbel: list[torch.Tensor | None], temperatures: list[float],
                    n_layers: int | None = None, uniforms: list[torch.Tensor | None] | None = None,
                    logits_out: list[torch.Tensor | None] | None = None,
                    features: list[torch.Tensor | None] | None = None, hold_features: bool = False,
                    step_seconds: torch.Tensor | None = None) -> list[list[int]]:
        """``draft_greedy`` for the first B = len(feeds) entries of ``cache`` in one C++ call: entry b
        feeds ``feeds[b]`` = (tokens, position of the first), or nothing (None), then drafts ks[b]
        tokens, greedily or, with ``gumbel[b]`` [ks[b], V], raced at ``temperatures[b]``. Every
        step is one [B, rows] forward attending over cache slots [0, window); rows that pad a
        shorter feed, and sequences done drafting, write scratch slots at the end of their entry,
        past any sequence's data. ``n_layers``: the first layers only (early exit). ``uniforms[b]``
        [ks[b]] draws entry b's tokens instead (``draft_greedy``'s draw), ``logits_out[b]`` receives
        its steps' logits. A feature draft passes ``features[b]`` [len(feeds[b][0]), E] for entry b's fed
        tokens (``draft_greedy``'s ``input_features``; ``hold_features`` likewise). ``step_seconds``
        [max(ks)] float64 receives each batched step's time."""
        head_ids = self.model.head_ids
        vocab_limit = self._head_rows_below(vocab_limit)
        width = max(len(feed[0]) for feed in feeds if feed is not None)
        scratch = cache.capacity - width
        token_rows, position_rows = [], []
        for feed, k in zip(feeds, ks):
            tokens, start = feed if feed is not None else ([], scratch)
            if k > 0 and not tokens:
                raise ValueError("a sequence that drafts feeds at least its last token")
            if tokens and start + len(tokens) + k - 1 > scratch:
                raise ValueError(f"drafting {k} tokens after {start + len(tokens)} reaches the scratch slots "
                                 f"at {scratch} of a cache of {cache.capacity}")
            pad = width - len(tokens)
            token_rows.append([0] * pad + tokens)
            position_rows.append(list(range(scratch, scratch + pad)) + list(range(start, start + len(tokens))))
        input_features = None
        if features is not None:
            input_features = self.model.embed.weight.new_zeros(len(feeds), width, self.model.config.n_embd)
            for b, rows in enumerate(features):
                if rows is not None:
                    input_features[b, width - len(rows):] = rows
        entries = cache if cache.batch == len(feeds) else cache.first(len(feeds))
        drafted = kernels.draft_batch(
            torch.tensor(token_rows), torch.tensor(position_rows), ks, window, vocab_limit,
            *self._cache_inputs(cache, len(feeds), cache.capacity), self.weights,
            self.model.config.n_layer if n_layers is None else n_layers, *self.shape, self.eps, head_ids, gumbel,
            temperatures, uniforms, logits_out,
            None if input_features is None else input_features.view(-1, input_features.shape[-1]),
            None if features is None else packed(self.model.fuse_feature),
            None if features is None else entries.features, hold_features, step_seconds)
        return [row[:k] for row, k in zip(drafted.tolist(), ks)]
