"""Draft distillation: a small model trained to match the target's next-token distribution.

Loss: KL(p_target || q_draft) at temperature 1, summed over the vocabulary and averaged over
positions, plus (``tv_weight`` > 0) that weight times the total variation distance between the two
distributions at a sampling temperature: 1 − TV is the chance that a token drawn from the draft is
accepted there (Leviathan et al. 2022, section 3.3), the figure sampled speculation lives by, and
which KL only bounds (DistillSpec, Zhou et al. 2023, found TV the better objective for sampling).
Half of each batch is corpus text; the other half is the target's own continuations of corpus
prefixes (generated once, before training): greedy ones, the text the draft meets in greedy
speculative decoding, and optionally sampled ones at a temperature, the text it meets there. Same
tokenizer as the target: the vocabularies must be identical for the draft's tokens to mean anything
to the target.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from quickdraft.errors import QuickdraftError
from quickdraft.model.config import ModelConfig
from quickdraft.model.loader import load_model
from quickdraft.model.self_draft import default_head_tokens
from quickdraft.model.transformer import Transformer
from quickdraft.sampling import SamplingParams, tempered_probabilities
from quickdraft.train.common import (
    CHECKPOINT,
    TrainArgs,
    batch_at,
    eval_batches,
    export_model,
    init_from_model,
    init_weights,
    set_threads,
    train_loop,
    training_device,
)
from quickdraft.train.copy_augment import CopyAugmentedBatches
from quickdraft.train.induction import INDUCTION_LR, induction_bootstrap
from quickdraft.train.shapes import ModelShape
from quickdraft.model.draft_head import HEAD_FILE, load_draft_head
from quickdraft.train.draft_head import frequent_tokens, save_counted_head
from quickdraft.train.text_data import load_stream, prepare_token_data, token_dtype

ACCEPTANCE_TEMPERATURE = 0.8  # the sampling temperature the bench and the demo report
HEAD_LOSS_NEEDS_A_HEAD = "--head-loss trains the draft over a cut head: give --head-tokens between 1 and the vocabulary"

log = logging.getLogger(__name__)


def draft_config(shape: ModelShape, target: ModelConfig) -> ModelConfig:
    # the draft speaks the target's vocabulary, token for token, over the same context and positions
    return shape.llama_config(vocab_size=target.vocab_size, block_size=target.block_size,
                              eos_token_ids=target.eos_token_ids, norm_eps=target.norm_eps,
                              rope_theta=target.rope_theta)


def draft_shape_for(target: ModelConfig) -> ModelShape:
    """A draft about a tenth of the target's layer weights: 0.29 of its width in 4 heads, a third of
    its layers (the embedded target's rule: 384 wide, 6 layers -> the embedded draft's 112 and 2)."""
    n_embd = max(32, 16 * round(0.29 * target.n_embd / 16))
    n_head = 4
    return ModelShape(n_embd=n_embd, n_layer=max(1, round(target.n_layer / 3)), n_head=n_head, n_kv_head=n_head,
                      head_dim=n_embd // n_head, intermediate_size=32 * round(2.86 * n_embd / 32))


@torch.no_grad()
def generate_continuations(model: Transformer, prompts: torch.Tensor, n_new: int, *,
                           exit_layer: int | None = None, temperature: float = 0.0,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """Batched continuation: prompts [batch, P] (same length) -> [batch, P + n_new]; greedy, or
    drawn from softmax(logits / ``temperature``) by ``generator`` when ``temperature`` > 0."""
    model.eval()
    batch, length = prompts.shape
    cache = model.new_cache(length + n_new, batch=batch)

    def pick(last: torch.Tensor) -> torch.Tensor:  # [batch, vocab] -> [batch, 1]
        if temperature <= 0:
            return last.argmax(-1, keepdim=True)
        return torch.multinomial(torch.softmax(last.float() / temperature, dim=-1), 1, generator=generator)

    logits = model(prompts, 0, cache, exit_layer=exit_layer)  # [batch, P, vocab]
    out = [prompts]
    nxt = pick(logits[:, -1])
    for i in range(n_new):
        out.append(nxt)
        if i == n_new - 1:
            break
        logits = model(nxt, length + i, cache, exit_layer=exit_layer)
        nxt = pick(logits[:, -1])
    return torch.cat(out, dim=1)


def make_generations(target: Transformer, tokens: np.ndarray, n_sequences: int, prompt_len: int, n_new: int,
                     seed: int, batch: int | None = None, first: int = 0, temperature: float = 0.0) -> np.ndarray:
    """[n_sequences - first, prompt_len + n_new] continuations of random corpus prefixes, greedy or
    sampled at ``temperature`` (each batch by its own generator, seeded by ``seed`` and its start).

    Rows ``first..n_sequences``: with ``first`` a multiple of ``batch`` they are the rows a single
    call from 0 would give, so a saved set can be extended. ``batch`` (default 64 on CPU, 512 on a GPU,
    where a forward over more rows costs the same) changes the rows a seed gives when sampling.
    """
    device = target.device
    batch = batch or (64 if device.type == "cpu" else 512)
    rows = []
    for start in tqdm(range(first, n_sequences, batch), desc="generations", mininterval=10):
        prompts = batch_at(tokens, 10_000_000 + start, min(batch, n_sequences - start), prompt_len - 1, seed)
        generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + start)
        rows.append(generate_continuations(target, prompts.to(device), n_new, temperature=temperature,
                                           generator=generator).cpu().numpy().astype(token_dtype(target.config.vocab_size)))
    return np.concatenate(rows)


def generations_file(out_dir: Path, temperature: float = 0.0) -> Path:
    """Where a run keeps its target generations: greedy ones, or those sampled at ``temperature``."""
    return out_dir / ("generations.npy" if temperature <= 0 else f"generations_t{temperature:g}.npy")


def load_or_make_generations(path: Path, target: Transformer, tokens: np.ndarray, n_sequences: int,
                             prompt_len: int, n_new: int, seed: int, temperature: float = 0.0) -> np.ndarray:
    """The generations in ``path``, extended (and saved) up to ``n_sequences`` rows if it holds fewer."""
    have = np.load(path) if path.exists() else np.zeros((0, prompt_len + n_new), dtype=tokens.dtype)
    if have.shape[1] != prompt_len + n_new:
        raise ValueError(f"{path} holds generations of {have.shape[1]} tokens, this run needs "
                         f"{prompt_len + n_new} (prompt_len + seq_len + 1 - prompt_len + 64); pass --regenerate")
    if have.shape[0] >= n_sequences:
        return have
    log.info("generating %d target continuations (%d already in %s)", n_sequences - have.shape[0], have.shape[0], path)
    new = make_generations(target, tokens, n_sequences, prompt_len, n_new, seed, first=have.shape[0],
                           temperature=temperature)
    generations = np.concatenate([have, new])
    np.save(path, generations)
    return generations


def acceptance_at(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float,
                  head_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per position, Σ min(p, q) of the two distributions at ``temperature`` (1 − their total variation
    distance): the chance that the rejection rule accepts a token drawn from q. [..., vocab] -> [...].
    With ``head_ids`` [K], q is a self-draft head's over those tokens only (q_logits [..., K]; zero
    elsewhere, as the drafter's scattered logits give it)."""
    tempered = SamplingParams(temperature=temperature)  # the decoder's arithmetic for p and q
    p, q = tempered_probabilities(p_logits, tempered), tempered_probabilities(q_logits, tempered)
    if head_ids is not None:
        p = p[..., head_ids]
    return torch.minimum(p, q).sum(-1)


