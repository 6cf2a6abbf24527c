"""Target pretraining: a small Llama on the corpus, with a LayerSkip-style early-exit loss.

Besides the usual next-token cross-entropy at the last layer, the residual stream after layer
``exit_layer`` goes through the *shared* final norm and LM head, and its cross-entropy is added
with weight ``exit_weight``. The first ``exit_layer`` layers then predict the next token well on
their own, which is what self-speculation drafts with (``Transformer.forward(exit_layer=L)``).
The chosen L is written to config.json as ``quickdraft_early_exit_layer``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from quickdraft.model.config import EARLY_EXIT_CONFIG_KEY, ModelConfig
from quickdraft.model.transformer import Transformer
from quickdraft.train.common import (
    TrainArgs,
    config_from_dict,
    eval_batches,
    export_model,
    init_from_model,
    init_weights,
    load_checkpoint,
    train_loop,
)
from quickdraft.train.copy_augment import CopyAugmentedBatches, repeat_eval_windows, repeat_top1
from quickdraft.train.shapes import TARGET_BLOCK_SIZE, ModelShape

log = logging.getLogger(__name__)

EARLY_EXIT_KEY = EARLY_EXIT_CONFIG_KEY


def model_config(shape: ModelShape, vocab_size: int, eos_id: int, block_size: int = TARGET_BLOCK_SIZE) -> ModelConfig:
    return shape.llama_config(vocab_size=vocab_size, block_size=block_size, eos_token_ids=(eos_id,))


def target_loss(model: Transformer, batch: torch.Tensor, exit_layer: int | None,
                exit_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    inputs, labels = batch[:, :-1], batch[:, 1:]
    collect: list[torch.Tensor] = []
    hidden = model.hidden_states(inputs, collect=collect)  # [batch, T, n_embd]
    logits = model.lm_head(model.norm(hidden))  # [batch, T, vocab]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    metrics = {"loss": float(loss.detach())}
    total = loss
    if exit_layer is not None and exit_weight > 0:
        exit_logits = model.lm_head(model.norm(collect[exit_layer - 1]))
        exit_loss = F.cross_entropy(exit_logits.flatten(0, 1), labels.flatten())
        total = loss + exit_weight * exit_loss
        metrics["exit_loss"] = float(exit_loss.detach())
    return total, metrics


@torch.no_grad()
def evaluate_loss(model: Transformer, batches: list[torch.Tensor], exit_layer: int | None = None) -> dict[str, float]:
    """Mean next-token cross-entropy on fixed validation windows (and at the early exit)."""
    model.eval()
    sums = {"loss": 0.0, "exit_loss": 0.0}
    count = 0
    for batch in batches:
        batch = batch.to(model.device)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        collect: list[torch.Tensor] = []
        hidden = model.hidden_states(inputs, collect=collect)
        sums["loss"] += float(F.cross_entropy(model.lm_head(model.norm(hidden)).flatten(0, 1), labels.flatten(),
                                              reduction="sum"))
        if exit_layer is not None:
            exit_logits = model.lm_head(model.norm(collect[exit_layer - 1]))
            sums["exit_loss"] += float(F.cross_entropy(exit_logits.flatten(0, 1), labels.flatten(), reduction="sum"))
        count += labels.numel()
    out = {"loss": sums["loss"] / count}
    if exit_layer is not None:
        out["exit_loss"] = sums["exit_loss"] / count
    return out


def train_target(args: TrainArgs, shape: ModelShape, tokenizer_dir: Path, *, exit_layer: int | None = 2,
                 exit_weight: float = 0.3, export_dir: Path | None = None, copy_fraction: float = 0.0,
                 init_from: Path | None = None, block_size: int = TARGET_BLOCK_SIZE) -> dict[str, object]:
    """Pretrain a target of ``shape``; ``copy_fraction`` of every batch are copy windows (copy_augment.py).

    ``init_from`` (a target model directory) continues training that model with a fresh optimizer and
    schedule, e.g. to teach a finished target to copy; a checkpoint found under ``args.resume`` still wins.
    """
    from quickdraft.train.common import eos_id

    torch.manual_seed(args.seed)
    from tokenizers import Tokenizer

    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    config = model_config(shape, vocab_size, eos_id(tokenizer_dir), block_size)
    if exit_layer is not None and not 1 <= exit_layer < config.n_layer:
        raise ValueError(f"exit layer {exit_layer} must be in 1..{config.n_layer - 1}")
    model = Transformer(config)
    init_weights(model)
    if init_from is not None:
        init_from_model(model, init_from)
        log.info("target: initialised from %s", init_from)
    log.info("target: %d parameters, %s", sum(p.numel() for p in model.parameters()), shape)
    val = np.fromfile(args.data_dir / "val.bin", dtype=np.uint16)
    val_batches = eval_batches(val, args.eval_batches, args.batch_size, args.seq_len)
    repeat_windows = repeat_eval_windows(val, 16, args.seq_len // 2)
    sampler = None
    if copy_fraction > 0:
        sampler = CopyAugmentedBatches(np.memmap(args.data_dir / "train.bin", dtype=np.uint16, mode="r"),
                                       copy_fraction, args.seed)
    summary = train_loop(
        model,
        lambda m, b: target_loss(m, b, exit_layer, exit_weight),
        args,
        name="target",
        eval_fn=lambda m: {**evaluate_loss(m, val_batches, exit_layer), **repeat_top1(m, repeat_windows)},
        sampler=sampler,
    )
    summary["copy_fraction"] = copy_fraction
    summary["init_from"] = str(init_from) if init_from is not None else None
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    extra = {EARLY_EXIT_KEY: exit_layer} if exit_layer is not None else {}
    export_model(model, tokenizer_dir, export_dir or args.out_dir / "final", extra_config=extra)
    return summary


def model_from_checkpoint(path: Path) -> Transformer:
    """Rebuild a model from a training checkpoint (used to export a run cut short)."""
    state = load_checkpoint(path)
    model = Transformer(config_from_dict(json.loads(state["config"])))
    model.load_state_dict(state["model"])
    return model.eval()
