"""The feature draft (model/feature_draft.py, drafters/feature_draft.py): the target's forwards keep
its features at their slots on every path; the draft's one-call native chain feeds back the
features its steps predict exactly as its step-by-step path does; greedy output stays bit-identical
to plain decoding, alone and batched, on the native and the per-op path; saved drafts load only
for their target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_factory import make_hf_checkpoint
from quickdraft.batch.drafters import BatchedFeatureDraft, DraftRequest
from quickdraft.drafters.base import DraftContext
from quickdraft.drafters.feature_draft import FeatureDrafter
from quickdraft.drafters.self_draft import SelfDraftDrafter
from quickdraft.engine import Engine
from quickdraft.errors import ModelFormatError, QuickdraftError
from quickdraft.model import feature_draft as feature_draft_model
from quickdraft.model.feature_draft import (
    CONFIG_FILE,
    FeatureDraftModule,
    FeatureDraftShape,
    compose,
    read_feature_draft,
    save_feature_draft,
)
from quickdraft.model.loader import LoadedModel, load_model
from quickdraft.model.self_draft import SelfDraftModule, SelfDraftShape, save_self_draft
from quickdraft.randomness import sampler_for
from quickdraft.sampling import SamplingParams

PROMPTS = [[3, 7, 11, 2, 9], [5, 1, 60, 33, 33, 4, 18], [70, 2]]
HEAD = torch.tensor([0, 1, 2, 3, 4, 5, 7, 9, 11, 18, 33, 40, 41, 60, 63, 70, 80, 90])


def perturbed_draft(target: LoadedModel, out: Path, *, mlp_size: int = 32, seed: int = 0,
                    feedback: str = "predicted") -> Path:
    """A feature draft initialised from the target and perturbed, so that it drafts wrong tokens too."""
    module = FeatureDraftModule.initialised_from(target.model, FeatureDraftShape(len(HEAD), mlp_size, 0, feedback),
                                                 HEAD)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.layers.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.2 * p.std())
        module.fuse_token.weight.add_(torch.randn(module.fuse_token.weight.shape, generator=generator) * 0.05)
    save_feature_draft(module, target.config, out)
    return out


@pytest.fixture(params=["llama", "qwen2", "gpt2"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> LoadedModel:
    return load_model(make_hf_checkpoint(request.param, tmp_path / request.param, num_hidden_layers=3,
                                         hidden_size=64), dtype="bf16")


def test_every_forward_keeps_the_rows_last_residual_stream_at_their_slots(target: LoadedModel) -> None:
    model = target.model
    model.pack_products()
    tokens = torch.tensor([PROMPTS[1]])
    expected = model.hidden_states(tokens)[0]  # uncached, per-op: the reference
    cache = model.new_cache(32)
    cache.keep_features(model.config.n_embd)
    model.prefill(tokens[:, :4], 0, cache)
    model(tokens[:, 4:], 4, cache)  # a verify-like step of 3 rows after the prefill
    tolerance = {"rtol": 0.05, "atol": 0.05 * float(expected.abs().max())}  # bf16, two computation orders
    torch.testing.assert_close(cache.features[0, :7].float(), expected.float(), **tolerance)
    assert not cache.features[0, 7:].any()  # nothing past the rows fed
    early = model.new_cache(32)
    early.keep_features(model.config.n_embd)
    model(tokens, 0, early, exit_layer=1)  # an early exit's rows are not the model's last features
    assert not early.features.any()


def _drafted(drafter: FeatureDrafter, target: LoadedModel, tokens: list[int], k: int, sampling: SamplingParams,
             stepwise: bool) -> list[int]:
    """k draft tokens after ``tokens`` with the target's features, natively or step by step."""
    cache = target.model.new_cache(64)
    drafter.begin(tokens, DraftContext(target.model, cache, 64, target.config.vocab_size))
    target.model.prefill(torch.tensor([tokens[:-1]]), 0, cache)
    cache.set_length(len(tokens) - 1)
    draft = drafter.propose(tokens, k, sampling, sampler_for(sampling), confidence_stop=0.0 if stepwise else None)
    assert drafter.cache is not None and drafter.cache.length == len(tokens)  # only the true-feature rows kept
    return draft.tokens


