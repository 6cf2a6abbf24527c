"""What the target and draft trainers share: batches, schedule, checkpoints, the loop, export.

Reproducibility: the batch for step ``s`` is drawn by a generator seeded with ``(seed, s)``, so a
run resumed from a checkpoint at step ``s`` sees exactly the batches it would have seen.
The learning-rate schedule (linear warmup, cosine decay to ``min_lr_ratio``) follows the larger of
step progress and wall-clock progress under ``--max-minutes``, so a run that gets less CPU than
expected still ends annealed instead of being cut off at a high learning rate.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from quickdraft.errors import QuickdraftError
from quickdraft.model.config import ModelConfig
from quickdraft.model.loader import load_model
from quickdraft.model.transformer import Transformer
from quickdraft.model.weights import save_pretrained
from quickdraft.train.text_data import load_stream
from quickdraft.train.tokenizer_train import EOS_TOKEN

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


@dataclass
class TrainArgs:
    out_dir: Path
    data_dir: Path
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    max_steps: int = 2000
    max_minutes: float | None = None
    checkpoint_minutes: float = 5.0
    eval_batches: int = 8
    seed: int = 1234
    threads: int | None = None
    resume: bool = False
    device: str = "cpu"

    def to_json(self) -> dict[str, object]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def set_threads(threads: int | None) -> None:
    torch.set_num_threads(threads or min(os.cpu_count() or 1, 16))


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a model's tensors are: its first parameter's or buffer's device, the CPU for a module with
    neither (the tests' stand-in models)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def training_device(name: str) -> torch.device:
    """The device ``--device`` names, refused by name when torch cannot use it (before anything loads)."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise QuickdraftError(f"--device {name!r} is not a device torch knows (cpu, cuda, cuda:1 ...)") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise QuickdraftError(f"--device {name}: this torch sees no CUDA device ({torch.__version__})")
        # TF32 products: the small models here train the same in fp32 and TF32, several times faster
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type != "cpu":
        raise QuickdraftError(f"--device {name}: training runs on cpu or cuda")
    return device


def config_from_dict(raw: dict[str, object]) -> ModelConfig:
    raw = dict(raw)
    raw["eos_token_ids"] = tuple(raw.get("eos_token_ids", ()))  # type: ignore[arg-type]
    return ModelConfig(**raw)  # type: ignore[arg-type]


def init_weights(model: Transformer) -> None:
    """GPT-2 style: N(0, 0.02), residual projections scaled down by sqrt(2 * n_layer)."""
    std = 0.02
    for name, param in model.named_parameters():
        if param.dim() < 2:
            continue
        scale = 1 / math.sqrt(2 * model.config.n_layer) if name.endswith(("attn.out.weight", "mlp.down.weight")) else 1
        torch.nn.init.normal_(param, mean=0.0, std=std * scale)


def init_from_model(model: Transformer, init_dir: Path) -> None:
    """Copy the weights of the model saved in ``init_dir`` (a model directory) into ``model``."""
    source = load_model(init_dir, tokenizer=False).model
    want, have = model.config.to_dict(), source.config.to_dict()
    differ = {k: (have.get(k), v) for k, v in want.items() if k != "eos_token_ids" and have.get(k) != v}
    if differ:
        raise ValueError(f"{init_dir} does not have this model's shape (field: saved, wanted): {differ}; "
                         "pass the matching --n-embd/--n-layer/... flags")
    model.load_state_dict(source.state_dict())


