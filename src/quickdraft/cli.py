"""quickdraft generate | info | demo | serve | bench | train"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING

from quickdraft.errors import QuickdraftError

if TYPE_CHECKING:
    from quickdraft.threads import ThreadGovernor

log = logging.getLogger("quickdraft")

# Subcommands that live in their own packages: (module, function adding the parser).
PLUGGED_COMMANDS = (
    ("quickdraft.server.cli", "add_serve_parser"),
    ("quickdraft.bench.cli", "add_bench_parser"),
    ("quickdraft.train.cli", "add_train_parser"),
)


def tree_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tree takes a node count such as 16, or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--tree needs at least 1 node, got {value}")
    return value


def gamma_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be an integer >= 0 or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"gamma must be >= 0 (0 = plain decoding), got {value}")
    return value


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Target / drafter / dtype / device flags shared by generate, serve and bench."""
    parser.add_argument("--target", help="model directory, hub repo id, or an embedded pair: embedded (the default) "
                        "or embedded-copy (copies its context: for input-grounded work and prompt lookup)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--draft", help="draft model directory or hub repo id (same vocabulary as the target)")
    group.add_argument("--drafter", help="self[:PATH] (a trained self-draft; default PATH: TARGET/self_draft) | "
                       "early-exit[:L] | prompt-lookup[:n] | a draft model path | prompt-lookup+SPEC: lookup where "
                       "the context matches, the model drafter SPEC elsewhere (prompt-lookup+ alone: the embedded "
                       "pair's draft). Default on an embedded pair: prompt-lookup+ (--draft PATH for its draft alone)")
    group.add_argument("--no-draft", action="store_true",
                       help="no drafter: plain decoding (the baseline speculation is measured against)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="the target's dtype; auto (default): bf16 on hardware with bf16 dot products "
                        "(AVX512-BF16/AMX CPUs, recent GPUs) or where quickdraft's CPU kernels run (AVX2), "
                        "else fp32")
    parser.add_argument("--draft-dtype", choices=["fp32", "bf16", "fp16"],
                        help="a draft model's dtype (default: fp32 on CPU, where a small draft runs faster "
                        "in fp32; the target's dtype elsewhere)")
    parser.add_argument("--full-draft-head", action="store_true",
                        help="a draft model drafts over its whole vocabulary, not over the most frequent tokens "
                        "saved beside it in draft_head.json (quickdraft train draft-head; the embedded drafts have "
                        "one: a cheaper draft step, the output unchanged)")
    parser.add_argument("--quantized-draft", action=argparse.BooleanOptionalAction, default=True,
                        help="a draft model's, self-draft's or early exit's weight products quantised on CPUs with "
                        "AVX-512 VNNI, where quickdraft's kernels run its whole forward: a draft model's layers int8, "
                        "a self-draft's and early exit's int4, heads int8 (early exit then drafts with a cache of its "
                        "own); only the guesses change, the output stays the target's (default: on)"),
    parser.add_argument("--target-bits", type=int, choices=[8],
                        help="8: the target's own weight products int8 (CPUs with AVX-512 VNNI): plain and speculative "
                        "decoding both run this quantised target, exact relative to it, not to its bf16 weights "
                        "(embedded target: 2.3-2.8x faster plain decoding, perplexity +0.06%%; default: off)")
    parser.add_argument("--compile-drafter", action=argparse.BooleanOptionalAction,
                        help="torch.compile the draft model's steps: seconds of compilation at the first "
                        "request, then faster drafting (default: on for serve and bench, off for generate)")
    parser.add_argument("--compile-target", action=argparse.BooleanOptionalAction,
                        help="torch.compile the target's decode and verify steps, exact mode included (γ <= 4; "
                        "~12-19 s of compilation per row bucket and context-size bucket, then 1.5-3x faster steps "
                        "on CPU; default: on for bench, off elsewhere)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--no-exact", action="store_true", help="skip exact mode's fixed-row forwards (faster, "
                        "greedy output may then differ from plain decoding on near-ties)")


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: $QUICKDRAFT_THREADS, else the cores not busy with "
                        "other processes at start-up, at most torch's default)")


