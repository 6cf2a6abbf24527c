"""Reproducible figures for the model card: validation loss, greedy acceptance, samples.

Greedy acceptance without the speculative engine: for each held-out prompt the target writes its
greedy continuation; then, teacher-forced on prompt + continuation, the drafter's argmax at each
continuation position is compared with the target's token there.

- ``alpha``: the per-token acceptance rate (share of positions where they agree).
- ``acceptance_rate_gamma``: speculative decoding with γ draft tokens per round, replayed on the
  same continuation: a round accepts the longest agreeing run (≤ γ), then the target adds one
  token of its own; accepted / (γ × rounds), as vLLM counts it.
- ``mean_accepted_length``: tokens per target pass, 1 + accepted / rounds.
- ``target_greedy_distinct_2``: distinct bigrams / bigrams of each greedy continuation, averaged
  (1: no repeated pair; a loop of k tokens tends to k / n). A copying target also copies its own
  loops, and a drafter's α rises on loops, so α is read next to it.

In greedy decoding a matching draft token leaves the draft exactly where the teacher-forced pass
has it, so the replay gives what the engine would measure (up to floating-point ties).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from quickdraft.model.loader import load_model
from quickdraft.model.transformer import Transformer
from quickdraft.train.common import set_threads
from quickdraft.train.copy_augment import repeat_eval_windows, repeat_top1
from quickdraft.train.corpus import iter_documents
from quickdraft.train.distill import generate_continuations
from quickdraft.train.pretrain import EARLY_EXIT_KEY

log = logging.getLogger(__name__)

PROMPT_LINES = (6, 14)  # a prompt is this many consecutive source lines, ending at a line break
MAX_PROMPT_CHARS = 600


def held_out_prompts(corpus_dir: Path, n_prompts: int) -> list[dict[str, str]]:
    """Short snippets of the held-out files, spread evenly through each file, round-robin over files."""
    docs = list(iter_documents(corpus_dir / "val.jsonl"))
    per_file: list[list[dict[str, str]]] = []
    for doc in docs:
        lines = doc["text"].splitlines(keepends=True)
        candidates = []
        start = 0
        while start + PROMPT_LINES[1] < len(lines):
            n = PROMPT_LINES[0] + (start * 7) % (PROMPT_LINES[1] - PROMPT_LINES[0] + 1)
            text = "".join(lines[start:start + n])
            if text.strip() and len(text) <= MAX_PROMPT_CHARS and lines[start].strip():
                candidates.append({"source": f"{doc['path']}:{start + 1}", "prompt": text})
            start += 40
        per_file.append(candidates)
    prompts: list[dict[str, str]] = []
    depth = 0
    while len(prompts) < n_prompts and any(depth < len(c) for c in per_file):
        for candidates in per_file:
            if depth < len(candidates) and len(prompts) < n_prompts:
                prompts.append(candidates[depth])
        depth += 1
    if len(prompts) < n_prompts:
        raise ValueError(f"only {len(prompts)} held-out prompts available, {n_prompts} asked")
    return [{"id": f"heldout-{i:03d}", **p} for i, p in enumerate(prompts)]


def replay_rounds(agree: list[bool], gamma: int) -> tuple[int, int]:
    """(rounds, accepted draft tokens) of greedy speculative decoding over one continuation."""
    rounds = accepted = 0
    i = 0
    while i < len(agree):
        k = 0
        while k < gamma and i + k < len(agree) and agree[i + k]:
            k += 1
        rounds += 1
        accepted += k
        i += k + 1  # the target's own token after the accepted run
    return rounds, accepted


@torch.no_grad()
def validation_loss(model: Transformer, tokens: np.ndarray, seq_len: int = 256, exit_layer: int | None = None) -> float:
    """Next-token cross-entropy over the whole validation stream, in non-overlapping windows."""
    n = (tokens.size - 1) // seq_len
    total = 0.0
    for start in range(0, n, 16):
        rows = [tokens[i * seq_len:i * seq_len + seq_len + 1] for i in range(start, min(n, start + 16))]
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        logits = model(batch[:, :-1], exit_layer=exit_layer)
        total += float(F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"))
    return total / (n * seq_len)


@torch.no_grad()
def ms_per_token(model: Transformer, n: int = 64, exit_layer: int | None = None) -> float:
    prompt = torch.zeros(1, 16, dtype=torch.long)
    generate_continuations(model, prompt, 8, exit_layer=exit_layer)  # warm-up
    start = time.perf_counter()
    generate_continuations(model, prompt, n, exit_layer=exit_layer)
    return (time.perf_counter() - start) * 1000 / n


def distinct_2(tokens: list[int]) -> float:
    """Distinct bigrams / bigrams of ``tokens`` (1.0 for fewer than two tokens)."""
    pairs = list(zip(tokens, tokens[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


def _acceptance(agreements: list[list[bool]], gamma: int) -> dict[str, float]:
    flat = [a for seq in agreements for a in seq]
    rounds = accepted = 0
    for seq in agreements:
        r, a = replay_rounds(seq, gamma)
        rounds, accepted = rounds + r, accepted + a
    alpha = sum(flat) / len(flat)
    return {
        "alpha": alpha,
        "acceptance_rate_gamma": accepted / (gamma * rounds),
        "mean_accepted_length": 1 + accepted / rounds,
        "iid_expected_tokens_per_pass": (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1.0,
    }


def evaluate_pair(target_dir: Path, draft_dir: Path, corpus_dir: Path, *, n_prompts: int = 64, n_new: int = 64,
                  gamma: int = 4, prompts_out: Path | None = None, report_out: Path | None = None,
                  threads: int | None = None, n_samples: int = 3) -> dict[str, object]:
    set_threads(threads)
    target_loaded, draft_loaded = load_model(target_dir), load_model(draft_dir)
    target, draft = target_loaded.model, draft_loaded.model
    tokenizer = target_loaded.tokenizer
    assert tokenizer is not None and draft_loaded.tokenizer is not None
    if tokenizer.vocab != draft_loaded.tokenizer.vocab:
        raise ValueError(f"draft vocabulary ({draft_loaded.tokenizer.vocab_size}) differs from the target's "
                         f"({tokenizer.vocab_size})")
    exit_layer = json.loads((target_dir / "config.json").read_text()).get(EARLY_EXIT_KEY)
    val = np.fromfile(corpus_dir / "val.bin", dtype=np.uint16)

    prompts = held_out_prompts(corpus_dir, n_prompts)
    if prompts_out is not None:
        prompts_out.parent.mkdir(parents=True, exist_ok=True)
        prompts_out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    exit_layers = sorted({exit_layer, *range(1, target.config.n_layer)} - {None})
    draft_agree: list[list[bool]] = []
    exit_agree: dict[int, list[list[bool]]] = {L: [] for L in exit_layers}
    samples = []
    distinct = []
    for i, p in enumerate(prompts):
        ids = torch.tensor([tokenizer.encode(p["prompt"], add_special_tokens=False)])
        full = generate_continuations(target, ids, n_new)  # [1, P + n_new]
        continuation = full[0, ids.shape[1]:]
        distinct.append(distinct_2(continuation.tolist()))
        context = full[:, :-1]
        positions = slice(ids.shape[1] - 1, None)  # logits here predict the continuation
        draft_pred = draft(context)[0, positions].argmax(-1)
        draft_agree.append((draft_pred == continuation).tolist())
        for L in exit_layers:
            exit_pred = target(context, exit_layer=L)[0, positions].argmax(-1)
            exit_agree[L].append((exit_pred == continuation).tolist())
        if i < n_samples:
            samples.append({"source": p["source"], "prompt": p["prompt"],
                            "target_greedy": tokenizer.decode(continuation.tolist(), skip_special_tokens=False),
                            "draft_greedy": tokenizer.decode(generate_continuations(draft, ids, n_new)[0, ids.shape[1]:]
                                                             .tolist(), skip_special_tokens=False)})

    repeat_windows = repeat_eval_windows(val, 16, 128)
    target_loss = validation_loss(target, val)
    draft_loss = validation_loss(draft, val)
    report: dict[str, object] = {
        "target_params": target_loaded.n_params,
        "draft_params": draft_loaded.n_params,
        "draft_to_target_params": draft_loaded.n_params / target_loaded.n_params,
        "val_tokens": int(val.size),
        "target_val_loss": target_loss,
        "target_val_ppl": math.exp(target_loss),
        "draft_val_loss": draft_loss,
        "draft_val_ppl": math.exp(draft_loss),
        # does each model continue a span of held-out text that it has just seen? (copy_augment.py)
        "target_copying": repeat_top1(target, repeat_windows),
        "draft_copying": repeat_top1(draft, repeat_windows),
        "prompts": len(prompts),
        "new_tokens": n_new,
        "gamma": gamma,
        "target_greedy_distinct_2": sum(distinct) / len(distinct),
        "draft": _acceptance(draft_agree, gamma),
        "early_exit_layer": exit_layer,
        "early_exit_val_loss": validation_loss(target, val, exit_layer=exit_layer) if exit_layer else None,
        "early_exit": {str(L): _acceptance(exit_agree[L], gamma) for L in exit_layers},
        "ms_per_token": {"target": ms_per_token(target), "draft": ms_per_token(draft),
                         **({f"target_exit_{exit_layer}": ms_per_token(target, exit_layer=exit_layer)}
                            if exit_layer else {})},
        "samples": samples,
    }
    if report_out is not None:
        report_out.parent.mkdir(parents=True, exist_ok=True)
        report_out.write_text(json.dumps(report, indent=2) + "\n")
    return report
