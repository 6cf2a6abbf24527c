"""``quickdraft train self-draft --kind feature``: train a feature draft (model/feature_draft.py) for a
frozen target.

Each step runs the target once without gradients over a batch of windows of the user's text (and,
when asked, of its own continuations), keeping its features (the residual stream after its last
layer) and its next-token distributions p. The draft is trained twice over each window:

1. from the target's true features, as it drafts a proposal's first token;
2. from its own predictions of step 1, as it drafts every later token (training-time test: a draft
   trained only on true features meets its own, slightly wrong, ones at test time and drifts); a
   draft that holds the latest true feature instead (``feedback = "latest"``) is trained on it one
   and two positions stale (its second and third drafted tokens), without the feature term.

Each pass's loss is the cross-entropy of its q against p over the head's subset plus, weighted by
``feature_weight``, a smooth L1 between its predicted and the true features (scaled by their RMS),
which keeps the features it feeds back close to the ones it learned from, plus (``tv_weight`` > 0)
that weight times the rejection rule's rejection rate at ``tv_temperature`` (self_draft.py's term: the
cross-entropy alone spends the draft's capacity on the tail that sampled requests never reach).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from quickdraft.model.feature_draft import (
    FORMAT,
    FeatureDraftModule,
    FeatureDraftShape,
    read_feature_draft,
    save_feature_draft,
    saved_format,
)
from quickdraft.model.loader import load_model
from quickdraft.model.self_draft import default_head_tokens, read_self_draft_module
from quickdraft.model.transformer import Transformer
from quickdraft.train.common import TrainArgs, eval_batches, set_threads, train_loop, training_device
from quickdraft.train.distill import (
    ACCEPTANCE_TEMPERATURE,
    MixedBatches,
    acceptance_at,
    check_sampled_objective,
    generation_sets,
)
from quickdraft.train.self_draft import PROMPT_LEN, _saved_dtype, frequent_tokens
from quickdraft.train.text_data import load_stream, prepare_token_data

log = logging.getLogger(__name__)

FEATURE_WEIGHT = 1.0


def _target_pass(target: Transformer, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's features [batch, T, E] and log p [batch, T, vocab], without gradients."""
    with torch.no_grad():
        features = target.hidden_states(inputs)
        return features, F.log_softmax(target.logits(features).float(), dim=-1)


def feature_draft_loss(module: FeatureDraftModule, target: Transformer, batch: torch.Tensor, *,
                       feature_weight: float = FEATURE_WEIGHT, tv_weight: float = 0.0,
                       tv_temperature: float = ACCEPTANCE_TEMPERATURE) -> tuple[torch.Tensor, dict[str, float]]:
    """Both passes' losses (module docstring). Row j predicts position j + 1's feature from the token
    there and position j's feature, and is scored against p at position j + 1."""
    features, p_log = _target_pass(target, batch[:, :-1])
    tokens, previous, goal = batch[:, 1:-1], features[:, :-1], features[:, 1:]
    p_subset = p_log[:, 1:].exp()[..., module.head_ids]
    scale = goal.float().pow(2).mean().sqrt().clamp_min(1e-6)
    loss = torch.zeros((), device=batch.device)
    metrics: dict[str, float] = {}
    predicted = None
    holds = module.shape.feedback == "latest"
    for name in ("true", "own") if not holds else ("true", "own", "own3"):
        if predicted is None:
            fed = previous
        elif holds:  # the latest true feature held: 1 (own) or 2 (own3) positions older than the true one
            stale = 1 if name == "own" else 2
            fed = torch.cat([previous[:, :1].expand(-1, stale, -1), previous[:, :-stale]], dim=1)
        else:
            fed = torch.cat([previous[:, :1], predicted[:, :-1]], dim=1)
        predicted = module.predict(target, tokens, fed)
        q_logits = module.head_logits(predicted).float()
        q_log = F.log_softmax(q_logits, dim=-1)
        ce = -(p_subset * q_log).sum(-1).mean()
        drift = F.smooth_l1_loss(predicted.float() / scale, goal.float() / scale)
        loss = loss + ce + (0.0 if holds else feature_weight) * drift
        if tv_weight > 0:
            rejected = 1.0 - acceptance_at(p_log[:, 1:], q_logits, tv_temperature, module.head_ids).mean()
            loss = loss + tv_weight * rejected
            metrics[f"tv_{name}"] = float(rejected.detach())
        with torch.no_grad():
            agree = (module.head_ids[q_log.argmax(-1)] == p_log[:, 1:].argmax(-1)).float().mean()
        metrics.update({f"ce_{name}": float(ce.detach()), f"drift_{name}": float(drift.detach()),
                        f"agree_{name}": float(agree)})
        if name == "true":
            with torch.no_grad():
                accept = acceptance_at(p_log[:, 1:], q_logits, ACCEPTANCE_TEMPERATURE, module.head_ids).mean()
            metrics[f"accept_t{ACCEPTANCE_TEMPERATURE:g}"] = float(accept)
            metrics["coverage"] = float(p_subset.sum(-1).mean())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


@torch.no_grad()
def evaluate_feature_draft(module: FeatureDraftModule, target: Transformer, batches: list[torch.Tensor], *,
                           tv_weight: float = 0.0, tv_temperature: float = ACCEPTANCE_TEMPERATURE) -> dict[str, float]:
    """Validation: both passes' cross-entropy and agreement with the target's argmax (``agree_true``:
    a proposal's first token, ``agree_own``: later ones, from its own features), the drift of its
    features, the subset's coverage of p and the rejection rule's acceptance at T = 0.8; the loss is the
    trained one (``tv_weight``)."""
    module.eval()
    totals: dict[str, float] = {}
    for batch in batches:
        _, metrics = feature_draft_loss(module, target, batch.to(target.device), tv_weight=tv_weight,
                                        tv_temperature=tv_temperature)
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + value / len(batches)
    module.train()
    return totals