def embedded_default_drafter(target: str) -> str | None:
    """An embedded pair's default drafter: prompt lookup where the context matches, its draft elsewhere
    (round 30, six paired runs: greedy +10-27% over the draft alone, T = 0.8 level with it; batched under
    load the same within noise; BENCHMARKS.md). None for any other target."""
    from quickdraft.assets import embedded_draft_for

    draft = embedded_draft_for(target)
    return None if draft is None else f"prompt-lookup+{draft}"


def resolve_target_and_drafter(args: argparse.Namespace) -> tuple[str, str | None]:
    """(target, drafter): an embedded target (the default, or one named by --target) brings its own
    pair's draft, behind prompt lookup (``prompt-lookup+DRAFT``), unless a drafter is given."""
    from quickdraft.assets import default_target_path, embedded_draft_for

    drafter = args.draft or args.drafter
    target = args.target or default_target_path()
    if args.__dict__.get("no_draft"):
        return target, None
    if drafter is None and args.__dict__.get("default_draft", True):
        drafter = embedded_default_drafter(target)
    elif drafter is not None and drafter.endswith("+") and embedded_draft_for(target) is not None:
        drafter += str(embedded_draft_for(target))  # "prompt-lookup+": the embedded pair's own draft after lookup
    return target, drafter


def apply_threads(args: argparse.Namespace | None = None) -> ThreadGovernor | None:
    """--threads, else $QUICKDRAFT_THREADS, else the cores free at start-up (quickdraft/threads.py);
    in that last case, also a governor that keeps following the free cores while an engine decodes
    (``Engine.follow_free_cores``)."""
    import os

    import torch

    from quickdraft.threads import ThreadGovernor, default_threads

    threads = getattr(args, "threads", None) or os.environ.get("QUICKDRAFT_THREADS")
    if threads:
        if int(threads) < 1:
            raise QuickdraftError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
        return None
    ceiling = torch.get_num_threads()
    torch.set_num_threads(default_threads(ceiling))
    return ThreadGovernor(ceiling)


def build_engine(args: argparse.Namespace):
    from quickdraft.engine import Engine

    governor = apply_threads(args)

    target, drafter = resolve_target_and_drafter(args)
    engine = Engine(target, drafter, exact=not args.no_exact, dtype=args.dtype, device=args.device,
                    draft_dtype=args.draft_dtype, compile_drafter=bool(args.compile_drafter),
                    compile_target=bool(args.compile_target), tree_nodes=getattr(args, "tree", None),
                    full_draft_head=bool(getattr(args, "full_draft_head", False)),
                    quantized_draft=bool(getattr(args, "quantized_draft", True)),
                    target_bits=getattr(args, "target_bits", None))
    engine.follow_free_cores(governor)
    return engine


def cmd_generate(args: argparse.Namespace) -> int:
    from quickdraft.resources import peak_rss_bytes
    from quickdraft.sampling import SamplingParams

    engine = build_engine(args)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                              rule=args.sampling_rule, presence_penalty=args.presence_penalty,
                              frequency_penalty=args.frequency_penalty)
    gamma = args.gamma if engine.drafter is not None else 0
    if args.json:
        result = engine.generate(args.prompt, args.max_new_tokens, sampling, gamma, args.stop)
        stats = result.stats.to_dict() | {"peak_rss_bytes": peak_rss_bytes()}
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
                          "stats": stats}))
        return 0
    result = None
    for event in engine.stream(args.prompt, args.max_new_tokens, sampling, gamma, args.stop):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        result = event.result
    assert result is not None
    s = result.stats
    print(file=sys.stdout)
    print(
        f"[{s.generated_tokens} tokens, {s.tokens_per_s:.1f} tokens/s, drafter {s.drafter or 'none'}, "
        f"acceptance {s.acceptance_rate:.2f}, {s.mean_accepted_length:.2f} tokens per target call]",
        file=sys.stderr,
    )
    return 0


