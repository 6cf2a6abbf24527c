"""Bring your own target, end to end (issue 18): a model quickdraft did not train for speculation.

    .venv/bin/python docs/bench/own_target.py --out runs/own_target [--target-minutes 10] [--draft-minutes 5]

1. Text: the Python standard library's sources (the embedded corpus's train split, as files).
2. A tokenizer of its own: byte-level BPE of 4,096 tokens (the embedded pair's has 8,192).
3. A Qwen2-architecture target (qkv biases; 6 layers x 256), trained by *transformers* with plain
   next-token loss, no early-exit loss and nothing else for speculation, saved as a Hugging Face
   checkpoint. Checkpoints every 2 minutes; a rerun resumes.
4. The two commands a user runs for their own model:
       quickdraft train self-draft --target OUT/target --data OUT/text --out OUT/target/self_draft
       quickdraft train draft      --target OUT/target --data OUT/text --out OUT/draft
5. ``quickdraft bench`` on that target: plain, the draft model, the self-draft, early exit, prompt
   lookup, greedy and at T = 0.8. Its report lands in OUT/bench.

Every stage is skipped when its output exists, so an interrupted run picks up where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from quickdraft.train.corpus import build_corpus
from quickdraft.train.tokenizer_train import EOS_TOKEN, encode_documents, save_tokenizer, train_tokenizer

VOCAB = 4096
SEQ_LEN = 256
BATCH = 16


def text_files(corpus: Path, text_dir: Path) -> None:
    """The corpus's train split as plain files (what a user's --data would be)."""
    text_dir.mkdir(parents=True, exist_ok=True)
    with (corpus / "train.jsonl").open() as handle:
        for line in handle:
            doc = json.loads(line)
            path = text_dir / doc["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(doc["text"])


def qwen2_config(eos: int):
    import transformers

    return transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                                    eos_token_id=eos, bos_token_id=None)


def train_qwen2(out: Path, tokens: np.ndarray, eos: int, minutes: float, tokenizer_dir: Path) -> None:
    """Next-token training with transformers; OUT/target/checkpoint.pt (weights, optimizer, step,
    elapsed) every 2 minutes, the Hugging Face checkpoint at the end."""
    import transformers

    target_dir = out / "target"
    if (target_dir / "config.json").exists():
        return
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(qwen2_config(eos))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    state_path = out / "target_checkpoint.pt"
    step, elapsed = 0, 0.0
    if state_path.exists():
        state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = int(state["step"]), float(state["elapsed"])
        print(f"resumed the target at step {step} ({elapsed / 60:.1f} min)", file=sys.stderr)
    start, last_save = time.perf_counter() - elapsed, time.perf_counter()
    budget = minutes * 60
    while (elapsed := time.perf_counter() - start) < budget:
        lr = 2e-3 * (min(1.0, (step + 1) / 50)) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * elapsed / budget)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        rng = np.random.default_rng([0, step])
        starts = rng.integers(0, tokens.size - SEQ_LEN - 1, BATCH)
        batch = torch.from_numpy(np.stack([tokens[s:s + SEQ_LEN + 1] for s in starts]).astype(np.int64))
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % 50 == 0:
            print(f"target step {step}, {elapsed / 60:.1f} min, loss {loss.item():.3f}", file=sys.stderr)
        if time.perf_counter() - last_save > 120:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "elapsed": time.perf_counter() - start}, state_path)
            last_save = time.perf_counter()
    model.save_pretrained(target_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (target_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
    (out / "target_summary.json").write_text(json.dumps({"steps": step, "minutes": round(elapsed / 60, 1),
                                                         "final_loss": round(loss.item(), 4)}) + "\n")


def quickdraft(*args: str) -> None:
    command = [sys.executable, "-m", "quickdraft.cli", *args]
    print("$ quickdraft " + " ".join(args), file=sys.stderr)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/own_target"))
    parser.add_argument("--target-minutes", type=float, default=10)
    parser.add_argument("--draft-minutes", type=float, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bench-args", default="--quick --prompt-limit 8 --max-new-tokens 64 --repeats 3 --threads 1 "
                        "--no-peers --no-plots --trees 0")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out
    corpus, text_dir, tokenizer_dir = out / "corpus", out / "text", out / "tokenizer"
    if not (corpus / "train.jsonl").exists():
        build_corpus(corpus)
    if not text_dir.exists():
        text_files(corpus, text_dir)
    if not (tokenizer_dir / "tokenizer.json").exists():
        texts = (json.loads(line)["text"] for line in (corpus / "train.jsonl").open())
        save_tokenizer(train_tokenizer(texts, VOCAB), tokenizer_dir)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos = tokenizer.token_to_id(EOS_TOKEN)
    tokens_path = out / "train_tokens.bin"
    if not tokens_path.exists():
        encode_documents(tokenizer, (json.loads(line)["text"] for line in (corpus / "train.jsonl").open())
                         ).tofile(tokens_path)
    train_qwen2(out, np.fromfile(tokens_path, dtype=np.uint16), eos, args.target_minutes, tokenizer_dir)
    target = out / "target"
    loop = ["--max-minutes", str(args.draft_minutes), "--max-steps", "100000", "--threads", str(args.threads),
            "--checkpoint-minutes", "2", "--resume"]
    if not (target / "self_draft" / "self_draft.json").exists():
        quickdraft("train", "self-draft", "--target", str(target), "--data", str(text_dir), "--out",
                   str(target / "self_draft"), *loop)
    if not (out / "draft" / "final" / "config.json").exists():
        quickdraft("train", "draft", "--target", str(target), "--data", str(text_dir), "--out", str(out / "draft"),
                   "--generations", "256", *loop)
    quickdraft("bench", "--target", str(target), "--draft", str(out / "draft" / "final"), "--out", str(out / "bench"),
               *args.bench_args.split())


if __name__ == "__main__":
    main()