def batch_at(tokens: np.ndarray, step: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """[batch, seq_len + 1] random windows of the stream, a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, tokens.size - seq_len - 1, size=batch_size)
    return torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64))


def eval_batches(tokens: np.ndarray, n_batches: int, batch_size: int, seq_len: int) -> list[torch.Tensor]:
    """Fixed, evenly spaced validation windows (deterministic)."""
    n = n_batches * batch_size
    starts = np.linspace(0, tokens.size - seq_len - 2, n).astype(np.int64)
    windows = torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64))
    return list(windows.split(batch_size))


def lr_at(progress: float, step: int, args: TrainArgs) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


def make_optimizer(model: Transformer, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(path: Path, model: Transformer, optimizer: torch.optim.Optimizer, step: int, elapsed: float,
                    tokens_seen: int, history: list[dict[str, float]], args: TrainArgs) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "elapsed": elapsed,
        "tokens_seen": tokens_seen,
        "history": history,
        "config": json.dumps({**model.config.to_dict(), "eos_token_ids": list(model.config.eos_token_ids)}),
        "args": json.dumps(args.to_json()),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # never leave a half-written checkpoint behind


def load_checkpoint(path: Path) -> dict[str, object]:
    # weights_only: tensors, numbers and strings only; nothing in the file can run code.
    return torch.load(path, map_location="cpu", weights_only=True)


LossFn = Callable[[Transformer, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def train_loop(model: Transformer, loss_fn: LossFn, args: TrainArgs, *, name: str,
               eval_fn: Callable[[Transformer], dict[str, float]] | None = None,
               sampler: Callable[[int, int, int], torch.Tensor] | None = None) -> dict[str, object]:
    """Train ``model`` with ``loss_fn(model, batch) -> (loss, metrics)``; checkpoint and resume.

    ``sampler(step, batch_size, seq_len)`` gives the batch for a step (default: corpus windows).
    """
    set_threads(args.threads)
    device = training_device(args.device)
    model.to(device)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    tokens = load_stream(args.data_dir, "train", memmap=True)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    ckpt_path = args.out_dir / CHECKPOINT
    step, elapsed, tokens_seen, history = 0, 0.0, 0, []
    if args.resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = int(state["step"]), float(state["elapsed"])
        tokens_seen, history = int(state["tokens_seen"]), list(state["history"])
        log.info("%s: resumed from %s at step %d (%.1f min)", name, ckpt_path, step, elapsed / 60)
    elif args.resume:
        log.info("%s: no checkpoint at %s, starting fresh", name, ckpt_path)
    budget_s = args.max_minutes * 60 if args.max_minutes else None
    model.train()
    start = time.perf_counter() - elapsed
    last_ckpt = time.perf_counter()
    bar = tqdm(total=args.max_steps, initial=step, desc=name, mininterval=10, dynamic_ncols=True)
    metrics: dict[str, float] = {}
    while step < args.max_steps:
        elapsed = time.perf_counter() - start
        if budget_s is not None and elapsed >= budget_s:
            log.info("%s: time budget of %.1f min reached at step %d", name, args.max_minutes, step)
            break
        progress = max(step / args.max_steps, elapsed / budget_s if budget_s else 0.0)
        lr = lr_at(progress, step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if sampler is not None:
            batch = sampler(step, args.batch_size, args.seq_len)
        else:
            batch = batch_at(tokens, step, args.batch_size, args.seq_len, args.seed)
        loss, metrics = loss_fn(model, batch.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch.shape[0] * (batch.shape[1] - 1)
        elapsed = time.perf_counter() - start
        metrics = {**metrics, "lr": lr, "grad_norm": float(grad_norm)}
        if step % 10 == 0 or step == 1:
            history.append({"step": step, "elapsed": round(elapsed, 1), "tokens": tokens_seen,
                            **{k: round(v, 5) for k, v in metrics.items()}})
            bar.set_postfix(loss=f"{metrics.get('loss', float('nan')):.3f}", tok_s=f"{tokens_seen / elapsed:.0f}")
        bar.update(1)
        if time.perf_counter() - last_ckpt > args.checkpoint_minutes * 60:
            if eval_fn is not None:
                history.append({"step": step, "elapsed": round(elapsed, 1), "tokens": tokens_seen,
                                **{f"val_{k}": round(v, 5) for k, v in eval_fn(model).items()}})
                log.info("%s: step %d %s", name, step, history[-1])
                model.train()
            save_checkpoint(ckpt_path, model, optimizer, step, time.perf_counter() - start, tokens_seen, history, args)
            last_ckpt = time.perf_counter()
    bar.close()
    elapsed = time.perf_counter() - start
    final_eval = eval_fn(model) if eval_fn is not None else {}
    history.append({"step": step, "elapsed": round(elapsed, 1), "tokens": tokens_seen,
                    **{f"val_{k}": round(v, 5) for k, v in final_eval.items()}})
    save_checkpoint(ckpt_path, model, optimizer, step, elapsed, tokens_seen, history, args)
    model.eval().cpu()  # what follows (export, the saved module) works on CPU tensors
    summary = {"steps": step, "tokens": tokens_seen, "wall_minutes": round(elapsed / 60, 2),
               "params": sum(p.numel() for p in model.parameters()), **{f"val_{k}": v for k, v in final_eval.items()}}
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out_dir / "history.json").write_text(json.dumps(history) + "\n")
    log.info("%s: done %s", name, summary)
    return summary


def export_model(model: Transformer, tokenizer_dir: Path, out_dir: Path, *, extra_config: dict[str, object] | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
    """A complete Hugging Face model directory: weights, config, tokenizer, generation config."""
    save_pretrained(model, out_dir, dtype=dtype)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(extra_config or {})
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:  # what the tokenizer directory has of them: a draft speaks its target's tokens
        if (tokenizer_dir / name).exists():
            shutil.copyfile(tokenizer_dir / name, out_dir / name)
    eos = model.config.eos_token_ids[0] if model.config.eos_token_ids else None
    generation = {"eos_token_id": eos, "pad_token_id": 1, "do_sample": False, "max_new_tokens": 128}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def eos_id(tokenizer_dir: Path) -> int:
    from tokenizers import Tokenizer

    token_id = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(EOS_TOKEN)
    if token_id is None:
        raise ValueError(f"{tokenizer_dir}/tokenizer.json has no {EOS_TOKEN} token")
    return token_id
