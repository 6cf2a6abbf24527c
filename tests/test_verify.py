"""The lossless core on its own: one verification step, checked against its closed form."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare

from quickdraft.randomness import draw_batch, sampler_for
from quickdraft.sampling import SamplingParams
from quickdraft.verify import target_probabilities, verify_batch, verify_greedy, verify_sampling, verify_step

VOCAB = 6
TRIALS = 40_000


def test_greedy_keeps_the_longest_agreeing_prefix_then_the_targets_token():
    assert verify_greedy([4, 2, 7], [4, 2, 7, 9]) == (3, 9)  # all accepted: bonus token
    assert verify_greedy([4, 2, 7], [4, 5, 7, 9]) == (1, 5)  # first disagreement replaced
    assert verify_greedy([4, 2, 7], [1, 2, 7, 9]) == (0, 1)
    assert verify_greedy([], [3]) == (0, 3)


def expected_counts(probs: torch.Tensor) -> np.ndarray:
    probs = probs.double().numpy()
    return probs / probs.sum() * TRIALS


def one_step_distribution(p: torch.Tensor, q: torch.Tensor | None, point: int | None) -> np.ndarray:
    """Distribution of the first committed token after drafting one token from q (or the point mass)."""
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(VOCAB)
    for _ in range(TRIALS):
        x = point if q is None else int(torch.multinomial(q, 1, generator=g))
        n, nxt = verify_sampling([x], None if q is None else q[None], torch.stack([p, p]), g)
        counts[x if n == 1 else nxt] += 1
    return counts


def test_rejection_sampling_one_step_gives_exactly_p():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(VOCAB, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(VOCAB, generator=g) * 2, -1)
    counts = one_step_distribution(p, q, None)
    assert chisquare(counts, expected_counts(p)).pvalue > 0.001
    # and the same counts are far from q, so the test can tell the two apart
    assert chisquare(counts, expected_counts(q)).pvalue < 1e-6


def test_point_mass_drafts_give_exactly_p():
    p = torch.tensor([0.05, 0.4, 0.25, 0.1, 0.15, 0.05])
    counts = one_step_distribution(p, None, point=2)
    assert chisquare(counts, expected_counts(p)).pvalue > 0.001


def test_draft_equal_to_target_is_always_accepted():
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(4, VOCAB, generator=g), -1)
    for _ in range(200):
        draft = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(3)]
        n, _ = verify_sampling(draft, p[:3], p, g)
        assert n == 3


def test_token_the_target_cannot_produce_is_always_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        n, nxt = verify_sampling([0], q, p, g)
        assert n == 0 and nxt in (1, 2)


def test_grouped_probabilities_equal_each_sequence_alone_bit_for_bit():
    from quickdraft.sampling import SamplingParams, grouped_probabilities, probabilities

    g = torch.Generator().manual_seed(9)
    logits = [torch.randn(5, 300, generator=g), torch.randn(300, generator=g), torch.randn(2, 300, generator=g),
              torch.randn(300, generator=g).bfloat16().float()]
    params = [SamplingParams(0.8, 0, 1.0), SamplingParams(0.8, 0, 1.0, seed=3), SamplingParams(1.3, 20, 0.9),
              SamplingParams(0.8, 0, 1.0, rule="rejection")]
    for x, p, q in zip(logits, params, grouped_probabilities(logits, params)):
        assert q.shape == x.shape
        assert torch.equal(q, probabilities(x, p))


def test_a_batch_verifies_each_sequence_as_it_is_verified_alone():
    """verify_batch (the batch scheduler's one call per rule) gives every sequence the verdict
    verify_step gives it alone, with the same generator state afterwards, for greedy, coupled and
    rejection-sampled sequences, drafts with q and point masses, of different lengths, mixed."""
    g = torch.Generator().manual_seed(5)
    rules = ["greedy", "coupled", "rejection", "rejection-point"]
    cases = []
    for i in range(24):
        rule, k = rules[i % 4], i % 5
        top_p = (1.0, 0.9, 0.5)[i % 3]  # coupled rows race with different nucleus cuts in one batch
        sampling = SamplingParams() if rule == "greedy" else SamplingParams(0.9, top_p=top_p, seed=i,
                                                                            rule=rule.split("-")[0])
        logits = torch.randn(k + 1, VOCAB, generator=g) * 2
        q = None if rule == "rejection-point" or k == 0 else torch.softmax(torch.randn(k, VOCAB, generator=g), -1)
        draft = logits[:k].argmax(-1).tolist()  # likely tokens, and one random one: many acceptance lengths
        if k:
            draft[-1] = int(torch.randint(0, VOCAB, (), generator=g))
        cases.append((draft, q, logits, target_probabilities(logits, sampling, sampler_for(sampling)), sampling, 10 + i))
    alone_samplers = [sampler_for(c[4]) for c in cases]
    batch_samplers = [sampler_for(c[4]) for c in cases]
    alone = [verify_step(d, q, lg, p, s, sampler, pos) for (d, q, lg, p, s, pos), sampler in zip(cases, alone_samplers)]
    together = verify_batch(*[list(column) for column in zip(*cases)][:5], batch_samplers, [c[5] for c in cases])
    assert together == alone
    assert len({n for n, _ in alone}) > 2  # the cases reach different acceptance lengths
    for a, b, case in zip(alone_samplers, batch_samplers, cases):  # both consumed the same randomness
        if not case[4].greedy and not a.coupled:
            assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_draws_in_a_batch_are_each_samplers_own_draws():
    probs = torch.softmax(torch.randn(10, 40, generator=torch.Generator().manual_seed(1)), -1)
    params = [SamplingParams(1.0, seed=i, rule="coupled" if i % 2 else "rejection") for i in range(10)]
    alone = [sampler_for(s).draw(p, 7 + i) for i, (s, p) in enumerate(zip(params, probs))]
    assert draw_batch([sampler_for(s) for s in params], probs, [7 + i for i in range(10)]) == alone