def _warm_runtime() -> None:
    """Pay torch's one-time costs (the first model built on the meta device takes ~70 MB of
    library state) so that what loading adds can be compared with the weights."""
    import torch

    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer

    tiny = ModelConfig(model_type="llama", vocab_size=8, n_embd=8, n_layer=1, n_head=1, n_kv_head=1, head_dim=8,
                       intermediate_size=8, block_size=8, norm_eps=1e-6, tie_word_embeddings=True)
    with torch.device("meta"):
        Transformer(tiny)


def cmd_info(args: argparse.Namespace) -> int:
    from quickdraft.assets import default_target_path
    from quickdraft.model.loader import load_model
    from quickdraft.resources import current_rss_bytes, peak_rss_bytes

    _warm_runtime()
    baseline = current_rss_bytes()  # the interpreter, torch and its one-time set-up, before any model
    loaded = load_model(args.model or default_target_path(), dtype=args.dtype)
    c = loaded.config
    info = {
        "path": str(loaded.path),
        "architecture": c.model_type,
        "parameters": loaded.n_params,
        "vocab_size": c.vocab_size,
        "tokenizer_vocab_size": loaded.tokenizer.vocab_size if loaded.tokenizer else None,
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "context_length": c.block_size,
        "layers": c.n_layer,
        "hidden_size": c.n_embd,
        "heads": c.n_head,
        "kv_heads": c.n_kv_head,
        "weight_bytes": loaded.weight_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
        "runtime_rss_bytes": baseline,
        # what loading added to the process: compare with weight_bytes (weights are held once)
        "rss_added_by_loading_bytes": current_rss_bytes() - baseline,
    }
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:>22}: {value}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from quickdraft.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quickdraft", description="Lossless speculative decoding.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt")
    add_model_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, help="with a seed the same command prints the same text, whatever γ "
                     "and drafter (the coupled rule: identical to seeded plain decoding)")
    gen.add_argument("--sampling-rule", default="auto",
                     help="how sampled drafts are verified: coupled (reproducible per seed), rejection "
                     "(min(1, p/q): accepts a little more often), or auto (default: coupled when --seed is given)")
    gen.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                     help="subtract P (in [-2, 2]) from the logit of every token already generated (as OpenAI's)")
    gen.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                     help="subtract F (in [-2, 2]) per time a token was already generated (as OpenAI's): "
                     "0.3-0.5 curbs a small model's loops; the output stays the penalized target's own, exactly")
    gen.add_argument("--gamma", type=gamma_arg, default="auto",
                     help="draft length: an integer (0 = plain decoding) or 'auto'")
    gen.add_argument("--tree", type=tree_arg, metavar="NODES",
                     help="speculate with token trees of NODES draft tokens per step (e.g. 16) instead of "
                     "chains of --gamma tokens: the drafter's likely alternatives are verified in the same forward; "
                     "'auto' measures chains and trees of 4, 8 and 16 nodes as it goes and runs the fastest")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    add_threads_arg(gen)
    gen.set_defaults(func=cmd_generate, default_draft=True)

    info = sub.add_parser("info", help="describe a model")
    info.add_argument("model", nargs="?", help="model directory or hub repo id (default: the embedded model)")
    info.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_info)

    demo = sub.add_parser("demo", help="speculative generation on the embedded model pair")
    demo.set_defaults(func=cmd_demo)

    for module_name, function_name in PLUGGED_COMMANDS:
        try:
            add: Callable[[argparse._SubParsersAction], None] = getattr(import_module(module_name), function_name)
        except ModuleNotFoundError as exc:
            if exc.name and not module_name.startswith(exc.name):
                raise
            continue
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except QuickdraftError as exc:
        print(f"quickdraft: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