def check_sampled_objective(n_generations: int, sampled_generations: int, sample_temperature: float,
                            tv_weight: float, tv_temperature: float) -> None:
    """Refuse, by flag name and before anything loads, what the generation and TV flags cannot mean."""
    for flag, value in (("--sample-temperature", sample_temperature), ("--tv-temperature", tv_temperature)):
        if not (value > 0 and math.isfinite(value)):
            raise QuickdraftError(f"{flag} must be > 0 and finite (a sampling temperature), got {value}")
    for flag, value in (("--tv-weight", tv_weight), ("--generations", n_generations),
                        ("--sampled-generations", sampled_generations)):
        if not value >= 0:
            raise QuickdraftError(f"{flag} must be >= 0, got {value}")


def generation_sets(out_dir: Path, target: Transformer, tokens: np.ndarray, n_generations: int,
                    sampled_generations: int, sample_temperature: float, prompt_len: int, seq_len: int, seed: int,
                    regenerate: bool = False) -> np.ndarray:
    """The target's greedy continuations and, with ``sampled_generations``, sampled ones, kept in
    ``out_dir`` (extended, or made anew with ``regenerate``), as one array of rows."""
    runs = [(n_generations, 0.0)] + ([(sampled_generations, sample_temperature)] if sampled_generations else [])
    if regenerate:
        for _, temperature in runs:
            generations_file(out_dir, temperature).unlink(missing_ok=True)
    sets = [load_or_make_generations(generations_file(out_dir, temperature), target, tokens, n, prompt_len,
                                     seq_len + 1 - prompt_len + 64, seed, temperature)[:n]
            for n, temperature in runs if n > 0]
    return np.concatenate(sets) if sets else np.zeros((0, 0), dtype=tokens.dtype)