def train_feature_draft(args: TrainArgs, target_ref: str | Path, data: list[Path], *, head_tokens: int | None = None,
                        mlp_size: int | None = None, generated_fraction: float = 0.5, n_generations: int = 256,
                        sampled_generations: int = 0, sample_temperature: float = ACCEPTANCE_TEMPERATURE,
                        save_to: Path | None = None, init_from: Path | None = None, exit_layer: int = 0,
                        feature_weight: float = FEATURE_WEIGHT, tv_weight: float = 0.0,
                        tv_temperature: float = ACCEPTANCE_TEMPERATURE) -> dict[str, object]:
    """Train a feature draft for the target ``target_ref`` on the text in ``data`` and save it to
    ``save_to`` (default ``args.out_dir``); the arguments are ``train_self_draft``'s. ``mlp_size``:
    the draft layer's MLP width (default: the target's); ``exit_layer``: target layers run before it.
    ``init_from``: a saved feature draft of this target, or an exit adapter (``FeatureDraftModule.
    from_exit_adapter``: its shape and head kept). ``tv_weight`` and ``tv_temperature``: the rejection-rate
    term (module docstring)."""
    check_sampled_objective(n_generations, sampled_generations, sample_temperature, tv_weight, tv_temperature)
    set_threads(args.threads)
    device = training_device(args.device)
    torch.manual_seed(args.seed)
    target = load_model(target_ref)  # fp32: training runs in fp32 whatever the checkpoint's dtype
    config = target.config
    args.out_dir.mkdir(parents=True, exist_ok=True)
    eos = target.eos_token_ids[0] if target.eos_token_ids else None
    data_dir = prepare_token_data(data, target.tokenizer, eos, config.vocab_size, args.out_dir / "data",
                                  min_tokens=args.seq_len + 2)
    args.data_dir = data_dir
    tokens = load_stream(data_dir, "train", memmap=True)
    vocab_limit = min(config.vocab_size, target.tokenizer.vocab_size if target.tokenizer else config.vocab_size)
    if init_from is not None and saved_format(init_from) == FORMAT:
        module = read_feature_draft(init_from, target)
        log.info("feature draft: initialised from %s", init_from)
    elif init_from is not None:  # an exit adapter, fed features from now on
        module = FeatureDraftModule.from_exit_adapter(target.model, read_self_draft_module(init_from, target))
        log.info("feature draft: initialised from the exit adapter %s", init_from)
    else:
        shape = FeatureDraftShape(head_tokens or default_head_tokens(config.vocab_size),
                                  config.intermediate_size if mlp_size is None else mlp_size, exit_layer,
                                  "latest" if exit_layer else "predicted")
        shape.check(config)
        head_ids = frequent_tokens(tokens, shape.head_tokens, vocab_limit, target.eos_token_ids)
        module = FeatureDraftModule.initialised_from(target.model, shape, head_ids)
    shape = module.shape
    module.requires_grad_(True)
    target.model.requires_grad_(False)
    target.model.to(device)
    module.to(device)
    coverage = float(np.isin(np.asarray(tokens[: 2_000_000]), module.head_ids.cpu().numpy()).mean())
    n_module = sum(p.numel() for p in module.parameters())
    log.info("feature draft: one layer (MLP %d), head of %d tokens (%.1f%% of the text's tokens); %d trained "
             "parameters (%.3f of the target's %d)", shape.mlp_size, shape.head_tokens, 100 * coverage, n_module,
             n_module / target.n_params, target.n_params)
    if generated_fraction > 0:
        generations = generation_sets(args.out_dir, target.model, tokens, n_generations, sampled_generations,
                                      sample_temperature, PROMPT_LEN, args.seq_len, args.seed)
    else:
        generations = np.zeros((0, 0), dtype=tokens.dtype)
    sampler = MixedBatches(tokens, generations, generated_fraction, args.seed)
    val_batches = eval_batches(load_stream(data_dir, "val"), args.eval_batches, args.batch_size, args.seq_len)
    if init_from is None or saved_format(init_from) != FORMAT:
        with torch.no_grad():
            module.scale_features_like_embeddings(target.model, target.model.hidden_states(val_batches[0].to(device)))
    def evaluate(m: FeatureDraftModule) -> dict[str, float]:
        return evaluate_feature_draft(m, target.model, val_batches, tv_weight=tv_weight, tv_temperature=tv_temperature)

    initial = evaluate(module)  # the initialisation, before training
    summary = train_loop(module, lambda m, b: feature_draft_loss(m, target.model, b,  # type: ignore[arg-type]
                                                                 feature_weight=feature_weight, tv_weight=tv_weight,
                                                                 tv_temperature=tv_temperature),
                         args, name="feature-draft",
                         eval_fn=evaluate,  # type: ignore[arg-type]
                         sampler=sampler)
    summary.update(target=str(target_ref), kind="feature", mlp_size=shape.mlp_size, head_tokens=shape.head_tokens,
                   exit_layer=shape.exit_layer,
                   text_coverage=round(coverage, 4), trained_params=n_module, target_params=target.n_params,
                   generations=int(generations.shape[0]), sampled_generations=sampled_generations,
                   feature_weight=feature_weight, tv_weight=tv_weight,
                   tv_temperature=tv_temperature if tv_weight > 0 else None, init_from=str(init_from) if init_from is not None else None,
                   **{f"initial_val_{name}": value for name, value in initial.items()})
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    save_feature_draft(module, config, save_to or args.out_dir, training=summary, dtype=_saved_dtype(target))
    return summary
