"""``quickdraft train self-draft``: train a self-draft module (model/self_draft.py) for a frozen target.

The target is never changed. Each step runs it once without gradients over a batch of windows of
the user's text (tokenized with the target's own tokenizer) and, when asked, of its own greedy
continuations (the text greedy speculation must predict), keeping its residual stream after layer L
and its next-token distribution p. The module continues the stream through its adapter layers, norm
and subset head, and is trained on the cross-entropy of its q against p over the subset (the
distillation loss of distill.py, restricted to the tokens the head can draft). The head's subset is
the K most frequent tokens of the training text (EOS always among them).

Checkpoints, resume, wall-clock budget and progress come from ``train_loop``; only the module is
saved in them, never the target.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from quickdraft.model.loader import DTYPES, LoadedModel, load_model
from quickdraft.model.self_draft import (
    SelfDraftModule,
    SelfDraftShape,
    default_head_tokens,
    read_self_draft_module,
    save_self_draft,
)
from quickdraft.model.transformer import Transformer
from quickdraft.train.common import TrainArgs, eval_batches, set_threads, train_loop, training_device
from quickdraft.train.distill import (
    ACCEPTANCE_TEMPERATURE,
    MixedBatches,
    acceptance_at,
    check_sampled_objective,
    generation_sets,
)
from quickdraft.train.draft_head import frequent_tokens
from quickdraft.train.text_data import load_stream, prepare_token_data

log = logging.getLogger(__name__)

PROMPT_LEN = 32  # corpus prefix each target generation continues


def default_exit_layer(n_layer: int) -> int:
    """One target layer in 16 (at least one): 2 of a 32-layer model, as Kangaroo drafts with on
    Vicuna-7B; 1 of the embedded 6-layer target, where a draft step costs about its share of the
    weights and exit layer 1 with one adapter beat exit layer 2 with or without one (BENCHMARKS.md,
    "Self-draft shapes")."""
    return max(1, min(n_layer - 1, round(n_layer / 16)))


def _target_pass(target: Transformer, inputs: torch.Tensor, exit_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after ``exit_layer`` layers and log p [batch, T, vocab], without gradients."""
    with torch.no_grad():
        streams: list[torch.Tensor] = []
        final = target.hidden_states(inputs, collect=streams)
        return streams[exit_layer - 1], F.log_softmax(target.logits(final).float(), dim=-1)


