"""The draft's training objective for sampled speculation: the acceptance it measures, the total
variation term that raises it, and the target's sampled generations it trains on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quickdraft.model.transformer import Transformer
from quickdraft.train.common import init_weights
from quickdraft.train.distill import acceptance_at, distill_loss, make_generations
from quickdraft.train.pretrain import model_config
from quickdraft.train.shapes import ModelShape

VOCAB = 64
TARGET = ModelShape(n_embd=32, n_layer=2, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64)
DRAFT = ModelShape(n_embd=16, n_layer=1, n_head=2, n_kv_head=2, head_dim=8, intermediate_size=32)


def tiny(shape: ModelShape, seed: int) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(model_config(shape, VOCAB, eos_id=0, block_size=128))
    init_weights(model)
    with torch.no_grad():  # logits spread enough that temperature and the draft's guesses matter
        model.lm_head.weight.mul_(5.0)
    return model


def test_acceptance_is_one_minus_total_variation_at_the_temperature() -> None:
    torch.manual_seed(0)
    p_logits, q_logits = 3 * torch.randn(5, VOCAB), 3 * torch.randn(5, VOCAB)
    for temperature in (0.5, 0.8, 1.0):
        p = torch.softmax(p_logits / temperature, -1)
        q = torch.softmax(q_logits / temperature, -1)
        expected = 1 - 0.5 * (p - q).abs().sum(-1)
        assert torch.allclose(acceptance_at(p_logits, q_logits, temperature), expected, atol=1e-6)
    assert torch.allclose(acceptance_at(p_logits, p_logits, 0.8), torch.ones(5))
    # It is the rejection rule's acceptance: a token drawn from q is kept with probability min(1, p/q).
    p, q = torch.softmax(p_logits[0] / 0.8, -1), torch.softmax(q_logits[0] / 0.8, -1)
    draws = torch.multinomial(q, 200_000, replacement=True, generator=torch.Generator().manual_seed(1))
    kept = torch.rand(draws.shape, generator=torch.Generator().manual_seed(2)) < (p[draws] / q[draws]).clamp(max=1)
    assert abs(float(kept.float().mean()) - float(acceptance_at(p_logits[0], q_logits[0], 0.8))) < 0.005


def test_the_total_variation_term_is_added_and_training_on_it_raises_acceptance() -> None:
    target, draft = tiny(TARGET, 1), tiny(DRAFT, 2)
    batch = torch.randint(1, VOCAB, (4, 33), generator=torch.Generator().manual_seed(3))
    kl_only, kl_metrics = distill_loss(draft, target, batch)
    with_tv, metrics = distill_loss(draft, target, batch, tv_weight=2.0, tv_temperature=0.8)
    assert "tv" not in kl_metrics
    assert float(with_tv.detach()) == pytest.approx(float(kl_only.detach()) + 2.0 * metrics["tv"], rel=1e-5)

    def acceptance() -> float:
        with torch.no_grad():
            return float(acceptance_at(target(batch[:, :-1]), draft(batch[:, :-1]), 0.8).mean())

    before = acceptance()
    optimizer = torch.optim.Adam(draft.parameters(), lr=1e-2)
    for _ in range(30):
        with_tv = distill_loss(draft, target, batch, tv_weight=1000.0, tv_temperature=0.8)[0]  # TV dominates
        optimizer.zero_grad()
        with_tv.backward()
        optimizer.step()
    assert acceptance() > before + 0.05, (before, acceptance())


def test_sampled_generations_are_seeded_extendable_and_not_greedy() -> None:
    target = tiny(TARGET, 1)
    tokens = np.random.default_rng(0).integers(1, VOCAB, 4000).astype(np.uint16)
    args = dict(n_sequences=8, prompt_len=6, n_new=10, seed=5, batch=4)
    sampled = make_generations(target, tokens, temperature=0.8, **args)
    greedy = make_generations(target, tokens, **args)
    assert sampled.shape == greedy.shape == (8, 16)
    assert np.array_equal(sampled[:, :6], greedy[:, :6])  # the same corpus prefixes
    assert not np.array_equal(sampled, greedy)
    assert np.array_equal(make_generations(target, tokens, temperature=0.8, **args), sampled)
    assert np.array_equal(make_generations(target, tokens, temperature=0.8, first=4, **args), sampled[4:])
    with torch.no_grad():  # every greedy token is the target's argmax after its prefix
        logits = target(torch.from_numpy(greedy[:, :-1].astype(np.int64)))
    assert np.array_equal(logits[:, 5:].argmax(-1).numpy(), greedy[:, 6:].astype(np.int64))


@pytest.mark.parametrize("flags, message", [
    (["--tv-weight", "-1"], "--tv-weight must be >= 0"),
    (["--sample-temperature", "0"], "--sample-temperature must be > 0"),
    (["--tv-temperature", "nan"], "--tv-temperature must be > 0"),
    (["--sampled-generations", "-5"], "--sampled-generations must be >= 0"),
])
@pytest.mark.parametrize("command", ["draft", "self-draft"])
def test_train_refuses_bad_objective_flags_before_loading_anything(tmp_path, capsys, flags, message, command) -> None:
    from quickdraft.cli import main

    code = main(["train", command, "--target", str(tmp_path / "no-such-target"), "--data", str(tmp_path),
                 "--out", str(tmp_path / "out"), *flags])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_acceptance_over_a_head_is_the_overlap_of_p_and_q_at_the_temperature_over_its_tokens() -> None:

    generator = torch.Generator().manual_seed(3)
    p_log = torch.log_softmax(torch.randn(5, 10, generator=generator), -1)
    q_logits = torch.randn(5, 4, generator=generator)
    head = torch.tensor([0, 3, 5, 9])
    for temperature in (0.5, 1.0):
        p = torch.softmax(p_log / temperature, -1)[:, head]
        q = torch.softmax(q_logits / temperature, -1)
        expected = torch.minimum(p, q).sum(-1)
        assert torch.allclose(acceptance_at(p_log, q_logits, temperature, head), expected, atol=1e-6)
    # q the target's own distribution, renormalised on a head holding every token: nothing is rejected
    everything = torch.arange(10)
    assert torch.allclose(acceptance_at(p_log, p_log, 0.8, everything), torch.ones(5), atol=1e-5)


def test_the_head_loss_trains_q_over_the_cut_head_and_raises_its_acceptance() -> None:
    """--head-loss: q over the head's tokens only, its cross-entropy against p's mass on them, the TV
    term over the head (as the draft drafts with model/draft_head.py's cut head)."""
    target, draft = tiny(TARGET, 1), tiny(DRAFT, 2)
    batch = torch.randint(1, VOCAB, (4, 33), generator=torch.Generator().manual_seed(3))
    head = torch.arange(0, VOCAB, 2)  # half the vocabulary
    loss, metrics = distill_loss(draft, target, batch, tv_weight=0.5, tv_temperature=0.8, head_ids=head)
    with torch.no_grad():
        p_log = torch.log_softmax(target(batch[:, :-1]).float(), -1)
        q_log = torch.log_softmax(draft(batch[:, :-1])[..., head], -1)
        ce = float(-(p_log.exp()[..., head] * q_log).sum(-1).mean())
        rejected = 1 - float(acceptance_at(p_log, draft(batch[:, :-1])[..., head], 0.8, head).mean())
    assert metrics["head_ce"] == pytest.approx(ce, rel=1e-5) and metrics["tv"] == pytest.approx(rejected, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(ce + 0.5 * rejected, rel=1e-5)
    assert "kl" not in metrics and "ce" not in metrics
    # the logits of tokens outside the head get no gradient from it
    logits = draft(batch[:, :-1]).detach().requires_grad_(True)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head] = False
    subset_ce = -(p_log.exp()[..., head] * torch.log_softmax(logits[..., head], -1)).sum(-1).mean()
    subset_ce.backward()
    assert logits.grad is not None and float(logits.grad[..., outside].abs().max()) == 0.0

    def head_acceptance() -> float:
        with torch.no_grad():
            return float(acceptance_at(target(batch[:, :-1]), draft(batch[:, :-1])[..., head], 0.8, head).mean())

    before = head_acceptance()
    optimizer = torch.optim.Adam(draft.parameters(), lr=1e-2)
    for _ in range(30):
        step_loss = distill_loss(draft, target, batch, tv_weight=1000.0, tv_temperature=0.8, head_ids=head)[0]
        optimizer.zero_grad()
        step_loss.backward()
        optimizer.step()
    after = head_acceptance()
    with torch.no_grad():  # the most a head can be accepted: p's mass on its tokens
        ceiling = float(torch.softmax(target(batch[:, :-1]) / 0.8, -1)[..., head].sum(-1).mean())
    assert before + 0.05 < after <= ceiling + 1e-6, (before, after, ceiling)
