"""OpenAI's presence and frequency penalties and logit bias, applied to the target's rows.

Token j's logit at a position becomes ``logit_j + bias_j - frequency_penalty * c_j - presence_penalty
* (c_j > 0)``, where c_j counts j among the tokens generated before that position (the prompt's are
not counted, as in OpenAI's API and vLLM). Each row of a verify step predicts a different position:
row r of a chain follows the draft's first r tokens, so it counts them too; a tree's row follows its
node's path. Only the target's rows are adjusted: a draft is a proposal, and whatever it proposes the
verification rules (greedy, coupled, rejection) emit what the *adjusted* target would have, so the
output stays exact — greedy bit for bit equal to adjusted plain decoding, samples distributed as
the adjusted target's. A draft that does not know the adjustment is accepted less often where it
changes the target's choice, so the model drafters' chains adjust their own logits too, with the
request's adjuster (``DraftContext.adjuster``, ``DraftRequest.adjuster``): step by step where a drafted token's q is needed (the rejection rule: q is
then the adjusted distribution it was drawn from), and, where a whole chain is one native call
(greedy and coupled drafts, which need no q), by the adjustment of the committed tokens added to
every position's logits (``draft_bias``: the chain's own repeats are not counted, which only makes
a proposal less likely to be accepted, never changes the output).

Every operation is elementwise and per row (no fused multiply-add whose rounding could depend on
a row's place in a vector loop), so a row's adjusted bits do not depend on how many rows a step has:
exact mode and batch invariance hold."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.sampling_params import SamplingParams
from quickdraft.tree import ROOT, TokenTree


class LogitAdjuster:
    """One request's adjustment: its generated-token counts, kept up to date by ``commit``."""

    def __init__(self, params: SamplingParams, vocab: int) -> None:
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        self.vocab = vocab
        self.counts = torch.zeros(vocab)  # [vocab] fp32: each token's count among the generated ones
        self.bias: torch.Tensor | None = None
        if params.logit_bias:
            self.bias = torch.zeros(vocab)
            for token, value in params.logit_bias:
                self.bias[token] = value

    @classmethod
    def for_request(cls, params: SamplingParams, vocab: int) -> LogitAdjuster | None:
        """The request's adjuster, or None when it adjusts nothing. A biased token id outside the
        vocabulary is an error here, before the request runs."""
        if not params.adjusts_logits:
            return None
        params.check_vocabulary(vocab)
        return cls(params, vocab)

    def commit(self, tokens: Sequence[int]) -> None:
        """Count newly generated tokens."""
        for token in tokens:
            self.counts[token] += 1

    def row(self, logits: torch.Tensor, extra: Sequence[int]) -> torch.Tensor:
        """logits [vocab] of the position after the generated tokens and then ``extra`` -> adjusted fp32."""
        counts = self.counts
        if extra:
            counts = counts.clone()
            for token in extra:
                counts[token] += 1
        return self._adjust(logits, counts)

    def draft_bias(self, k: int, temperature: float) -> torch.Tensor:
        """[k, vocab] fp32 rows to add to a native draft's logit / temperature at each of its k positions:
        the adjustment of the committed tokens (the chain's own tokens are not counted)."""
        bias = self._adjust(torch.zeros(self.vocab), self.counts) / temperature
        return bias.expand(k, -1).contiguous()

    def chain_rows(self, logits: torch.Tensor, draft: Sequence[int]) -> torch.Tensor:
        """logits [rows, vocab] of a chain step (row r follows the draft's first r tokens; rows past
        the draft's are counted as its last) -> adjusted fp32 logits, a new tensor."""
        rows = logits.shape[0]
        counts = self.counts.expand(rows, -1)
        if draft and rows > 1:
            steps = torch.zeros(rows, self.vocab)
            for r, token in enumerate(draft[: rows - 1]):
                steps[r + 1, token] = 1
            counts = counts + steps.cumsum(0)  # integers in fp32: exact
        return self._adjust(logits, counts)

    def tree_rows(self, logits: torch.Tensor, tree: TokenTree) -> torch.Tensor:
        """logits [1 + nodes (+ padding), vocab] of a tree step (row 0 the root's, row 1 + i node
        i's, which follows its path from the root, node i included) -> adjusted fp32 logits."""
        paths = torch.zeros(logits.shape[0], self.vocab)
        for node, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):  # parents come first
            if parent != ROOT:
                paths[node + 1] = paths[parent + 1]
            paths[node + 1, token] += 1
        return self._adjust(logits, self.counts + paths)

    def _adjust(self, logits: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        out = logits.float()
        counts = counts.to(out.device)  # kept on the CPU, where they are updated token by token
        if self.frequency:
            out = out - self.frequency * counts
        if self.presence:
            out = out - self.presence * (counts > 0).float()
        if self.bias is not None:
            out = out + self.bias.to(out.device)
        return out