def self_draft_loss(module: SelfDraftModule, target: Transformer, batch: torch.Tensor, *, tv_weight: float = 0.0,
                    tv_temperature: float = ACCEPTANCE_TEMPERATURE) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy of q against p over the head's tokens, plus ``tv_weight`` x the rejection rate at
    ``tv_temperature`` (distill.py's objective, restricted to the subset)."""
    inputs = batch[:, :-1]
    exit_hidden, p_log = _target_pass(target, inputs, module.shape.exit_layer)
    q_logits = module.logits(target, exit_hidden).float()  # [batch, T, K]
    q_log = F.log_softmax(q_logits, dim=-1)
    p_subset = p_log.exp()[..., module.head_ids]
    loss = -(p_subset * q_log).sum(-1).mean()
    metrics = {"ce": float(loss.detach())}
    accept = None
    if tv_weight > 0:
        acceptance = acceptance_at(p_log, q_logits, tv_temperature, module.head_ids).mean()
        loss = loss + tv_weight * (1.0 - acceptance)
        metrics["tv"] = 1.0 - float(acceptance.detach())
        if tv_temperature == ACCEPTANCE_TEMPERATURE:  # the reported figure, already computed
            accept = acceptance.detach()
    with torch.no_grad():
        agree = (module.head_ids[q_log.argmax(-1)] == p_log.argmax(-1)).float().mean()
        coverage = p_subset.sum(-1).mean()
        if accept is None:
            accept = acceptance_at(p_log, q_logits, ACCEPTANCE_TEMPERATURE, module.head_ids).mean()
    return loss, {"loss": float(loss.detach()), **metrics, "agree": float(agree), "coverage": float(coverage),
                  f"accept_t{ACCEPTANCE_TEMPERATURE:g}": float(accept)}


@torch.no_grad()
def evaluate_self_draft(module: SelfDraftModule, target: Transformer, batches: list[torch.Tensor]) -> dict[str, float]:
    """Validation: the cross-entropy over the subset (``loss``: without any TV term), how often the
    draft's argmax is the target's (greedy acceptance per position, teacher-forced), the target's
    probability mass inside the head's subset, and the rejection rule's acceptance at T = 0.8."""
    module.eval()
    totals = {"loss": 0.0, "agree": 0.0, "coverage": 0.0, f"accept_t{ACCEPTANCE_TEMPERATURE:g}": 0.0}
    for batch in batches:
        _, metrics = self_draft_loss(module, target, batch.to(target.device))
        metrics["loss"] = metrics["ce"]
        for name in totals:
            totals[name] += metrics[name] / len(batches)
    return totals


def _saved_dtype(target: LoadedModel) -> torch.dtype:
    """The dtype the target's own checkpoint is stored in (a bf16 model gets a bf16 module)."""
    name = json.loads((target.path / "config.json").read_text()).get("torch_dtype", "float32")
    return DTYPES.get(name, torch.float32)


def train_self_draft(args: TrainArgs, target_ref: str | Path, data: list[Path], *, exit_layer: int | None = None,
                     adapter_layers: int = 1, head_tokens: int | None = None, adapter_mlp: bool = True,
                     generated_fraction: float = 0.5,
                     n_generations: int = 256, save_to: Path | None = None, init_from: Path | None = None,
                     sampled_generations: int = 0, sample_temperature: float = ACCEPTANCE_TEMPERATURE,
                     tv_weight: float = 0.0, tv_temperature: float = ACCEPTANCE_TEMPERATURE) -> dict[str, object]:
    """Train a self-draft for the target ``target_ref`` (a directory or hub id) on the text in ``data``
    and save it to ``save_to`` (default: ``args.out_dir``). ``args.data_dir`` is ignored: the token
    streams go to ``args.out_dir / "data"``.

    ``init_from`` (a saved self-draft of this target) trains that module further, its shape and head
    kept (the shape arguments are then ignored), with a fresh optimizer and schedule; a checkpoint
    under ``args.resume`` still wins. ``sampled_generations``, ``sample_temperature``, ``tv_weight``
    and ``tv_temperature`` are ``quickdraft train draft``'s (distill.py)."""
    check_sampled_objective(n_generations, sampled_generations, sample_temperature, tv_weight, tv_temperature)
    set_threads(args.threads)
    device = training_device(args.device)
    torch.manual_seed(args.seed)
    target = load_model(target_ref)  # fp32: training runs in fp32 whatever the checkpoint's dtype
    config = target.config
    shape = SelfDraftShape(exit_layer or default_exit_layer(config.n_layer), adapter_layers,
                           head_tokens or default_head_tokens(config.vocab_size), adapter_mlp)
    shape.check(config)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    eos = target.eos_token_ids[0] if target.eos_token_ids else None
    data_dir = prepare_token_data(data, target.tokenizer, eos, config.vocab_size, args.out_dir / "data",
                                  min_tokens=args.seq_len + 2)
    args.data_dir = data_dir
    tokens = load_stream(data_dir, "train", memmap=True)
    vocab_limit = min(config.vocab_size, target.tokenizer.vocab_size if target.tokenizer else config.vocab_size)
    if init_from is not None:
        module = read_self_draft_module(init_from, target)
        shape, head_ids = module.shape, module.head_ids
        log.info("self-draft: initialised from %s", init_from)
    else:
        head_ids = frequent_tokens(tokens, shape.head_tokens, vocab_limit, target.eos_token_ids)
        module = SelfDraftModule.initialised_from(target.model, shape, head_ids)
    module.requires_grad_(True)
    target.model.requires_grad_(False)
    target.model.to(device)
    module.to(device)
    coverage = float(np.isin(np.asarray(tokens[: 2_000_000]), head_ids.numpy()).mean())
    n_module = sum(p.numel() for p in module.parameters())
    log.info("self-draft: exit layer %d of %d, %d adapter layer(s), head of %d tokens (%.1f%% of the text's "
             "tokens); %d trained parameters (%.3f of the target's %d)", shape.exit_layer, config.n_layer,
             shape.adapter_layers, shape.head_tokens, 100 * coverage, n_module, n_module / target.n_params,
             target.n_params)
    if generated_fraction > 0:
        generations = generation_sets(args.out_dir, target.model, tokens, n_generations, sampled_generations,
                                      sample_temperature, PROMPT_LEN, args.seq_len, args.seed)
    else:
        generations = np.zeros((0, 0), dtype=tokens.dtype)
    sampler = MixedBatches(tokens, generations, generated_fraction, args.seed)
    val_batches = eval_batches(load_stream(data_dir, "val"), args.eval_batches, args.batch_size, args.seq_len)
    initial = evaluate_self_draft(module, target.model, val_batches)  # the truncated target, before training
    summary = train_loop(module, lambda m, b: self_draft_loss(m, target.model, b, tv_weight=tv_weight,  # type: ignore[arg-type]
                                                              tv_temperature=tv_temperature),
                         args, name="self-draft",
                         eval_fn=lambda m: evaluate_self_draft(m, target.model, val_batches),  # type: ignore[arg-type]
                         sampler=sampler)
    summary.update(target=str(target_ref), exit_layer=shape.exit_layer, adapter_layers=shape.adapter_layers,
                   adapter_mlp=shape.adapter_mlp,
                   head_tokens=shape.head_tokens, text_coverage=round(coverage, 4), trained_params=n_module,
                   target_params=target.n_params, generations=int(generations.shape[0]),
                   sampled_generations=sampled_generations, tv_weight=tv_weight,
                   init_from=str(init_from) if init_from is not None else None,
                   **{f"initial_val_{name}": value for name, value in initial.items()})
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    save_self_draft(module, config, save_to or args.out_dir, training=summary, dtype=_saved_dtype(target))
    return summary