@pytest.mark.parametrize("arch,mlp_size,feedback,folded", [
    ("llama", 32, "predicted", True), ("qwen2", 32, "predicted", True), ("llama", 0, "predicted", True),
    ("qwen2", 32, "latest", True), ("llama", 32, "predicted", False), ("qwen2", 32, "latest", False)])
def test_the_one_call_chain_feeds_back_the_features_its_steps_predict(arch: str, mlp_size: int, feedback: str,
                                                                      folded: bool, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if not folded:  # a vocabulary too large to fold W_token into a table of the draft's own
        monkeypatch.setattr(feature_draft_model, "FOLDED_TABLE_LIMIT_BYTES", 0)
    target = load_model(make_hf_checkpoint(arch, tmp_path / "t", num_hidden_layers=3, hidden_size=64), dtype="bf16")
    target.model.pack_products()
    drafter = FeatureDrafter(target, perturbed_draft(target, tmp_path / "fd", mlp_size=mlp_size, feedback=feedback))
    assert drafter.model.native is not None  # the C++ chain, attention-only layer included
    assert (drafter.model.embed is target.model.embed) is not folded
    for sampling in (SamplingParams(temperature=0.0), SamplingParams(0.8, seed=3)):
        for tokens in PROMPTS:
            native = _drafted(drafter, target, tokens, 6, sampling, stepwise=False)
            stepwise = _drafted(drafter, target, tokens, 6, sampling, stepwise=True)
            assert native == stepwise and len(native) == 6, (sampling, tokens)
            assert all(t in HEAD.tolist() for t in native)  # the subset head drafts its own tokens only


@pytest.mark.parametrize("folded", [True, False])
def test_the_native_forward_computes_the_per_op_paths_logits(folded: bool, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if not folded:
        monkeypatch.setattr(feature_draft_model, "FOLDED_TABLE_LIMIT_BYTES", 0)
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=3, hidden_size=64), dtype="bf16")
    target.model.pack_products()
    native = FeatureDrafter(target, perturbed_draft(target, tmp_path / "fd"), quantized=False)  # bf16 products, as per-op
    per_op = FeatureDrafter(target, tmp_path / "fd")
    per_op.model.native = None  # the torch ops, with the same packed products

    def first_logits(drafter: FeatureDrafter, tokens: list[int]) -> torch.Tensor:
        cache = target.model.new_cache(64)
        drafter.begin(tokens, DraftContext(target.model, cache, 64, target.config.vocab_size))
        target.model.prefill(torch.tensor([tokens[:-1]]), 0, cache)
        cache.set_length(len(tokens) - 1)
        logits = drafter._feed(tokens, 0, drafter.true_features(0, len(tokens)), logits=True)
        assert logits is not None
        return logits.float()

    for tokens in PROMPTS:
        expected, got = first_logits(per_op, tokens), first_logits(native, tokens)
        head = torch.isfinite(expected)  # the subset head's tokens (-inf elsewhere)
        assert torch.equal(torch.isfinite(got), head) and int(head.sum()) == len(HEAD)
        tolerance = {"rtol": 0.05, "atol": 0.05 * float(expected[head].abs().max())}  # bf16, two computation orders
        torch.testing.assert_close(got[head], expected[head], **tolerance)


@pytest.mark.parametrize("folded", [True, False])
def test_greedy_stays_bit_identical_alone_batched_and_with_trees(target: LoadedModel, folded: bool, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if not folded:
        monkeypatch.setattr(feature_draft_model, "FOLDED_TABLE_LIMIT_BYTES", 0)
    draft_dir = perturbed_draft(target, tmp_path / "fd")
    engine = Engine(target, f"self:{draft_dir}", exact=True, tree_nodes=8)
    assert engine.drafter is not None and engine.drafter.name == "feature-draft"
    plain = [engine.generate(p, 40, gamma=0).token_ids for p in PROMPTS]
    for gamma in (1, 3, "auto"):
        assert [engine.generate(p, 40, gamma=gamma, tree=False).token_ids for p in PROMPTS] == plain, gamma
    assert [engine.generate(p, 40, tree=True).token_ids for p in PROMPTS] == plain
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, 40, gamma=3)] == plain
    stats = engine.generate(PROMPTS[0], 40, gamma=3, tree=False).stats
    assert stats.drafted > 0 and stats.accepted > 0


