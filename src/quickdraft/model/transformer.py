"""The decoder: Llama family (Llama 2/3, Mistral, Qwen2) and GPT-2 in one small module.

``forward(tokens, positions, cache)`` takes any number of new tokens, writes their keys and values
into the cache at their positions, and returns logits. ``exit_layer=L`` runs layers < L only, then
the final norm and LM head (self-speculation).
"""

from __future__ import annotations

import copy

import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft import kernels
from quickdraft.errors import QuickdraftError
from quickdraft.huge_pages import on_huge_pages
from quickdraft.model.config import ModelConfig
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.native import NATIVE_MAX_ROWS, NativeForward, packed as packed_weight

log = logging.getLogger(__name__)


# prepare_static keeps a transposed copy of an LM head up to this size (a small model's LM head is
# most of its weights and streams faster that way); beyond it the copy would cost real memory.
LM_HEAD_COPY_LIMIT_BYTES = 64 * 2**20
# Products of up to this many rows run quickdraft's packed bf16 kernel (every decode, verify, tree
# and batched step: 16 slots x 17 rows fit; as fast as torch's GEMM up to 256 rows here); longer
# prefills keep torch's GEMM.
PACKED_MAX_ROWS = 288
# Eager cached forwards of up to this many rows (decode steps, exact mode's padded steps) run the
# whole forward in C++ (native) or attend with kernels.attend_bf16 when those are on; longer ones
# (prefill) keep SDPA's flash kernel.
KERNEL_ATTENTION_ROWS = 64
# A lone chain of up to this many rows (a decode step, a verify) takes its positions and causal mask
# as views of cached tables (``_chain_inputs``). Building them per call took ~8 tensor ops, ~30 µs of
# a ~0.8 ms plain step: after a forward, the interpreter's data is out of the caches. The views made
# plain decoding 6% faster (docs/bench/round39/chain_tables_ab.txt).
CHAIN_TABLE_ROWS = 16


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)``, through ``kernels.linear_bf16`` when the layer carries a packed weight
    (``Transformer.pack_products``) and x has at most PACKED_MAX_ROWS rows."""
    packed = getattr(layer, "packed_bf16", None)
    if packed is None or x.dtype != torch.bfloat16 or x.numel() > PACKED_MAX_ROWS * x.shape[-1]:
        return layer(x)
    return kernels.linear_bf16(x, packed, layer.bias, layer.out_features)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.shape = (dim,)
        self.weight = nn.Parameter(torch.ones(dim))
        self.kernel = False  # kernels.rms_norm_bf16 (pack_products)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel and x.dtype == torch.bfloat16:
            return kernels.rms_norm_bf16(x, self.weight, self.eps)
        # Normalise in fp32 like the reference implementations, then cast back (no-ops in fp32).
        return self.weight * F.rms_norm(x.float(), self.shape, eps=self.eps).to(x.dtype)


def _make_norm(config: ModelConfig) -> nn.Module:
    if config.is_gpt2:
        return nn.LayerNorm(config.n_embd, eps=config.norm_eps)
    return RMSNorm(config.n_embd, config.norm_eps)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """On the CPU whatever device a model is built under (``.to()`` moves the buffer): computed
    on the meta device, as the loader builds models, it would run torch's reference operators,
    whose first call imports torch._dynamo (~0.8 s of start-up)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float()
    # llama3: long wavelengths are slowed by `factor`, short ones kept, a smooth ramp between.
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    is_medium = (wavelen <= original / low) & (wavelen >= original / high)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(is_medium, blended, scaled).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, T, head_dim]; cos, signed_sin: [T, head_dim] in the rotate-half layout of
    HF weights, with the sign of rotate-half folded into ``signed_sin`` (one op fewer per call)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.qkv = nn.Linear(config.n_embd, q_dim + 2 * kv_dim, bias=config.qkv_bias or config.is_gpt2)
        self.out = nn.Linear(q_dim, config.n_embd, bias=config.is_gpt2)
        self.split = (q_dim, kv_dim, kv_dim)
        self.use_rope = not config.is_gpt2
        self.kernel = False  # kernels.attend_bf16 for cached steps of <= KERNEL_ATTENTION_ROWS rows (pack_products)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        keys: torch.Tensor | None,
        values: torch.Tensor | None,
        slots: slice | torch.Tensor,
        kv_len: int,
        mask: torch.Tensor | None,
        attend: Attend | None = None,
    ) -> torch.Tensor:
        batch, t, _ = x.shape
        # [batch, heads_q + 2 * heads_kv, T, head_dim]; queries and keys get RoPE in one go
        heads = linear(self.qkv, x).view(batch, t, -1, self.head_dim).transpose(1, 2)
        qk, v = heads.split((self.n_head + self.n_kv_head, self.n_kv_head), dim=1)
        if rope is not None:
            qk = apply_rope(qk, *rope)
        q, k = qk.split((self.n_head, self.n_kv_head), dim=1)
        gqa = self.n_kv_head != self.n_head
        if keys is None or values is None:  # training: no cache, plain causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif isinstance(slots, torch.Tensor) and slots.dim() == 2:  # batched step: [batch, T] positions
            rows = torch.arange(batch, device=slots.device)[:, None]
            keys.transpose(1, 2)[rows, slots] = k.transpose(1, 2)
            values.transpose(1, 2)[rows, slots] = v.transpose(1, 2)
            assert mask is not None
            window = mask.shape[-1]  # the step attends over cache slots [0, window)
            if self.kernel:
                y = kernels.attend_bf16(q, keys[:, :, :window], values[:, :, :window], mask[:, 0])
            else:
                y = _attend_window(q, keys[:, :, :window], values[:, :, :window], mask)
        elif isinstance(slots, torch.Tensor):  # slots are data, not Python ints: static-shape and tree steps
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v)
            assert mask is not None
            if self.kernel:  # slot-order invariant too: it serves every ``attend`` choice
                y = kernels.attend_bf16(q, keys[:, :, :kv_len], values[:, :, :kv_len], mask[None])
            else:
                y = (attend or _attend_fused)(q, keys[:, :, :kv_len], values[:, :, :kv_len], mask)
        else:
            keys[:, :, slots] = k
            values[:, :, slots] = v
            if self.kernel and t <= KERNEL_ATTENTION_ROWS:
                if mask is None:  # causal: row i sees the slots up to its own
                    mask = torch.ones(t, kv_len, dtype=torch.bool, device=x.device).tril(kv_len - t)
                y = kernels.attend_bf16(q, keys[:, :, :kv_len], values[:, :, :kv_len], mask[None])
            else:
                y = F.scaled_dot_product_attention(
                    q, keys[:, :, :kv_len], values[:, :, :kv_len], attn_mask=mask, is_causal=mask is None and t > 1,
                    enable_gqa=gqa,
                )
        return linear(self.out, y.transpose(1, 2).reshape(batch, t, -1))


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attend_sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [1, Hq, T, D] over keys, values [1, Hkv, C, D] under mask [T, C] (eager tree steps)."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=keys.shape[1] != q.shape[1])


