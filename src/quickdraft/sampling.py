"""The ONE logits -> probabilities function, used for the target's p and the drafter's q alike
(same temperature, top-k and top-p), so that rejection sampling stays exact. SamplingParams lives in
``sampling_params`` (no torch there) and is re-exported here."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from quickdraft import kernels
from quickdraft.sampling_params import GREEDY, SamplingParams

__all__ = ["GREEDY", "SamplingParams", "coupled_race", "greedy_tokens", "grouped_probabilities", "inverse_cdf",
           "nucleus_kept", "probabilities", "sample", "tempered_probabilities", "top_probability"]


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax along the last dimension, its first maximum on ties: every greedy pick (the target's
    and the drafters') goes through here. torch.max's indices are argmax's, ~3x faster on bf16 rows
    here (a 8,192-token row: 10 vs 31 us); where quickdraft's CPU kernels run, ``kernels.first_maxima``
    gives the same indices at ~2 us a row."""
    if (logits.device.type != "cpu" or logits.dtype not in (torch.bfloat16, torch.float32) or logits.dim() == 0
            or logits.numel() == 0 or torch.compiler.is_compiling() or not kernels.available()):
        return torch.max(logits, -1)[1]
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return kernels.first_maxima(rows).view(logits.shape[:-1])


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., vocab] -> probabilities [..., vocab] in fp32, after temperature, top-k, top-p.

    Greedy params give the point mass on the argmax.
    """
    # Rows of an embedding padded beyond the tokenizer are sliced off by the caller (vocab_limit).
    if params.greedy:
        return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
    probs = tempered_probabilities(logits, params)
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return probs


def tempered_probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., vocab] -> fp32 probabilities after temperature and top-k, before top-p: what
    the coupled rule's race reads (``coupled_race``), and the first half of ``probabilities``."""
    logits = logits.float()
    # Shift so the maximum is 0 before dividing: a tiny temperature then gives -inf, never inf - inf = NaN.
    # amax, not max: the same values without max's indices (5 against 34 µs on 4 x 8,192 here).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