def distill_loss(draft: Transformer, target: Transformer, batch: torch.Tensor, *, tv_weight: float = 0.0,
                 tv_temperature: float = ACCEPTANCE_TEMPERATURE,
                 head_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """KL(p || q) (+ ``tv_weight`` x the rejection rate at ``tv_temperature``). With ``head_ids``
    the draft is trained as it drafts with a cut head (model/draft_head.py): q over those tokens
    only, the KL then the cross-entropy of that q against p's mass on them (self_draft.py's loss)."""
    inputs = batch[:, :-1]
    with torch.no_grad():
        p_logits = target(inputs).float()  # [batch, T, vocab]
        p_log = F.log_softmax(p_logits, dim=-1)
    q_logits = draft(inputs)
    if head_ids is not None:
        q_logits = q_logits[..., head_ids]
    q_log = F.log_softmax(q_logits, dim=-1)
    if head_ids is None:
        divergence = F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True, reduction="batchmean")
        metrics = {"kl": float(divergence.detach())}
    else:
        divergence = -(p_log.exp()[..., head_ids] * q_log).sum(-1).mean()
        metrics = {"head_ce": float(divergence.detach())}
    loss = divergence
    if tv_weight > 0:
        rejected = 1.0 - acceptance_at(p_logits, q_logits, tv_temperature, head_ids).mean()
        loss = divergence + tv_weight * rejected
        metrics["tv"] = float(rejected.detach())
    with torch.no_grad():
        drafted = q_log.argmax(-1) if head_ids is None else head_ids[q_log.argmax(-1)]
        agree = (drafted == p_log.argmax(-1)).float().mean()
        metrics["agree"] = float(agree)
        if head_ids is None:
            metrics["ce"] = float(F.nll_loss(q_log.flatten(0, 1), batch[:, 1:].flatten()))
    return loss, {"loss": float(loss.detach()), **metrics}


@torch.no_grad()
def evaluate_draft(draft: Transformer, target: Transformer, batches: list[torch.Tensor],
                   head_ids: torch.Tensor | None = None) -> dict[str, float]:
    """Cross-entropy on the text, KL to the target, top-1 agreement with it, and ``accept_t0.8``: the
    mean chance that a token the draft samples at T = 0.8 is accepted (teacher-forced, held-out text).
    With ``head_ids`` the last two are the cut head's (q over those tokens, as it drafts)."""
    draft.eval()
    kl_sum = ce_sum = agree_sum = accept_sum = 0.0
    count = 0
    for batch in batches:
        batch = batch.to(draft.device)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        p_logits, q_logits = target(inputs), draft(inputs)
        p_log = F.log_softmax(p_logits, dim=-1)
        q_log = F.log_softmax(q_logits, dim=-1)
        kl_sum += float(F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True, reduction="sum"))
        ce_sum += float(F.nll_loss(q_log.flatten(0, 1), labels.flatten(), reduction="sum"))
        head_logits = q_logits if head_ids is None else q_logits[..., head_ids]
        drafted = head_logits.argmax(-1) if head_ids is None else head_ids[head_logits.argmax(-1)]
        agree_sum += float((drafted == p_log.argmax(-1)).sum())
        accept_sum += float(acceptance_at(p_logits, head_logits, ACCEPTANCE_TEMPERATURE, head_ids).sum())
        count += labels.numel()
    return {"loss": ce_sum / count, "kl": kl_sum / count, "agree": agree_sum / count,
            f"accept_t{ACCEPTANCE_TEMPERATURE:g}": accept_sum / count}


def training_head(init_from: Path | None, tokens: np.ndarray, head_tokens: int, vocab_size: int,
                  always: tuple[int, ...]) -> torch.Tensor:
    """The head a draft trains for: ``init_from``'s head file when it has one of ``head_tokens``
    tokens (the head it drafts with now), else the ``head_tokens`` most frequent of ``tokens``."""
    if init_from is not None:
        saved = load_draft_head(init_from, vocab_size)
        if saved is not None and len(saved) == head_tokens:
            return saved
    return frequent_tokens(np.asarray(tokens), head_tokens, vocab_size, always)


