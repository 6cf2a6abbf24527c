"""Presence and frequency penalties and logit bias: the target's logits are adjusted as OpenAI defines
it, and speculation stays exact under the adjustment (greedy bit for bit; seeded coupled sampling
identical to plain decoding; the rejection rule's samples fit the adjusted target's distribution)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from quickdraft import Engine, SamplingParams
from quickdraft.drafters import draft_model
from quickdraft.errors import QuickdraftError, SamplingParamsError
from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.model.loader import load_model
from quickdraft.sampling import probabilities
from quickdraft.tree import ROOT, TokenTree
from test_exact_greedy import prompts
from test_sampling_exact import (ALPHA, PROMPT, VOCAB, batched_samples, fit_p_values, speculative_samples,
                                 tiny_vocab_pair)

PENALIZED = SamplingParams(frequency_penalty=0.8, presence_penalty=0.4, logit_bias={7: 1.5, 2: -3.0})


def reference_adjusted(logits: torch.Tensor, generated: list[int], params: SamplingParams) -> torch.Tensor:
    """OpenAI's formula, written out: logit - frequency · count - presence · [count > 0] + bias."""
    counts = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=logits.shape[-1]).double()
    out = logits.double() - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).double()
    for token, bias in params.logit_bias:
        out[..., token] += bias
    return out


def test_chain_and_tree_rows_follow_openai_formula():
    vocab, generated = 10, [3, 3, 5]
    adjuster = LogitAdjuster(PENALIZED, vocab)
    adjuster.commit(generated)
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    draft = [3, 7, 3]
    rows = adjuster.chain_rows(logits, draft)
    for r in range(4):  # row r follows the first r draft tokens
        expected = reference_adjusted(logits[r], generated + draft[:r], PENALIZED).float()
        torch.testing.assert_close(rows[r], expected, rtol=0, atol=1e-6)
    tree = TokenTree()
    for token, parent in [(3, ROOT), (7, ROOT), (3, 0), (5, 1), (3, 2)]:
        tree.add(token, parent)
    tree_logits = torch.randn(7, vocab, generator=torch.Generator().manual_seed(1))  # the last row: padding
    got = adjuster.tree_rows(tree_logits, tree)
    paths = [[], [3], [7], [3, 3], [7, 5], [3, 3, 3]]
    for row, path in enumerate(paths):
        expected = reference_adjusted(tree_logits[row], generated + path, PENALIZED).float()
        torch.testing.assert_close(got[row], expected, rtol=0, atol=1e-6)