def test_a_long_prompt_catches_up_in_chunks_the_native_forward_takes(tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=2, hidden_size=64), dtype="bf16")
    engine = Engine(target, f"self:{perturbed_draft(target, tmp_path / 'fd')}", exact=True, context_length=512)
    prompt = [(7 * i) % 90 for i in range(300)]  # more rows than one native forward takes (NATIVE_MAX_ROWS)
    assert engine.generate(prompt, 24, gamma=3).token_ids == engine.generate(prompt, 24, gamma=0).token_ids


def test_a_saved_draft_loads_only_for_its_target(tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=2, hidden_size=64))
    draft_dir = perturbed_draft(target, tmp_path / "fd")
    module = read_feature_draft(draft_dir, target)
    assert module.shape == FeatureDraftShape(len(HEAD), 32) and module.head_ids.tolist() == HEAD.tolist()
    other = load_model(make_hf_checkpoint("llama", tmp_path / "o", num_hidden_layers=3, hidden_size=64))
    with pytest.raises(QuickdraftError, match="trained for another target"):
        read_feature_draft(draft_dir, other)
    meta = json.loads((draft_dir / CONFIG_FILE).read_text())
    (draft_dir / CONFIG_FILE).write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ModelFormatError, match="v99"):
        read_feature_draft(draft_dir, target)


def test_the_composed_draft_folds_the_token_fusion_and_the_feature_scale_in(tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=2, hidden_size=64))
    module = FeatureDraftModule.initialised_from(target.model, FeatureDraftShape(len(HEAD), 32), HEAD)
    with torch.no_grad():
        module.fuse_token.weight.mul_(0.5)
    module.feature_scale.fill_(0.25)
    draft = compose(target.model, module)
    tokens = torch.tensor([[3, 7, 11]])
    previous = torch.randn(1, 3, 64)
    expected = module.predict(target.model, tokens, previous)
    x = draft.embed(tokens) + draft.fuse_feature(previous)  # raw features: the scale is folded in
    torch.testing.assert_close(target.model.continue_layers(x, draft.layers), expected)


def test_a_large_vocabulary_keeps_the_targets_token_table_and_projects_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=2, hidden_size=64))
    module = FeatureDraftModule.initialised_from(target.model, FeatureDraftShape(len(HEAD), 32), HEAD)
    with torch.no_grad():
        module.fuse_token.weight.add_(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 0.1)
    module.feature_scale.fill_(0.25)
    table = target.model.embed.weight
    monkeypatch.setattr(feature_draft_model, "FOLDED_TABLE_LIMIT_BYTES", table.numel() * table.element_size() - 1)
    draft = compose(target.model, module)
    assert draft.embed is target.model.embed  # no second vocab x n_embd table
    tokens = torch.tensor([[3, 7, 11]])
    previous = torch.randn(1, 3, 64)
    x = draft.fuse_token(draft.embed(tokens)) + draft.fuse_feature(previous)
    torch.testing.assert_close(target.model.continue_layers(x, draft.layers),
                               module.predict(target.model, tokens, previous))
    monkeypatch.setattr(feature_draft_model, "FOLDED_TABLE_LIMIT_BYTES", table.numel() * table.element_size())
    folded = compose(target.model, module)
    assert folded.embed is not target.model.embed and not hasattr(folded, "fuse_token")