NUCLEUS_MARGIN = 1e-5
SORT_WHOLE_UP_TO = 512  # tokens: a vocabulary this small is sorted whole


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix, in order of descending probability (ties: the lower token id
    first), whose mass reaches top_p; renormalised.

    Sorting a whole 8,192-token row costs ~0.4 ms here, while the nucleus is usually a few hundred
    tokens. So each row sorts only the tokens of its highest float exponents (p ≥ 2^e) that hold
    top_p of the mass with a margin: every other token is smaller than all of them, so these come
    first in the full sort, with the same values in the same order, and the cumulative sum, which
    scans left to right, has the same bits. Where rounding left the cut outside them, the row is
    sorted whole; so is every row of a small vocabulary, where one sort is the cheaper way (12
    tokens: 18 against 450 µs for 8 rows). Where quickdraft's CPU kernels run, one native call does
    the same (``kernels.nucleus_keep``): the ~25 tensor ops cost ~0.2 ms on a single row."""
    out = nucleus_kept(probs.reshape(-1, probs.shape[-1]), top_p)
    return (out / out.sum(-1, keepdim=True)).reshape(probs.shape)


def nucleus_kept(flat: torch.Tensor, top_p: float) -> torch.Tensor:
    """Rows [rows, vocab] with the tokens past their top-p nucleus zeroed, not renormalised
    (``_nucleus`` gives the definition)."""
    if flat.dtype == torch.float32 and flat.device.type == "cpu" and kernels.available():
        return kernels.nucleus_keep(flat, top_p, NUCLEUS_MARGIN)  # the same cut in one native call
    if flat.shape[-1] <= SORT_WHOLE_UP_TO:
        return _kept_by_sorting(flat, top_p)
    return _kept_by_exponent_cut(flat, top_p)


def coupled_race(tempered: torch.Tensor, noise: torch.Tensor, top_p: float) -> torch.Tensor:
    """The coupled rule's tokens [rows]: for each row of ``tempered`` [rows, vocab]
    (``tempered_probabilities``) and its noise [rows, vocab] (Exp(1), ``randomness``), the first
    token maximising p(v) / E(v) over the row's top-p nucleus. The nucleus is not renormalised: a
    common factor moves no maximum (and a sum's bits would tie the race to one implementation).
    Where quickdraft's kernels run, one native call that mostly skips building the nucleus: the
    whole row's race winner is checked against it (~10x less than cutting and racing in torch)."""
    noise = noise.to(tempered.device)
    if tempered.dtype == torch.float32 and tempered.device.type == "cpu" and kernels.available():
        return kernels.nucleus_race(tempered, noise, top_p, NUCLEUS_MARGIN)
    return ((tempered if top_p >= 1.0 else nucleus_kept(tempered, top_p)) / noise).argmax(-1)


def _kept_by_exponent_cut(flat: torch.Tensor, top_p: float) -> torch.Tensor:
    """Rows [rows, vocab] with the tokens past their nucleus zeroed, each sorting only its
    candidates (``_nucleus`` says why that is the full sort's result)."""
    exponents = (flat.view(torch.int32) >> 23).long()  # p >= 0: its biased fp32 exponent, 0..255
    mass = torch.zeros(flat.shape[0], 256, device=flat.device).scatter_add_(1, exponents, flat)
    enough = mass.flip(1).cumsum(1) >= top_p + 2 * NUCLEUS_MARGIN  # [:, j]: exponents >= 255 - j do
    floors = torch.where(enough.any(1), 255 - enough.int().argmax(1), 0).tolist()
    out = torch.zeros_like(flat)
    for row, floor, kept in zip(flat, floors, out):
        candidates = torch.nonzero(row >= _smallest_with_exponent(floor)).squeeze(1)  # ascending ids
        values, order = row[candidates].sort(descending=True, stable=True)
        if values.sum() >= top_p + NUCLEUS_MARGIN:
            kept.scatter_(0, candidates[order], _kept_prefix(values, top_p))
        else:
            kept.copy_(_kept_by_sorting(row[None], top_p)[0])
    return out


def _kept_prefix(values: torch.Tensor, top_p: float) -> torch.Tensor:
    """Descending values [..., n] with those past the nucleus zeroed: a token goes when the mass
    before it reaches top_p; the most likely token always stays, however small top_p is."""
    cumulative = values.cumsum(-1)
    drop = (cumulative - values) >= top_p
    drop[..., 0] = False
    return values.masked_fill(drop, 0.0)


def _kept_by_sorting(flat: torch.Tensor, top_p: float) -> torch.Tensor:
    """Rows [rows, vocab] with the tokens past their nucleus zeroed, by one stable sort of each."""
    values, ids = flat.sort(dim=-1, descending=True, stable=True)
    return torch.zeros_like(flat).scatter_(-1, ids, _kept_prefix(values, top_p))


def _smallest_with_exponent(biased_exponent: int) -> float:
    """The smallest fp32 value with this biased exponent (0: zero, so that every token is in)."""
    return 0.0 if biased_exponent <= 0 else math.ldexp(1.0, biased_exponent - 127)


def grouped_probabilities(logits: list[torch.Tensor], params: list[SamplingParams],
                          of: Callable[[torch.Tensor, SamplingParams], torch.Tensor] = probabilities,
                          ) -> list[torch.Tensor]:
    """``of`` (``probabilities`` or ``tempered_probabilities``) for many sequences at once: logits[i]
    ([vocab] or [rows, vocab]) under params[i]. Sequences with the same temperature, top-k and top-p
    share one call (every step of a batch has many); each row is computed by the same row-wise
    operations as alone."""
    out: list[torch.Tensor | None] = [None] * len(logits)
    groups: dict[tuple[float, int, float], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.temperature, p.top_k, p.top_p), []).append(i)
    for members in groups.values():
        if len(members) == 1:  # alone (a lone sequence's step): no stack or cat, nothing to split
            out[members[0]] = of(logits[members[0]], params[members[0]])
            continue
        if all(logits[i].dim() == 1 for i in members):  # a row each (a drafting step): stack, no reshapes
            probs = of(torch.stack([logits[i] for i in members]), params[members[0]]).unbind(0)
            for i, q in zip(members, probs):
                out[i] = q
            continue
        rows = [logits[i].reshape(-1, logits[i].shape[-1]) for i in members]
        probs = of(torch.cat(rows), params[members[0]]).split([r.shape[0] for r in rows])
        for i, q in zip(members, probs):
            out[i] = q.reshape(logits[i].shape)
    return out  # type: ignore[return-value]


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Tokens [...] from non-negative weights [..., vocab] (unnormalised is fine, not all zero) and
    uniforms u [...] in [0, 1): the first token whose cumulative weight exceeds u · total. The sums
    are in fp64, so u · total < total and the token found has mass (cum[i] > x >= cum[i - 1] means
    w_i > 0). Each row is computed alone: a row gives the same token in any batch."""
    cumulative = weights.double().cumsum(-1)
    x = cumulative[..., -1:] * u.to(cumulative)[..., None]
    return torch.searchsorted(cumulative, x, right=True)[..., 0]


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a probability vector [vocab], by the inverse CDF of one uniform from
    ``generator``: 57 vs 330 µs for ``torch.multinomial`` on an 8,192-token row here, a cost every
    sampled draft and verification pays."""
    return int(inverse_cdf(probs, torch.rand((), generator=generator)))


def top_probability(logits: torch.Tensor) -> float:
    """The largest probability of softmax(logits): the drafter's confidence in its next token."""
    return float(torch.softmax(logits.float(), dim=-1).max())