def test_a_rows_adjusted_bits_do_not_depend_on_the_other_rows():
    """Exact mode's premise for the adjustment: a row gives the same bits alone or among others."""
    adjuster = LogitAdjuster(PENALIZED, 8192)
    adjuster.commit(list(range(0, 8192, 7)) * 3)
    logits = torch.randn(9, 8192, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    draft = [5, 5, 900, 11, 5, 7, 2, 4096]
    together = adjuster.chain_rows(logits, draft)
    for r in range(9):
        alone = LogitAdjuster(PENALIZED, 8192)
        alone.commit(list(range(0, 8192, 7)) * 3 + draft[:r])
        assert torch.equal(together[r], alone.chain_rows(logits[r: r + 1], [])[0]), r


@pytest.fixture(scope="module")
def bigram_pair(tmp_path_factory):
    return tiny_vocab_pair(tmp_path_factory.mktemp("adjust_bigram"), layers=0)


def test_penalized_greedy_decoding_follows_the_formula_on_a_bigram_target(bigram_pair):
    """A 0-layer target's logits depend on the last token only: a table, and the formula applied by
    hand gives the greedy text that plain and speculative decoding must both produce."""
    target, draft = bigram_pair
    with torch.inference_mode():
        table = torch.cat([target.model(torch.tensor([[t]]))[0, -1:] for t in range(VOCAB)])  # [token, next]
    n_new = 24
    expected, last = [], PROMPT[-1]
    for _ in range(n_new):
        adjusted = reference_adjusted(table[last], expected, PENALIZED)
        top2 = adjusted.topk(2).values
        assert top2[0] - top2[1] > 1e-3, "a near tie: the reference cannot tell rounding apart"
        last = int(adjusted.argmax())
        expected.append(last)
    unpenalized = Engine(target, None, exact=False).generate(PROMPT, n_new, gamma=0).token_ids
    assert expected != unpenalized, "the adjustment must change this text for the test to prove anything"
    for drafter, gamma in [(None, 0), (draft, 3), (draft, 1), ("prompt-lookup", 4)]:
        engine = Engine(target, drafter, exact=False)
        assert engine.generate(PROMPT, n_new, PENALIZED, gamma=gamma).token_ids == expected, (drafter, gamma)


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def engines(request, checkpoints) -> dict[str, Engine]:
    target = load_model(checkpoints["target"], dtype=request.param)
    related = load_model(checkpoints["related"], dtype=request.param)
    return {"related": Engine(target, related), "early-exit:1": Engine(target, "early-exit:1"),
            "prompt-lookup": Engine(target, "prompt-lookup"), "related trees": Engine(target, related, tree_nodes=8)}


STRONG = SamplingParams(frequency_penalty=1.5, presence_penalty=0.5, logit_bias={3: 2.0})


def test_penalized_greedy_speculation_is_bit_identical_to_penalized_plain_decoding(engines):
    changed = 0
    for prompt in prompts(6):
        for name, engine in engines.items():
            assert engine.exact
            plain = engine.generate(prompt, 48, STRONG, gamma=0).token_ids
            spec = engine.generate(prompt, 48, STRONG, gamma=3 if "trees" not in name else 4)
            assert spec.token_ids == plain, (name, prompt)
            assert spec.stats.drafted > 0
            if "trees" in name:
                assert spec.stats.tree_steps > 0
            changed += plain != engine.generate(prompt, 48, gamma=0).token_ids
    assert changed > 0, "the penalties changed no output: the test proves nothing"


def test_seeded_penalized_sampling_equals_seeded_plain_decoding(engines):
    """The coupled rule on adjusted rows: chains, trees and the batch give seeded plain decoding's tokens."""
    sampling = dataclasses.replace(STRONG, temperature=0.9, top_p=0.95, seed=11)
    for prompt in prompts(3):
        for name, engine in engines.items():
            plain = engine.generate(prompt, 40, sampling, gamma=0).token_ids
            assert engine.generate(prompt, 40, sampling, gamma=3).token_ids == plain, name
            assert engine.generate_batch([prompt], 40, sampling, gamma=3, max_batch=4)[0].token_ids == plain, name


def test_a_batch_mixing_penalized_and_plain_requests_gives_each_its_output_alone(engines):
    engine = engines["related"]
    batch = prompts(8)
    settings = [STRONG if i % 2 else SamplingParams() for i in range(len(batch))]
    settings[3] = dataclasses.replace(STRONG, temperature=0.8, seed=4)
    alone = [engine.generate_batch([p], 30, s, max_batch=8)[0].token_ids for p, s in zip(batch, settings)]
    together = [r.token_ids for r in engine.generate_batch(batch, 30, settings, gamma=3, max_batch=8)]
    assert together == alone
    assert together[1] == engine.generate(batch[1], 30, STRONG, gamma=0).token_ids


def test_logit_bias_forces_and_bans_tokens(engines):
    engine = engines["related"]
    forced = engine.generate([5, 6, 7], 12, SamplingParams(logit_bias={42: 100}), gamma=3)
    assert forced.token_ids == [42] * 12
    banned = SamplingParams(temperature=1.0, seed=3, logit_bias={t: -100 for t in range(0, 96, 2)})
    for gamma in (0, 3):
        out = engine.generate([5, 6, 7], 40, banned, gamma=gamma).token_ids
        assert all(t % 2 for t in out), out


def test_bad_penalties_and_biases_are_refused_before_anything_runs(engines):
    for bad in [dict(presence_penalty=2.5), dict(frequency_penalty=float("nan")), dict(frequency_penalty=True),
                dict(logit_bias={-1: 1.0}), dict(logit_bias={4: 101}), dict(logit_bias={"4": 1.0}),
                dict(logit_bias=[(4, 1.0), (4, 2.0)]), dict(logit_bias=5)]:
        with pytest.raises(SamplingParamsError):
            SamplingParams(**bad)
    beyond = SamplingParams(logit_bias={96: 5.0})
    engine = engines["related"]
    with pytest.raises(QuickdraftError, match="token id 96 is outside the vocabulary"):
        engine.generate([1, 2], 4, beyond)
    scheduler = engine.batch_scheduler(4)
    with pytest.raises(QuickdraftError, match="outside the vocabulary"):
        scheduler.submit([1, 2], 4, beyond)
    assert scheduler.idle
    assert SamplingParams(logit_bias={5: 1, 2: -1}).logit_bias == ((2, -1.0), (5, 1.0))


# ---- the rejection rule on adjusted rows: chi-square against the adjusted target -----------------
def adjusted_exact_joint(target, params: SamplingParams) -> np.ndarray:
    """P(t1, t2, t3 | PROMPT) under the adjusted target, by enumeration (each row adjusted by hand)."""
    n = len(PROMPT)
    with torch.inference_mode():
        logits = target.model(torch.tensor([PROMPT + list(p) for p in itertools.product(range(VOCAB), repeat=2)]))
    logits = logits.view(VOCAB, VOCAB, n + 2, VOCAB)  # [t1, t2, position, next]
    plain = dataclasses.replace(params, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=())
    joint = np.zeros((VOCAB,) * 3)
    p1 = probabilities(reference_adjusted(logits[0, 0, n - 1], [], params).float(), plain)
    for t1 in range(VOCAB):
        p2 = probabilities(reference_adjusted(logits[t1, 0, n], [t1], params).float(), plain)
        for t2 in range(VOCAB):
            p3 = probabilities(reference_adjusted(logits[t1, t2, n + 1], [t1, t2], params).float(), plain)
            joint[t1, t2] = (p1[t1] * p2[t2] * p3).double().numpy()
    return joint


ADJUSTED_CONFIGS = [
    (SamplingParams(1.0, 0, 1.0, rule="rejection", frequency_penalty=1.2, presence_penalty=0.6, logit_bias={4: 1.0}), 3),
    (SamplingParams(0.7, 5, 0.9, rule="coupled", frequency_penalty=-0.5, presence_penalty=1.0), 3),
]
N_ADJUSTED = 6000


@pytest.mark.slow
def test_penalized_sampling_fits_the_adjusted_target_through_the_batch_and_the_lone_loop(bigram_pair):
    target, draft = bigram_pair
    engine = Engine(target, draft, exact=False)
    batched = batched_samples(engine, ADJUSTED_CONFIGS, N_ADJUSTED)
    lone = speculative_samples(engine, ADJUSTED_CONFIGS[0][0], 3, N_ADJUSTED // 2)
    for (params, _), samples in [*zip(ADJUSTED_CONFIGS, batched), (ADJUSTED_CONFIGS[0], lone)]:
        p_values = fit_p_values(samples, adjusted_exact_joint(target, params))
        assert min(p_values.values()) > ALPHA, (params, p_values)
    # Power: the same samples do not fit the unadjusted target.
    unadjusted = dataclasses.replace(ADJUSTED_CONFIGS[0][0], frequency_penalty=0.0, presence_penalty=0.0, logit_bias=())
    assert fit_p_values(batched[0], adjusted_exact_joint(target, unadjusted))["joint"] < ALPHA


def test_model_drafts_are_adjusted_too_so_the_target_as_its_own_draft_keeps_accepting(checkpoints, monkeypatch):
    """With the target as its own draft, adjusted drafts are the target's own choices. Step by step (a
    draft without native forwards) they are accepted but for last-bit differences between a 1-row draft
    forward and the verify forward; a native chain (greedy, or the rejection rule's draws) adds the
    committed tokens' adjustment to every position and does not count its own tokens, so it misses
    where the chain repeats itself. Unadjusted, this draft's greedy chains were accepted 7% of the time here.
    The draft keeps the target's products (no int8 copy), or its choices would not be the target's."""
    target = load_model(checkpoints["target"])
    engine = Engine(target, load_model(checkpoints["target"]), exact=False, quantized_draft=False)
    rejection = dataclasses.replace(STRONG, temperature=1.0, rule="rejection")
    for prompt in prompts(3):
        alone = engine.generate(prompt, 40, STRONG, gamma=4).stats
        batched = engine.generate_batch([prompt], 40, STRONG, gamma=4, max_batch=4)[0].stats
        drawn = engine.generate(prompt, 40, rejection, gamma=4).stats
        with monkeypatch.context() as patch:
            patch.setattr(draft_model, "draws_natively", lambda sampling, sampler: False)
            step_by_step = engine.generate(prompt, 40, rejection, gamma=4).stats
        for stats, least in ((alone, 0.6), (batched, 0.6), (drawn, 0.6), (step_by_step, 0.95)):
            assert stats.drafted > 0 and stats.acceptance_rate > least, (stats.acceptance_rate, least)