class MixedBatches:
    """Each step: corpus windows (a ``copy_fraction`` of them copy windows) plus windows of the
    target's generations, by (seed, step)."""

    def __init__(self, tokens: np.ndarray, generations: np.ndarray, generated_fraction: float, seed: int,
                 copy_fraction: float = 0.0) -> None:
        self.generations = generations
        self.generated_fraction, self.seed = generated_fraction, seed
        self.corpus = CopyAugmentedBatches(tokens, copy_fraction, seed)

    def __call__(self, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
        n_gen = int(round(batch_size * self.generated_fraction)) if self.generations.size else 0
        corpus = self.corpus(step, batch_size - n_gen, seq_len)
        if n_gen == 0:
            return corpus
        rng = np.random.default_rng([self.seed, step, 1])
        rows = rng.integers(0, self.generations.shape[0], size=n_gen)
        width = self.generations.shape[1]
        if width < seq_len + 1:
            raise ValueError(f"generations of {width} tokens are shorter than seq_len + 1 = {seq_len + 1}")
        offsets = rng.integers(0, width - seq_len, size=n_gen)
        gen = np.stack([self.generations[r, o:o + seq_len + 1] for r, o in zip(rows, offsets)]).astype(np.int64)
        return torch.cat([corpus, torch.from_numpy(gen)])


def train_draft(args: TrainArgs, shape: ModelShape | None, target_dir: str | Path, *, generated_fraction: float = 0.5,
                n_generations: int = 1024, prompt_len: int = 32, export_dir: Path | None = None,
                regenerate: bool = False, init_from: Path | None = None,
                copy_fraction: float = 0.0, induction_steps: int = 0,
                data: list[Path] | None = None, shape_overrides: dict[str, int] | None = None,
                sampled_generations: int = 0, sample_temperature: float = ACCEPTANCE_TEMPERATURE,
                tv_weight: float = 0.0, tv_temperature: float = ACCEPTANCE_TEMPERATURE,
                head_tokens: int | None = None, head_loss: bool = False) -> dict[str, object]:
    """Distil a draft of ``shape`` (None: ``draft_shape_for`` the target) from the model in
    ``target_dir`` (a directory or hub id), whose tokenizer files the draft is saved with.

    ``data``: text files or directories, tokenized with the target's tokenizer into
    ``args.out_dir / "data"`` (train/text_data.py), for a target of any family; without it,
    ``args.data_dir`` is a corpus directory of token streams.

    With ``args.resume`` training continues from ``args.out_dir/checkpoint.pt`` — also against a
    newer target (warm start from a draft distilled from an earlier target snapshot); then pass
    ``regenerate`` so that the generations come from the new target too.

    ``init_from`` (a draft model directory) fine-tunes that draft: its weights replace the random
    initialisation, with a fresh optimizer and learning-rate schedule. A checkpoint found under
    ``args.resume`` still wins, so a killed fine-tuning run resumes exactly. Generations already
    in ``args.out_dir`` are extended to ``n_generations`` rather than made anew.

    ``copy_fraction`` of the corpus windows repeat an earlier span (copy_augment.py), so that a draft
    of a target that copies its context learns to copy too. ``induction_steps`` > 0 first runs that
    many steps of the induction bootstrap (induction.py), so that a small draft has a copying circuit
    to tune; a run resumed from a checkpoint skips it (the checkpoint already holds its result).

    ``sampled_generations`` more continuations are drawn at ``sample_temperature`` and join the
    greedy ones (the text sampled speculation meets); ``tv_weight`` > 0 adds that weight times the
    total variation distance at ``tv_temperature`` to the loss (module docstring).

    The saved draft drafts over the ``head_tokens`` most frequent tokens of the training stream
    (model/draft_head.py; None: a quarter of the vocabulary, at least 1,024 tokens; 0, or the whole
    vocabulary: no head file). ``head_loss`` trains the draft as it drafts with that head: q over its
    tokens only (``distill_loss``; validation likewise); the head is then the one ``init_from`` came
    with (its file copied), when it has one of that size, else the count of the training stream.
    """
    check_sampled_objective(n_generations, sampled_generations, sample_temperature, tv_weight, tv_temperature)
    if head_loss and head_tokens == 0:  # refused before anything loads
        raise QuickdraftError(HEAD_LOSS_NEEDS_A_HEAD)
    set_threads(args.threads)
    device = training_device(args.device)
    torch.manual_seed(args.seed)
    loaded = load_model(target_dir)
    target = loaded.model.to(device)
    shape = replace(shape or draft_shape_for(target.config), **(shape_overrides or {}))
    config = draft_config(shape, target.config)
    draft = Transformer(config)
    init_weights(draft)
    if init_from is not None:
        init_from_model(draft, init_from)
        log.info("draft: initialised from %s", init_from)
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    log.info("draft: %d parameters (%.3f of the target's %d), %s", n_draft, n_draft / n_target, n_target, shape)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if data is not None:
        eos = loaded.eos_token_ids[0] if loaded.eos_token_ids else None
        args.data_dir = prepare_token_data(data, loaded.tokenizer, eos, target.config.vocab_size,
                                           args.out_dir / "data", min_tokens=args.seq_len + 2)
    tokens = load_stream(args.data_dir, "train", memmap=True)
    draft.to(device)
    bootstrap: dict[str, float] = {}
    if induction_steps > 0 and not (args.resume and (args.out_dir / CHECKPOINT).exists()):
        bootstrap = induction_bootstrap(draft, tokens, induction_steps, lr=INDUCTION_LR, seed=args.seed)
    generations = (generation_sets(args.out_dir, target, tokens, n_generations, sampled_generations,
                                   sample_temperature, prompt_len, args.seq_len, args.seed, regenerate)
                   if generated_fraction > 0 else np.zeros((0, 0), dtype=tokens.dtype))
    sampler = MixedBatches(tokens, generations, generated_fraction, args.seed, copy_fraction)
    val = load_stream(args.data_dir, "val")
    val_batches = eval_batches(val, args.eval_batches, args.batch_size, args.seq_len)
    head_tokens = default_head_tokens(config.vocab_size) if head_tokens is None else head_tokens
    cut_head = 0 < head_tokens < config.vocab_size
    head_ids = training_head(init_from, tokens, head_tokens, config.vocab_size, loaded.eos_token_ids) \
        if head_loss and cut_head else None
    if head_loss and head_ids is None:
        raise QuickdraftError(f"{HEAD_LOSS_NEEDS_A_HEAD} (below {config.vocab_size}, the vocabulary)")
    train_head = None if head_ids is None else head_ids.to(device)
    summary = train_loop(
        draft,
        lambda m, b: distill_loss(m, target, b, tv_weight=tv_weight, tv_temperature=tv_temperature,
                                  head_ids=train_head),
        args,
        name="draft",
        eval_fn=lambda m: evaluate_draft(m, target, val_batches, train_head),
        sampler=sampler,
    )
    summary["target_params"] = n_target
    summary["init_from"] = str(init_from) if init_from is not None else None
    summary["generations"] = int(generations.shape[0])
    summary["sampled_generations"] = sampled_generations
    summary["sample_temperature"] = sample_temperature if sampled_generations else None
    summary["tv_weight"] = tv_weight
    summary["tv_temperature"] = tv_temperature if tv_weight > 0 else None
    summary["copy_fraction"] = copy_fraction
    summary.update(bootstrap)
    summary["shape"] = asdict(shape)
    final_dir = export_dir or args.out_dir / "final"
    export_model(draft, loaded.path, final_dir)
    summary["head_loss"] = head_ids is not None
    inherited = head_ids is not None and init_from is not None and (init_from / HEAD_FILE).is_file() and \
        torch.equal(load_draft_head(init_from, config.vocab_size), head_ids)  # type: ignore[arg-type]
    if inherited:  # the head it was trained for, as init_from counted it
        shutil.copyfile(init_from / HEAD_FILE, final_dir / HEAD_FILE)  # type: ignore[operator]
        summary["draft_head"] = {"head_file": str(final_dir / HEAD_FILE), "head_tokens": len(head_ids),
                                 "from": str(init_from)}
    elif cut_head:  # the draft drafts over its most frequent tokens (model/draft_head.py; training_head's count)
        summary["draft_head"] = save_counted_head(np.asarray(tokens), final_dir, head_tokens, config.vocab_size,
                                                  loaded.eos_token_ids, f"the training stream {args.data_dir}")
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