@pytest.mark.parametrize("tree", [False, True])
def test_after_a_request_the_target_cache_holds_the_features_of_the_committed_text(tree: bool,
                                                                                    tmp_path: Path) -> None:
    """Verify steps write features for rejected drafts too, and a tree's accepted path is moved into
    place: what the draft reads must still be the features of the text the target committed."""
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=2, hidden_size=64))
    engine = Engine(target, f"self:{perturbed_draft(target, tmp_path / 'fd')}", exact=True, tree_nodes=8)
    result = engine.generate(PROMPTS[1], 40, gamma=3, tree=tree)
    assert 0 < result.stats.accepted < result.stats.drafted  # drafts were rejected along the way
    drafter = engine.drafter
    assert isinstance(drafter, FeatureDrafter) and drafter.target_features is not None
    committed = torch.tensor([result.prompt_ids + result.token_ids])[:, :-1]  # the last token is never fed
    expected = target.model.hidden_states(committed)[0]
    torch.testing.assert_close(drafter.target_features[: committed.shape[1]], expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("adapter_mlp", [True, False])
def test_an_exit_adapter_fed_features_drafts_as_the_adapter_before_training(adapter_mlp: bool,
                                                                             tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=3, hidden_size=64), dtype="bf16")
    target.model.pack_products()
    adapter = SelfDraftModule.initialised_from(target.model, SelfDraftShape(1, 1, len(HEAD), adapter_mlp), HEAD)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in adapter.adapters.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.2 * p.std())
    save_self_draft(adapter, target.config, tmp_path / "exit")
    module = FeatureDraftModule.from_exit_adapter(target.model, adapter)
    assert module.shape == FeatureDraftShape(len(HEAD), 128 if adapter_mlp else 0, 1, "latest")
    save_feature_draft(module, target.config, tmp_path / "fed")
    fed = FeatureDrafter(target, tmp_path / "fed")
    assert len(fed.model.layers) == 2 and fed.model.layers[0] is target.model.layers[0]  # shared, not copied
    exit_drafter = SelfDraftDrafter(target, tmp_path / "exit")
    for tokens in PROMPTS:
        cache = target.model.new_cache(64)
        context = DraftContext(target.model, cache, 64, target.config.vocab_size)
        exit_drafter.begin(tokens, context)
        greedy = SamplingParams(temperature=0.0)
        expected = exit_drafter.propose(tokens, 5, greedy, sampler_for(greedy)).tokens
        assert _drafted(fed, target, tokens, 5, greedy, stepwise=False) == expected


@pytest.mark.parametrize("feedback", ["predicted", "latest"])
def test_a_batch_of_sequences_drafts_in_one_native_call_as_each_would_alone(feedback: str, tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=3, hidden_size=64), dtype="bf16")
    target.model.pack_products()
    draft_dir = perturbed_draft(target, tmp_path / "fd", feedback=feedback)
    vocab = target.config.vocab_size
    cache = target.model.new_cache(64, batch=4)
    batched = BatchedFeatureDraft(FeatureDrafter(target, draft_dir), cache, 4, 64, vocab)
    native = batched.model.native
    assert native is not None
    calls = []
    one_call = native.draft_batch
    native.draft_batch = lambda *args, **kwargs: calls.append(args) or one_call(*args, **kwargs)
    texts = [list(p) for p in PROMPTS]
    batched.begin(list(enumerate(texts)))
    fed = [0] * len(texts)  # tokens each target entry holds
    for sampling in (SamplingParams(temperature=0.0), SamplingParams(0.8, seed=3)):
        for _ in range(2):  # a second proposal feeds several committed rows with their features
            for slot, tokens in enumerate(texts):
                target.model.prefill(torch.tensor([tokens[fed[slot]:-1]]), fed[slot], cache.entry(slot))
                fed[slot] = len(tokens) - 1
            requests = [DraftRequest(slot, tokens, 5, sampling, sampler_for(sampling))
                        for slot, tokens in enumerate(texts)]
            drafts = batched.propose(requests, len(texts))
            lone = [_drafted(FeatureDrafter(target, draft_dir), target, tokens, 5, sampling, stepwise=False)
                    for tokens in texts]
            assert [d.tokens for d in drafts] == lone, sampling
            for slot, draft in enumerate(drafts):  # two drafted tokens kept, then the "target's" own
                texts[slot] += draft.tokens[:2] + [int(HEAD[slot])]
    assert len(calls) == 4  # every proposal one call for the batch


def test_a_batch_of_feature_drafts_keeps_greedy_exact(tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint("llama", tmp_path / "t", num_hidden_layers=3, hidden_size=64), dtype="bf16")
    engine = Engine(target, f"self:{perturbed_draft(target, tmp_path / 'fd')}", exact=True)
    plain = [engine.generate(p, 40, gamma=0).token_ids for p in PROMPTS]
    native = engine.batch_scheduler(4).drafter.model.native
    calls = []
    one_call = native.draft_batch
    native.draft_batch = lambda *args, **kwargs: calls.append(args) or one_call(*args, **kwargs)
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, 40, gamma=3, max_batch=4)] == plain
    assert calls  # the sequences drafted together
