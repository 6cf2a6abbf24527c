"""``quickdraft train``: corpus | tokenizer | target | draft | self-draft | draft-head | export | eval | install | all.

Every step reads and writes plain directories, so each can be rerun or resumed on its own:

    quickdraft train corpus     --out data/corpus
    quickdraft train tokenizer  --corpus data/corpus --out data/tokenizer
    quickdraft train target     --data data/corpus --tokenizer data/tokenizer --out runs/target --max-minutes 95
    quickdraft train target     --init-from runs/target/final --lr 1e-3 --out runs/target_copy --max-minutes 70
    quickdraft train draft      --data data/corpus --target runs/target/final --out runs/draft --max-minutes 20
    quickdraft train draft      --init-from runs/draft/final --lr 1e-3 --out runs/draft_v2 --max-minutes 50
    quickdraft train eval       --target runs/target/final --draft runs/draft/final --data data/corpus

For a model of your own (a directory or hub id; any text, tokenized with the model's tokenizer):

    quickdraft train self-draft --target MODEL --data my_texts/ --out runs/self_draft --max-minutes 20
    quickdraft train draft      --target MODEL --data my_texts/ --out runs/my_draft --max-minutes 30
    quickdraft train draft-head --draft runs/my_draft/final --data my_texts/
    quickdraft train install    --target runs/target/final --draft runs/draft/final
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from dataclasses import fields
from pathlib import Path

from quickdraft.assets import ASSETS, DEFAULT_PAIR, EMBEDDED_PAIRS
from quickdraft.train.shapes import EMBEDDED_DRAFT_SHAPE, EMBEDDED_TARGET_SHAPE, TARGET_BLOCK_SIZE, ModelShape

log = logging.getLogger(__name__)

SHIPPED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _add_loop_flags(p: argparse.ArgumentParser, *, batch_size: int, lr: float, max_steps: int,
                    text_data: bool = False) -> None:
    if text_data:  # a drafter for any target: text tokenized with the target's tokenizer (train/text_data.py)
        p.add_argument("--data", type=Path, nargs="+", default=[Path("data/corpus")],
                       help="text files and/or directories (read recursively), or a corpus dir with train.bin/val.bin "
                       "tokenized with the target's tokenizer (default: data/corpus)")
    else:
        p.add_argument("--data", type=Path, default=Path("data/corpus"), help="corpus dir with train.bin/val.bin")
    p.add_argument("--out", type=Path, required=True, help="run dir: checkpoint, history, final/ model")
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--max-steps", type=int, default=max_steps)
    p.add_argument("--max-minutes", type=float, default=None, help="wall-clock budget; the schedule anneals to it")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:1 ...) to train on a GPU (TF32 products)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt exactly")


def _add_sampled_objective_flags(p: argparse.ArgumentParser) -> None:
    """What a drafter for sampled requests trains on and for (train draft and train self-draft)."""
    p.add_argument("--sampled-generations", type=int, default=0,
                   help="also train on this many target continuations sampled at --sample-temperature (the text "
                   "sampled speculation meets; 0: greedy generations only)")
    p.add_argument("--sample-temperature", type=float, default=0.8)
    p.add_argument("--tv-weight", type=float, default=0.0,
                   help="add this weight x the total variation distance to the target at --tv-temperature to the "
                   "loss (1 - TV is the rejection rule's acceptance there; 0: off)")
    p.add_argument("--tv-temperature", type=float, default=0.8)


def _train_args(ns: argparse.Namespace):  # noqa: ANN202 - TrainArgs, imported lazily (torch)
    from quickdraft.train.common import TrainArgs

    return TrainArgs(
        out_dir=ns.out, data_dir=ns.data[0] if isinstance(ns.data, list) else ns.data, batch_size=ns.batch_size, seq_len=ns.seq_len, lr=ns.lr,
        warmup_steps=ns.warmup_steps, max_steps=ns.max_steps, max_minutes=ns.max_minutes,
        checkpoint_minutes=ns.checkpoint_minutes, eval_batches=ns.eval_batches, seed=ns.seed, threads=ns.threads,
        resume=ns.resume, device=ns.device,
    )


def _cmd_corpus(ns: argparse.Namespace) -> int:
    from quickdraft.train.corpus import build_corpus

    manifest = build_corpus(ns.out, ns.root, limit_files=ns.limit_files)
    print(json.dumps({k: v for k, v in manifest.items() if k != "val_paths"}, indent=2))
    return 0


def _cmd_tokenizer(ns: argparse.Namespace) -> int:
    from quickdraft.train.tokenizer_train import build_tokenizer

    print(json.dumps(build_tokenizer(ns.corpus, ns.out, ns.vocab_size), indent=2))
    return 0


def _add_shape_flags(p: argparse.ArgumentParser, default: ModelShape | None) -> None:
    """One flag per shape field; with ``default`` None they default to None (a shape relative to the target)."""
    for f in fields(ModelShape):
        value = None if default is None else getattr(default, f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=value,
                       help=None if default is not None else "default: relative to the target (distill.draft_shape_for)")


def _shape(ns: argparse.Namespace) -> ModelShape:
    return ModelShape(**{f.name: getattr(ns, f.name) for f in fields(ModelShape)})


def _cmd_target(ns: argparse.Namespace) -> int:
    from quickdraft.train.pretrain import train_target

    exit_layer = ns.exit_layer if ns.exit_layer > 0 else None
    summary = train_target(_train_args(ns), _shape(ns), ns.tokenizer, exit_layer=exit_layer, exit_weight=ns.exit_weight,
                           copy_fraction=ns.copy_fraction, init_from=ns.init_from, block_size=ns.block_size)
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_draft(ns: argparse.Namespace) -> int:
    from quickdraft.train.distill import train_draft
    from quickdraft.train.text_data import is_token_corpus

    overrides = {f.name: getattr(ns, f.name) for f in fields(ModelShape) if getattr(ns, f.name) is not None}
    data = None if is_token_corpus(ns.data) else ns.data
    summary = train_draft(_train_args(ns), None, ns.target, generated_fraction=ns.generated_fraction,
                          n_generations=ns.generations, regenerate=ns.regenerate, init_from=ns.init_from,
                          copy_fraction=ns.copy_fraction, induction_steps=ns.induction_steps, data=data,
                          shape_overrides=overrides, sampled_generations=ns.sampled_generations,
                          sample_temperature=ns.sample_temperature, tv_weight=ns.tv_weight,
                          tv_temperature=ns.tv_temperature, head_tokens=ns.head_tokens,
                          head_loss=ns.head_loss)
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_self_draft(ns: argparse.Namespace) -> int:
    from quickdraft.train.feature_draft import train_feature_draft
    from quickdraft.train.self_draft import train_self_draft

    if ns.kind == "feature":
        summary = train_feature_draft(_train_args(ns), ns.target, ns.data, head_tokens=ns.head_tokens,
                                      mlp_size=ns.mlp_size, generated_fraction=ns.generated_fraction,
                                      n_generations=ns.generations, sampled_generations=ns.sampled_generations,
                                      sample_temperature=ns.sample_temperature, init_from=ns.init_from,
                                      exit_layer=ns.exit_layer or 0, tv_weight=ns.tv_weight,
                                      tv_temperature=ns.tv_temperature)
        print(json.dumps(summary, indent=2))
        print(f"saved the feature draft to {ns.out}; use it with --drafter self:{ns.out}", file=sys.stderr)
        return 0
    summary = train_self_draft(_train_args(ns), ns.target, ns.data, exit_layer=ns.exit_layer,
                               adapter_layers=ns.adapter_layers, head_tokens=ns.head_tokens, adapter_mlp=ns.adapter_mlp,
                               generated_fraction=ns.generated_fraction, n_generations=ns.generations,
                               init_from=ns.init_from, sampled_generations=ns.sampled_generations,
                               sample_temperature=ns.sample_temperature, tv_weight=ns.tv_weight,
                               tv_temperature=ns.tv_temperature)
    print(json.dumps(summary, indent=2))
    print(f"saved the self-draft to {ns.out}; use it with --drafter self:{ns.out}", file=sys.stderr)
    return 0


def _cmd_draft_head(ns: argparse.Namespace) -> int:
    from quickdraft.train.draft_head import make_draft_head

    summary = make_draft_head(ns.draft, ns.data, head_tokens=ns.head_tokens, out=ns.out)
    print(json.dumps(summary, indent=2))
    print(f"the draft now drafts over its {summary['head_tokens']} most frequent tokens "
          f"({summary['head_file']}); --full-draft-head drafts over all of them", file=sys.stderr)
    return 0


def _cmd_eval(ns: argparse.Namespace) -> int:
    from quickdraft.train.evaluate import evaluate_pair

    report = evaluate_pair(ns.target, ns.draft, ns.data, n_prompts=ns.prompts, n_new=ns.new_tokens, gamma=ns.gamma,
                           prompts_out=ns.prompts_out, report_out=ns.report, threads=ns.threads)
    print(json.dumps(report, indent=2))
    return 0


def _cmd_export(ns: argparse.Namespace) -> int:
    from quickdraft.train.common import export_model
    from quickdraft.train.pretrain import EARLY_EXIT_KEY, model_from_checkpoint

    model = model_from_checkpoint(ns.checkpoint)
    extra = {EARLY_EXIT_KEY: ns.exit_layer} if ns.exit_layer else {}
    export_model(model, ns.tokenizer, ns.out, extra_config=extra)
    print(f"exported {ns.checkpoint} to {ns.out}")
    return 0


def _cmd_install(ns: argparse.Namespace) -> int:
    dest_root = ns.dest or EMBEDDED_PAIRS[ns.pair]
    for name, source in (("target", ns.target), ("draft", ns.draft)):
        missing = [source / file for file in SHIPPED_FILES if not (source / file).exists()]
        if missing:
            print(f"error: {missing[0]} is missing; train and export the {name} first", file=sys.stderr)
            return 1
    if ns.self_draft is not None and not (ns.self_draft / "self_draft.json").exists():
        print(f"error: {ns.self_draft / 'self_draft.json'} is missing; run quickdraft train self-draft first",
              file=sys.stderr)
        return 1
    for name, source in (("target", ns.target), ("draft", ns.draft)):
        dest = dest_root / name
        dest.mkdir(parents=True, exist_ok=True)
        for file in SHIPPED_FILES:
            shutil.copyfile(source / file, dest / file)
        if name == "draft":  # its frequency-ranked head (quickdraft train draft-head), or none: the whole head
            from quickdraft.model.draft_head import HEAD_FILE

            if (source / HEAD_FILE).exists():
                shutil.copyfile(source / HEAD_FILE, dest / HEAD_FILE)
            else:
                (dest / HEAD_FILE).unlink(missing_ok=True)
    if ns.self_draft is not None:  # the target's self-draft module, where --drafter self finds it
        from quickdraft.model.self_draft import CONFIG_FILE, DEFAULT_DIR, WEIGHTS_FILE

        (dest_root / "target" / DEFAULT_DIR).mkdir(exist_ok=True)
        for file in (CONFIG_FILE, WEIGHTS_FILE):
            shutil.copyfile(ns.self_draft / file, dest_root / "target" / DEFAULT_DIR / file)
    if ns.target_dtype == "bf16":  # the draft stays fp32: it runs in fp32 on CPU (default_draft_dtype)
        import torch

        from quickdraft.model.weights import cast_saved_weights

        cast_saved_weights(dest_root / "target", torch.bfloat16)
    print(f"installed target ({ns.target_dtype}) and draft into {dest_root}")
    return 0


def _cmd_all(ns: argparse.Namespace) -> int:
    """The whole pipeline with default settings (about two hours on two CPU cores)."""
    from quickdraft.train.common import TrainArgs
    from quickdraft.train.corpus import build_corpus
    from quickdraft.train.distill import train_draft
    from quickdraft.train.evaluate import evaluate_pair
    from quickdraft.train.pretrain import train_target
    from quickdraft.train.tokenizer_train import build_tokenizer

    corpus, tokenizer, runs = ns.work / "data" / "corpus", ns.work / "data" / "tokenizer", ns.work / "runs"
    build_corpus(corpus)
    build_tokenizer(corpus, tokenizer)
    train_target(TrainArgs(out_dir=runs / "target", data_dir=corpus, lr=2e-3, max_steps=1600,
                           max_minutes=ns.target_minutes, threads=ns.threads, resume=ns.resume,
                           device=ns.device),
                 EMBEDDED_TARGET_SHAPE, tokenizer, exit_layer=2, exit_weight=0.3, copy_fraction=0.5)
    train_draft(TrainArgs(out_dir=runs / "draft", data_dir=corpus, lr=3e-3, max_steps=100_000,
                          max_minutes=ns.draft_minutes, checkpoint_minutes=3, threads=ns.threads, resume=ns.resume,
                          device=ns.device),
                EMBEDDED_DRAFT_SHAPE, runs / "target" / "final", n_generations=512, copy_fraction=0.5,
                induction_steps=800)
    report = evaluate_pair(runs / "target" / "final", runs / "draft" / "final", corpus, threads=ns.threads,
                           report_out=runs / "eval.json")
    print(json.dumps(report, indent=2))
    return 0


def add_train_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``train`` and its subcommands on the main CLI's subparsers."""
    train = subparsers.add_parser("train", help="train the embedded model pair offline (corpus → tokenizer → "
                                  "target → draft → eval)", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = train.add_subparsers(dest="train_command", metavar="{corpus,tokenizer,target,draft,self-draft,export,eval,install,all}")
    train.set_defaults(func=lambda ns: (train.print_help(), 2)[1])

    p = sub.add_parser("corpus", help="collect the Python standard library source into train/val JSONL")
    p.add_argument("--out", type=Path, default=Path("data/corpus"))
    p.add_argument("--root", type=Path, default=None, help="default: this interpreter's stdlib (sysconfig)")
    p.add_argument("--limit-files", type=int, default=None, help="first N files only (smoke tests)")
    p.set_defaults(func=_cmd_corpus)

    p = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer and tokenize the corpus")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--out", type=Path, default=Path("data/tokenizer"))
    p.add_argument("--vocab-size", type=int, default=8192)
    p.set_defaults(func=_cmd_tokenizer)

    p = sub.add_parser("target", help="pretrain the target (Llama) with an early-exit loss")
    _add_loop_flags(p, batch_size=16, lr=2e-3, max_steps=1600)
    p.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    _add_shape_flags(p, EMBEDDED_TARGET_SHAPE)
    p.add_argument("--block-size", type=int, default=TARGET_BLOCK_SIZE)
    p.add_argument("--exit-layer", type=int, default=2, help="early-exit layer L (0: no early-exit loss)")
    p.add_argument("--exit-weight", type=float, default=0.3)
    p.add_argument("--copy-fraction", type=float, default=0.5,
                   help="share of each batch that repeats an earlier span (teaches copying; 0: plain corpus)")
    p.add_argument("--init-from", type=Path, default=None, metavar="DIR",
                   help="continue training this target model directory (fresh optimizer and schedule)")
    p.set_defaults(func=_cmd_target)

    p = sub.add_parser("draft", help="distil a draft model from any target (KL on your text + target generations)")
    _add_loop_flags(p, batch_size=16, lr=3e-3, max_steps=3000, text_data=True)
    p.add_argument("--target", default="runs/target/final", help="a model directory or hub id")
    _add_shape_flags(p, None)
    p.add_argument("--generated-fraction", type=float, default=0.5, help="share of each batch from target generations")
    p.add_argument("--generations", type=int, default=1024, help="number of target greedy generations to train on")
    p.add_argument("--copy-fraction", type=float, default=0.0,
                   help="share of the corpus windows that repeat an earlier span (for a target that copies)")
    p.add_argument("--induction-steps", type=int, default=0,
                   help="first train the draft this many steps to copy repeated random tokens (forms the copying "
                   "circuit a small draft of a copying target needs; ~800 suits the embedded draft; 0: off)")
    _add_sampled_objective_flags(p)
    p.add_argument("--head-tokens", type=int, default=None,
                   help="the saved draft drafts over this many of its most frequent tokens (OUT/final/draft_head.json; "
                   "default: a quarter of the vocabulary, >= 1,024; 0: over the whole vocabulary)")
    p.add_argument("--head-loss", action="store_true",
                   help="train q over that head, as the draft drafts (the --init-from draft's head when it has one "
                   "of that size, else the stream's most frequent tokens); default: over the whole vocabulary")
    p.add_argument("--regenerate", action="store_true", help="discard OUT/generations*.npy and generate anew "
                   "(after --resume against a newer target)")
    p.add_argument("--init-from", type=Path, default=None, metavar="DIR",
                   help="fine-tune: start from the weights of this draft model dir (e.g. runs/draft/final) with a "
                   "fresh LR schedule (a lower --lr, e.g. 1e-3, suits); --resume from OUT/checkpoint.pt still wins")
    p.set_defaults(func=_cmd_draft)

    p = sub.add_parser("self-draft", help="train a self-draft for any target: its first layers + an exit adapter "
                       "(default), or a feature draft on its last hidden states (--drafter self:OUT)",
                       description="Trains a self-draft module for a frozen target on your text, tokenized with the "
                       "target's tokenizer: a feature draft (model/feature_draft.py: one layer on the target's "
                       "last hidden states, EAGLE-style) or an exit adapter (model/self_draft.py). OUT gets "
                       "self_draft.json + model.safetensors (the module), checkpoint.pt (--resume), history.json "
                       "and the token streams.")
    _add_loop_flags(p, batch_size=8, lr=1e-3, max_steps=2000, text_data=True)
    p.add_argument("--target", required=True, help="the target: a model directory or hub id")
    p.add_argument("--kind", choices=("exit", "feature"), default="exit",
                   help="exit: the target's first layers plus an adapter (default: on the embedded target it "
                   "beats a feature draft of the same training time at T = 0.8, BENCHMARKS.md round 28); feature: "
                   "a draft layer on the target's last hidden states (no target layer runs while drafting)")
    p.add_argument("--mlp-size", type=int, default=None,
                   help="feature draft: its layer's MLP width (default: the target's; 0: attention only)")
    p.add_argument("--exit-layer", type=int, default=None,
                   help="target layers the draft runs first (exit adapter: default one in 16, at least one; "
                   "feature draft: default 0)")
    p.add_argument("--adapter-layers", type=int, default=1, help="trained decoder layers on top (default 1)")
    p.add_argument("--adapter-mlp", action=argparse.BooleanOptionalAction, default=True,
                   help="adapters with an MLP (default), or attention-only (--no-adapter-mlp, as Kangaroo's)")
    p.add_argument("--head-tokens", type=int, default=None,
                   help="rows of the draft's LM head: the most frequent tokens (default: a quarter of the vocabulary, "
                   ">= 1,024)")
    p.add_argument("--generated-fraction", type=float, default=0.5, help="share of each batch from target generations")
    p.add_argument("--generations", type=int, default=256, help="target greedy generations to train on")
    _add_sampled_objective_flags(p)
    p.add_argument("--init-from", type=Path, default=None, metavar="DIR",
                   help="train this saved self-draft of the target further (its shape and head kept; a fresh "
                   "optimizer and schedule); --resume from OUT/checkpoint.pt still wins")
    p.set_defaults(func=_cmd_self_draft)

    p = sub.add_parser("draft-head", help="count the tokens a draft model drafts over: its head cut to the most "
                       "frequent tokens of your text (no training; seconds)",
                       description="Tokenizes --data with the draft's tokenizer and saves the --head-tokens most "
                       "frequent tokens as DRAFT/draft_head.json (model/draft_head.py). The draft then drafts over "
                       "them only: a cheaper step, drafts accepted about as often, the output unchanged.")
    p.add_argument("--draft", required=True, help="the draft model: a directory (or hub id, with --out)")
    p.add_argument("--data", type=Path, nargs="+", required=True,
                   help="text files or directories (a corpus .jsonl's \"text\" fields; a token corpus directory)")
    p.add_argument("--head-tokens", type=int, default=None,
                   help="tokens the head keeps (default: a quarter of the vocabulary, >= 1,024)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="write draft_head.json here instead of beside the draft")
    p.set_defaults(func=_cmd_draft_head)

    p = sub.add_parser("eval", help="validation loss and greedy acceptance (draft and early exit)")
    p.add_argument("--target", type=Path, default=ASSETS / "target")
    p.add_argument("--draft", type=Path, default=ASSETS / "draft")
    p.add_argument("--data", type=Path, default=Path("data/corpus"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--prompts-out", type=Path, default=None, help="write the held-out prompts here (JSONL)")
    p.add_argument("--report", type=Path, default=None, help="write the figures here (JSON)")
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("export", help="write a Hugging Face model directory from a training checkpoint")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True, help="dir with tokenizer.json and tokenizer_config.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--exit-layer", type=int, default=0, help="early-exit layer to record in config.json")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("install", help="copy trained models into the package's assets/")
    p.add_argument("--target", type=Path, default=Path("runs/target/final"))
    p.add_argument("--draft", type=Path, default=Path("runs/draft/final"))
    p.add_argument("--pair", choices=tuple(EMBEDDED_PAIRS), default=DEFAULT_PAIR,
                   help="which embedded pair to replace (default: embedded, the default pair)")
    p.add_argument("--dest", type=Path, default=None, help="install here instead (DEST/target, DEST/draft)")
    p.add_argument("--self-draft", type=Path, default=None, metavar="DIR",
                   help="also install this self-draft (quickdraft train self-draft --out DIR) beside the target")
    p.add_argument("--target-dtype", choices=("bf16", "fp32"), default="bf16",
                   help="storage of the target's weights (bf16: both shipped pairs fit the 80 MB budget)")
    p.set_defaults(func=_cmd_install)

    p = sub.add_parser("all", help="the whole pipeline with default settings")
    p.add_argument("--work", type=Path, default=Path("."))
    p.add_argument("--target-minutes", type=float, default=95)
    p.add_argument("--draft-minutes", type=float, default=20)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", help="cpu, or cuda to train on a GPU")
    p.add_argument("--resume", action="store_true")
    p.set_defaults(func=_cmd_all)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m quickdraft.train.cli ...``) for use before the main CLI wires it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="quickdraft")
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["train", *(argv if argv is not None else sys.argv[1:])])
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