def attend_ordered(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact mode's attention: q [1, Hq, T, D] over keys, values [1, Hkv, C, D] under mask [T, C],
    where a row's bits depend on the visible keys and values *in slot order*, not on which slots
    hold them. A tree node's ancestors sit at scattered slots, the same tokens decoded plainly at
    consecutive ones; both must give the same bits. A vectorised sum (SDPA's, softmax's) adds a key's
    term in the lane its slot falls in, so the scatter changes the rounding (fp32 here: 44 of 50
    probes differ); the softmax denominator is therefore a cumulative sum, a sequential scan in
    which masked slots add exact zeros. The products over the head dimension and the weighted sum of
    values accumulate per output in slot order, where zero weights change nothing (probed by
    ``exact.tree_rows_match_chain``)."""
    batch, n_head, t, d = q.shape
    n_kv = keys.shape[1]
    group = n_head // n_kv
    scores = (q.reshape(batch, n_kv, group * t, d) @ keys.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(~mask.repeat(group, 1), float("-inf"))  # row g*T + i is row i of head group g
    weights = (scores - scores.amax(-1, keepdim=True)).exp_()
    weights /= weights.cumsum(-1)[..., -1:]
    return (weights.to(values.dtype) @ values).view(batch, n_head, t, d)


def attend_matmul(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``_attend_window`` with one mask [T, C] for the batch of 1: compiled tree steps, whose 5-33
    rows make the broadcast sums of ``_attend_fused`` cost more than two matrix products."""
    return _attend_window(q, keys, values, mask[None, None])


def _attend_window(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention of a few query rows over a whole cache window, as two batched matmuls.

    q [B, Hq, T, D]; keys, values [B, Hkv, C, D]; mask [B, 1, T, C] -> [B, Hq, T, D]. The query
    heads that share a key/value head are stacked as rows of one matmul (no repeated keys). For
    T of 1-17 rows this is several times faster on CPU than SDPA's flash kernel, which is built
    for long queries (embedded target, 16 x 1 rows over 1,088 slots: 11.5 ms per layer in bf16).
    """
    batch, n_head, t, d = q.shape
    n_kv = keys.shape[1]
    group = n_head // n_kv
    scores = (q.reshape(batch, n_kv, group * t, d) @ keys.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))
    visible = mask.unsqueeze(2).expand(batch, 1, group, t, mask.shape[-1]).reshape(batch, 1, group * t, -1)
    weights = scores.masked_fill_(~visible, float("-inf")).softmax(-1).to(values.dtype)
    return (weights @ values).view(batch, n_head, t, d)


def _attend_fused(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The compiled step's attention: q [1, Hq, T, D] over the whole cache (keys, values [1, Hkv, C, D])
    under mask [T, C] -> [1, Hq, T, D]. Written as broadcast products and sums, which inductor fuses
    into reductions that read the cache in place; as matmuls it lowers them to its GEMM template,
    which repacks the whole cache every call (embedded target, 512 slots: ~100 us a layer), and an
    opaque custom op costs more in dispatch than the attention itself. Traced only: run eagerly it
    would materialise [Hkv, G*T, C, D]."""
    batch, n_head, t, d = q.shape
    n_kv = keys.shape[1]
    group = n_head // n_kv
    q = q.reshape(batch, n_kv, group * t, 1, d)
    scores = (q * keys[:, :, None]).sum(-1, dtype=torch.float32) * (1.0 / math.sqrt(d))  # [B, Hkv, G*T, C]
    visible = mask.repeat(group, 1)  # [G*T, C]: query row g*T + i is row i of head group g
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    y = (weights[..., None] * values[:, :, None].float()).sum(-2)  # [B, Hkv, G*T, D]
    return y.to(q.dtype).view(batch, n_head, t, d)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gated = not config.is_gpt2
        hidden = config.intermediate_size
        # The gated MLP keeps gate and up in one matrix: one matmul instead of two.
        self.up = nn.Linear(config.n_embd, 2 * hidden if self.gated else hidden, bias=config.is_gpt2)
        self.down = nn.Linear(hidden, config.n_embd, bias=config.is_gpt2)
        self.gelu_approximate = "tanh" if config.activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = linear(self.up, x).chunk(2, dim=-1)
            return linear(self.down, F.silu(gate) * up)
        return linear(self.down, F.gelu(linear(self.up, x), approximate=self.gelu_approximate))


class Block(nn.Module):
    """A decoder layer; ``mlp=False`` leaves out its MLP (a self-draft's attention-only exit adapter,
    as Kangaroo's)."""

    def __init__(self, config: ModelConfig, *, mlp: bool = True) -> None:
        super().__init__()
        self.attn_norm = _make_norm(config)
        self.attn = Attention(config)
        self.mlp_norm = _make_norm(config) if mlp else None
        self.mlp = MLP(config) if mlp else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, keys: torch.Tensor | None,
                values: torch.Tensor | None, slots: slice | torch.Tensor, kv_len: int, mask: torch.Tensor | None,
                attend: Attend | None = None) -> torch.Tensor:
        """The residual stream after this layer: attention (``Attention.forward``'s arguments), then
        the MLP when the layer has one."""
        x = x + self.attn(self.attn_norm(x), rope, keys, values, slots, kv_len, mask, attend)
        if self.mlp is None or self.mlp_norm is None:
            return x
        return x + self.mlp(self.mlp_norm(x))


def _room_for_packed_copy(model: nn.Module, bytes_per_weight: int | None = None) -> bool:
    """The packed weights are a second copy (the originals still serve long prefills): pack only
    when it takes at most half of the memory available now, so that a large checkpoint on a small
    machine keeps torch's kernels instead of running out of memory. ``bytes_per_weight``: the copy's
    (1 for int8), else the weights' own."""
    from quickdraft.resources import available_memory_bytes

    copy = sum(m.weight.numel() * (bytes_per_weight or m.weight.element_size())
               for m in model.modules() if isinstance(m, nn.Linear))
    available = available_memory_bytes()
    if available is not None and copy > available // 2:
        log.warning("not packing %.1f GB of weights for quickdraft's CPU kernels with %.1f GB available; "
                    "running %s", copy / 2**30, available / 2**30,
                    "torch's kernels" if bytes_per_weight is None else "the unquantised products")
        return False
    return True


def keep_features(features: torch.Tensor, slots: slice | torch.Tensor, hidden: torch.Tensor) -> None:
    """Write rows' last residual streams ``hidden`` [B, T, E] to their ``slots`` of ``features``
    [B, capacity, E] (``KVCache.features``): a slice, one slot per row [T], or per sequence [B, T]."""
    hidden = hidden.to(features.dtype)
    if isinstance(slots, slice):
        features[: hidden.shape[0], slots] = hidden
    elif slots.dim() == 1:
        features[: hidden.shape[0]].index_copy_(1, slots, hidden)
    else:
        rows = torch.arange(hidden.shape[0], device=slots.device)[:, None]
        features[rows, slots] = hidden


def shallow_copy(model: Transformer) -> Transformer:
    """A Transformer sharing every module, parameter and buffer of ``model``, with registries of its
    own, so that the copy's modules can be replaced without touching ``model``; the caches built from
    its weights (native forwards, the transposed head) start empty. No new Transformer is built: even
    on the meta device, building one imports torch's compiler (~0.8 s of a `quickdraft generate`)."""
    copied = copy.copy(model)
    copied._modules = dict(model._modules)  # type: ignore[assignment]
    copied._parameters = dict(model._parameters)  # type: ignore[assignment]
    copied._buffers = dict(model._buffers)  # type: ignore[assignment]
    copied.native, copied._lm_head_t = None, None
    return copied


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_embed = nn.Embedding(config.block_size, config.n_embd) if config.is_gpt2 else None
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = _make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        self._chain_tables: tuple[torch.Tensor, torch.Tensor] | None = None  # see _chain_inputs
        # Every cached forward must run through ``native`` (a target quantised by
        # ``quantize_target_products``): the per-op path would compute other bits than its forwards.
        self.native_only = False
        self._lm_head_t: torch.Tensor | None = None  # [n_embd, vocab], built by prepare_static
        self.native: NativeForward | None = None  # whole forwards in one C++ call (pack_products)
        # [lm_head rows] ascending token ids when the head covers a subset of the vocabulary (a
        # self-draft's frequency-ranked head, model/self_draft.py); None: one row per token
        self.head_ids: torch.Tensor | None = None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm and LM head over the residual stream -> logits [..., vocab]."""
        return self.full_vocabulary(linear(self.lm_head, self.norm(hidden)))

    def full_vocabulary(self, head_logits: torch.Tensor) -> torch.Tensor:
        """The LM head's logits over the whole vocabulary: a subset head's rows scattered to their
        token ids, -inf (probability 0, never the maximum) for every other token."""
        if self.head_ids is None:
            return head_logits
        full = head_logits.new_full((*head_logits.shape[:-1], self.embed.num_embeddings), float("-inf"))
        return full.index_copy_(-1, self.head_ids, head_logits)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self, capacity: int, batch: int = 1) -> KVCache:
        """A cache for ``batch`` sequences of ``capacity`` positions; with key blocks where the native
        forward runs (``KVCache``: its attention then reads them instead of transposing the keys)."""
        c = self.config
        lanes = kernels.key_block_lanes() if self.native is not None else None
        return KVCache(c.n_layer, c.n_kv_head, c.head_dim, capacity, batch=batch, dtype=self.dtype, device=self.device,
                       key_block_lanes=lanes)

    def _rope(self, positions: torch.Tensor, length_needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.rope_table(length_needed)
        return table[0][positions], table[1][positions]

    def rope_table(self, length_needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [positions, head_dim] covering positions [0, length_needed), built or grown on demand."""
        table = self._rope_table
        if table is None or table[0].shape[0] < length_needed:
            size = max(length_needed, 256)
            t = torch.arange(size, dtype=torch.float32, device=self.device)
            freqs = torch.outer(t, self.inv_freq.to(self.device))
            emb = torch.cat((freqs, freqs), dim=-1)
            signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
            table = (emb.cos().to(self.dtype), signed_sin.to(self.dtype))
            self._rope_table = table
        return table

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | int = 0,
        cache: KVCache | None = None,
        *,
        exit_layer: int | None = None,
        full_window: bool = False,
    ) -> torch.Tensor:
        """tokens: [batch, T] at consecutive positions from ``positions`` -> logits [batch, T, vocab].

        Without a cache (training), attention is plain causal over ``tokens``. ``full_window``
        attends over every slot of the cache (masked), so that every call has the same shapes
        whatever the position: exact mode needs that for bit-identical rows.
        """
        t = tokens.shape[1]
        if self.native is not None and cache is not None and t <= KERNEL_ATTENTION_ROWS:
            start = self._chain_start(positions, t, cache)
            return self._native_chain(tokens, start, cache, cache.capacity if full_window else start + t, exit_layer)
        return self.logits(self.hidden_states(tokens, positions, cache, exit_layer=exit_layer, full_window=full_window))

    def prefill(self, tokens: torch.Tensor, positions: torch.Tensor | int, cache: KVCache) -> None:
        """``forward``'s cache writes without its logits: a prompt's rows are fed for their keys and
        values only, and the LM head is the largest product of a small model (the embedded target's
        8,192 x 384).

        With the native forward a long prompt goes in chunks of KERNEL_ATTENTION_ROWS rows: its rows
        are invariant by construction, so the chunks leave the bits one call would, and the
        per-op path (torch's bf16 products, slow on CPUs without bf16 arithmetic) is never taken."""
        t = tokens.shape[1]
        if self.native is None:
            self.hidden_states(tokens.to(self.device), positions, cache)
            return
        start = self._chain_start(positions, t, cache)
        for first in range(start, start + t, KERNEL_ATTENTION_ROWS):
            chunk = tokens[:, first - start: first - start + KERNEL_ATTENTION_ROWS]
            self._native_chain(chunk, first, cache, first + chunk.shape[1], logits_rows=0)

    @staticmethod
    def _chain_start(positions: torch.Tensor | int, t: int, cache: KVCache) -> int:
        """The position of the first of ``t`` consecutive rows, checked to fit the cache."""
        start = int(positions) if isinstance(positions, int) else int(positions[0])
        if start + t > cache.capacity:
            raise ValueError(f"positions up to {start + t} exceed the KV cache capacity {cache.capacity}")
        return start

    def _native_chain(self, tokens: torch.Tensor, start: int, cache: KVCache, window: int,
                      exit_layer: int | None = None, logits_rows: int | None = None) -> torch.Tensor:
        """tokens [B, T] at positions start.. through the native forward, each row attending causally
        over cache slots [0, window)."""
        t, batch = tokens.shape[1], tokens.shape[0]
        if batch == 1 and t <= CHAIN_TABLE_ROWS:
            positions, mask = self._chain_inputs(start, t, window)
            return self.native(tokens, positions, positions, mask, cache, exit_layer, logits_rows=logits_rows,
                               positions_end=start + t)
        pos = torch.arange(start, start + t, device=tokens.device)
        mask = self._attention_mask(pos, window, False)
        return self.native(tokens, pos.expand(batch, t), pos.expand(batch, t), mask[None], cache, exit_layer,
                           logits_rows=logits_rows)

    def _batched_mask(self, positions: torch.Tensor, window: int) -> torch.Tensor:
        """[B, T, window]: row (b, t) sees cache slots [0, positions[b, t]] (and, with a sliding window,
        none it has left). Without a sliding window one comparison against the chain tables' cached slot
        ids: a batched step's mask built from a fresh range and reshapes cost ~25 µs of a lone
        sequence's ~0.9 ms step."""
        if self.config.sliding_window is not None:
            return self._attention_mask(positions.reshape(-1), window, True).view(*positions.shape, window)
        ids, _ = self._chain_tables_for(window)
        return ids[0, :window] <= positions[..., None]

    def _refuse_per_op(self, rows: int) -> None:
        if self.native_only:
            raise QuickdraftError(f"a forward of {rows} rows would leave the int8 target's whole forwards (at most "
                                  f"{KERNEL_ATTENTION_ROWS} rows a chain, {NATIVE_MAX_ROWS} a tree)")

    def _chain_inputs(self, start: int, t: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [1, t] from ``start`` and their causal mask [1, t, window] (row i sees slots
        [0, start + i]), as views of two tables grown on demand: ids [1, 2S] (0, 1, ...) and a band
        [1, CHAIN_TABLE_ROWS, 2S] whose row i marks columns c <= S + i, so that columns from S - start
        on are row i's slots. S >= window > start keeps every view inside the tables."""
        ids, band = self._chain_tables_for(window)
        offset = band.shape[2] // 2 - start
        return ids[:, start: start + t], band[:, :t, offset: offset + window]

    def _chain_tables_for(self, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain tables (``_chain_inputs``), grown to S >= window when they are smaller."""
        tables = self._chain_tables
        if tables is None or tables[1].shape[2] < 2 * window:
            size = max(256, 1 << (window - 1).bit_length())
            ids = torch.arange(2 * size, device=self.device)[None]
            rows = torch.arange(CHAIN_TABLE_ROWS, device=self.device)[:, None]
            tables = self._chain_tables = (ids, (ids - size <= rows)[None])
        return tables

    def hidden_states(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | int = 0,
        cache: KVCache | None = None,
        *,
        exit_layer: int | None = None,
        full_window: bool = False,
        collect: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The residual stream after ``exit_layer`` layers (all by default), before the final norm.

        ``collect``, when given, receives the residual stream after every layer (early-exit training).
        """
        t = tokens.shape[1]
        if cache is not None:
            self._refuse_per_op(t)
        start = int(positions) if isinstance(positions, int) else int(positions[0])
        end = start + t
        pos = torch.arange(start, end, device=tokens.device)
        mask = None
        kv_len = end
        n_layers = self.config.n_layer if exit_layer is None else exit_layer
        if cache is not None:
            if end > cache.capacity:
                raise ValueError(f"positions up to {end} exceed the KV cache capacity {cache.capacity}")
            kv_len = cache.capacity if full_window else end
            window = self.config.sliding_window
            windowed = window is not None and end > window
            # No mask needed (SDPA's cheaper paths) when every cached key is visible to the single
            # query, or when a prefill from position 0 is plainly causal.
            if n_layers and (full_window or windowed or (t > 1 and start > 0)):
                mask = self._attention_mask(pos, kv_len, windowed)
        elif self.config.sliding_window is not None and end > self.config.sliding_window:
            raise ValueError("training without a cache does not apply the sliding window; use shorter sequences")

        x = self.embed(tokens)
        rope = None
        if self.pos_embed is not None:
            x = x + self.pos_embed(pos)
        elif n_layers:  # no attention, no rotary table (the statistical tests' embedding-only models)
            rope = self._rope(pos, end)
        return self._run_layers(x, rope, cache, slice(start, end), kv_len, mask, n_layers, collect)

    def continue_layers(self, hidden: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        """The residual stream after ``blocks`` (decoder blocks of this model's shape) run on
        ``hidden`` [batch, T, n_embd] at positions 0..T-1, causal, without a cache (training a
        module that continues this model's first layers)."""
        t = hidden.shape[1]
        rope = None if self.pos_embed is not None else self._rope(torch.arange(t, device=hidden.device), t)
        for block in blocks:
            hidden = block(hidden, rope, None, None, slice(0, t), t, None)
        return hidden

    def _attention_mask(self, positions: torch.Tensor, kv_len: int, windowed: bool) -> torch.Tensor:
        """[T, kv_len]: True where the query at each of ``positions`` may attend to a cache slot
        (causal, and inside the sliding window when ``windowed``)."""
        slots = torch.arange(kv_len, device=positions.device)
        mask = slots[None, :] <= positions[:, None]
        if windowed:
            mask &= slots[None, :] > positions[:, None] - self.config.sliding_window
        return mask

    def _run_layers(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None,
        slots: slice | torch.Tensor,
        kv_len: int,
        mask: torch.Tensor | None,
        n_layers: int,
        collect: list[torch.Tensor] | None = None,
        attend: Attend | None = None,
    ) -> torch.Tensor:
        keys = values = None
        for i in range(n_layers):
            block = self.layers[i]
            if cache is not None:
                keys, values = cache.keys[i], cache.values[i]
            x = block(x, rope, keys, values, slots, kv_len, mask, attend)
            if collect is not None:
                collect.append(x)
        if cache is not None and cache.key_blocks is not None:  # the native forward's attention reads them
            if isinstance(slots, slice):
                cache.refresh_key_blocks(slots.start or 0, slots.stop)
            else:
                cache.refresh_key_blocks_at(slots)
        if cache is not None and cache.features is not None and n_layers == self.config.n_layer:
            keep_features(cache.features, slots, x)
        return x

    def pack_products(self) -> bool:
        """Give every weight product a copy of its weight packed for quickdraft's CPU kernels (True when
        done): bf16 weights for the per-op kernels and the whole forward (``self.native``), fp32
        weights for the whole forward only, of the models it covers. Inference only: later weight
        updates are not seen.
        Each row's result then has the same bits whatever the other rows, and extra rows cost
        little (embedded target, Zen 4, 1 thread: all products 0.74 ms for 1 row, 0.93 ms for 5;
        torch's 1.6 and 1.9 ms with oneDNN's packed weights, 3.5 and 4.0 ms unpacked)."""
        if self.dtype not in (torch.bfloat16, torch.float32) or self.device.type != "cpu" or not kernels.available():
            return False
        bf16 = self.dtype == torch.bfloat16
        # fp32 weights serve whole forwards only: no copy for a model they do not cover
        if not bf16 and not NativeForward.covers(self):
            return False
        if packed_weight(self.lm_head) is None and not _room_for_packed_copy(self):
            return False
        name, pack = ("packed_bf16", kernels.pack_bf16) if bf16 else ("packed_f32", kernels.pack_f32)
        packed_now: list[nn.Module] = []
        for module in self.modules():
            if (isinstance(module, nn.Linear) and name not in module._buffers
                    and (not bf16 or module.in_features % 2 == 0)):
                module.register_buffer(name, pack(module.weight), persistent=False)
                packed_now.append(module)
            if bf16 and isinstance(module, (Attention, RMSNorm)):
                module.kernel = True  # the per-op kernels, for forwards the whole forward does not take
        for module, weight in zip(packed_now, on_huge_pages([m._buffers[name] for m in packed_now]), strict=True):
            module._buffers[name] = weight
        if self.native is None and NativeForward.supports(self):
            self.native = NativeForward(self)
        return True

    def quantize_native_products(self, layer_bits: int = 8) -> bool:
        """Give the whole forward quantised weight products, its decoder layers' at ``layer_bits`` (8 or 4)
        and its head's at 8 (True when done; a draft's: ``NativeForward``'s ``layer_bits``), where
        ``pack_products`` gave it a whole forward and the kernels take them. The per-op path (longer
        prefills) keeps the packed weights."""
        if self.native is None or not kernels.int8_products():
            return False
        if self.native.layer_bits != layer_bits:
            if not _room_for_packed_copy(self, bytes_per_weight=1):
                return False
            self.native = NativeForward(self, layer_bits=layer_bits)
        return True

    def quantize_target_products(self) -> bool:
        """Make this model an int8 target (True when done): every weight product of its whole forward
        int8 (``quantize_native_products(8)``), and every cached forward through it (``native_only``).
        Plain and speculative decoding then both run this quantised model, so speculation stays exact
        relative to it; the output is no longer the bf16 weights' (embedded target: held-out perplexity
        61.83 -> 61.87, plain decoding 2.3-2.8x faster; BENCHMARKS.md round 39)."""
        if not self.quantize_native_products(8):
            return False
        self.native_only = True
        return True

    @property
    def products_packed(self) -> bool:
        return "packed_bf16" in self.lm_head._buffers

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the last hidden states in a static step: the packed product, else the
        transposed copy of ``prepare_static`` when there is one."""
        if self._lm_head_t is None or self.products_packed:
            return self.logits(x)
        return self.full_vocabulary(self.norm(x) @ self._lm_head_t)

    def prepare_static(self, capacity: int) -> None:
        """Build what ``forward_static`` reads before it is traced: the RoPE table for ``capacity``
        positions, and a transposed copy of the LM head (inference only: later weight updates are
        not seen). For a small draft the LM head is most of the weights and is read cold after
        every target forward; ``x @ Wᵀ`` with Wᵀ contiguous streams it faster than ``linear``
        (embedded draft, cold cache: 0.18 vs 0.29 ms)."""
        if self.pos_embed is None:
            self.rope_table(capacity)
        weight = self.lm_head.weight
        if (self._lm_head_t is None and not self.products_packed
                and weight.numel() * weight.element_size() <= LM_HEAD_COPY_LIMIT_BYTES):
            self._lm_head_t = weight.detach().t().contiguous()

    def forward_static(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """tokens [1, T] at ``positions`` [T] (a tensor) -> logits [1, T, vocab].

        Every shape depends on T and the cache capacity only, never on the position: attention spans
        the whole cache under a mask and keys are written with ``index_copy_``. That is what lets
        ``torch.compile`` build one graph per row count (call ``prepare_static`` first).
        """
        mask = self._attention_mask(positions, cache.capacity, self.config.sliding_window is not None)
        x = self.embed(tokens)
        rope = None
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
        else:
            rope = self._rope(positions, cache.capacity)  # prepare_static built the table: no rebuild when traced
        x = self._run_layers(x, rope, cache, positions, cache.capacity, mask, self.config.n_layer)
        return self._head(x)

    def forward_static_tree(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                            mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """``forward_static`` for token trees: tokens [1, T] at ``positions`` [T], written to cache
        ``slots`` [T], each row attending to the slots ``mask`` [T, capacity] marks -> logits
        [1, T, vocab]. Shapes depend on T and the capacity only (compiled by ``CompiledTreeSteps``)."""
        x = self.embed(tokens)
        rope = None
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
        else:
            rope = self._rope(positions, cache.capacity)
        x = self._run_layers(x, rope, cache, slots, cache.capacity, mask, self.config.n_layer, attend=attend_matmul)
        return self._head(x)

    def forward_batched(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, *, exit_layer: int | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """One step over several sequences: tokens [B, T], sequence b at ``positions[b]`` [B, T],
        in cache entry b (``cache`` holds exactly B entries: a ``KVCache.first`` view) -> logits [B, T, vocab].

        Like ``forward_static``, every shape depends on (B, T, capacity) only: each row attends over
        the whole cache under its own causal mask, so rows are computed the same way whatever
        their neighbours and positions (the batch-invariance probe checks the bits).
        ``exit_layer`` runs layers < L only (early-exit drafting into the same cache). ``window``:
        attend over cache slots [0, window) only (default: the whole cache); every row whose output
        matters must sit below it (rows above it, padding, see the whole window and are discarded).
        """
        logits = self._batched(tokens, positions, cache, exit_layer, window, head=True)
        assert logits is not None
        return logits

    def prefill_batched(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                        window: int | None = None) -> None:
        """``forward_batched``'s cache writes without its logits (see ``prefill``)."""
        self._batched(tokens, positions, cache, None, window, head=False)

    def _batched(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, exit_layer: int | None,
                 window: int | None, head: bool) -> torch.Tensor | None:
        # the scheduler builds its inputs from Python lists on the CPU; a GPU model takes them over here
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        window = cache.capacity if window is None else window
        n_layers = self.config.n_layer if exit_layer is None else exit_layer
        native = self.native is not None and (tokens.numel() <= NATIVE_MAX_ROWS or self.native_only)
        # [B, T, window]; none for an embedding-only model's torch path (the statistical tests' bigram models)
        mask = self._batched_mask(positions, window) if native or n_layers else None
        if native:
            logits_rows = None if head else 0
            if tokens.numel() <= NATIVE_MAX_ROWS:
                out = self.native(tokens, positions, positions, mask, cache, exit_layer, logits_rows=logits_rows)
                return out if head else None
            # More rows than one native call takes (a native_only model): consecutive entries in groups
            # (a row's bits do not depend on the other rows, so the groups compute what one call would).
            per_call = max(1, NATIVE_MAX_ROWS // tokens.shape[1])
            outs = [self.native(tokens[a: a + per_call], positions[a: a + per_call], positions[a: a + per_call],
                                mask[a: a + per_call], cache.entries(a, min(a + per_call, tokens.shape[0])),
                                exit_layer, logits_rows=logits_rows)
                    for a in range(0, tokens.shape[0], per_call)]
            return torch.cat(outs) if head else None
        x = self.embed(tokens)
        if self.pos_embed is not None:
            # Padding rows may sit past a learned position table (scratch slots at the end of the
            # cache); real rows never do. Their outputs are discarded, so clamping them is harmless.
            x = x + self.pos_embed(positions.clamp(max=self.config.block_size - 1))
        if mask is not None:
            rope = None
            if self.pos_embed is None:
                cos, sin = self._rope(positions, cache.capacity)  # [B, T, head_dim]
                rope = (cos[:, None], sin[:, None])  # broadcast over heads
            x = self._run_layers(x, rope, cache, positions, cache.capacity, mask[:, None], n_layers)  # [B, 1, T, window]
        # linear, not prepare_static's transposed copy: at 4-16 rows it is the faster of the two here
        # (embedded draft head, fp32: 200 vs 238 µs at 4 rows; bf16: 114 vs 170 µs).
        return self.logits(x) if head else None

    def forward_tree(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        *,
        exit_layer: int | None = None,
        attend: Attend = attend_sdpa,
    ) -> torch.Tensor:
        """tokens [1, T] at sequence ``positions`` [T], their keys and values written to cache
        ``slots`` [T], each row attending to the slots ``mask`` [T, window] marks (window <= capacity)
        -> logits [1, T, vocab]. A token tree's nodes share positions (siblings) and have slots of
        their own; the mask carries the tree (``tree.tree_attention_mask``). Eager."""
        window = mask.shape[-1]
        if window > cache.capacity or int(slots.max()) >= cache.capacity:
            raise ValueError(f"a tree step up to slot {int(slots.max())} exceeds the KV cache capacity {cache.capacity}")
        if self.native is not None and tokens.shape[1] <= NATIVE_MAX_ROWS:  # no sliding window (supports())
            return self.native(tokens, positions[None], slots[None], mask[None], cache, exit_layer)
        self._refuse_per_op(tokens.shape[1])
        x = self.embed(tokens)
        rope = None
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions.clamp(max=self.config.block_size - 1))
        else:
            rope = self._rope(positions, int(positions.max()) + 1)
        if self.config.sliding_window is not None:
            # Committed slots hold their own position; this step's slots (from slots.min() on) hold
            # positions within a tree's depth of each row, inside any real window.
            slot = torch.arange(window, device=mask.device)[None, :]
            mask = mask & ((slot > positions[:, None] - self.config.sliding_window) | (slot >= slots.min()))
        n_layers = self.config.n_layer if exit_layer is None else exit_layer
        x = self._run_layers(x, rope, cache, slots, window, mask, n_layers, attend=attend)
        return self.logits(x)
