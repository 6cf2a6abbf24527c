"""`quickdraft bench`: the benchmark from the command line."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from quickdraft.bench.llama_cpp import ENV_VAR as LLAMA_CPP_ENV


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,4, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every γ must be >= 1, got {text!r}")
    return values


def _tree_list(text: str) -> tuple[int | str, ...]:
    if text.strip() == "0":
        return ()
    auto = tuple(v.strip() for v in text.split(",") if v.strip() == "auto")
    return _int_list(",".join(v for v in text.split(",") if v.strip() != "auto")) + auto


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    from quickdraft.cli import add_model_args

    p = subparsers.add_parser(
        "bench", help="benchmark plain vs speculative decoding vs transformers on the same weights",
        description="Runs every configuration in one process on a shipped prompt set (warm-up, then rounds; "
                    "medians), and writes bench.json, bench.md and PNG plots to --out.")
    add_model_args(p)
    p.add_argument("--quick", action="store_true", help="a short run (< 3 minutes on 2 CPU cores)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output directory (default: bench-out)")
    p.add_argument("--prompts", help="JSONL of {\"id\", \"kind\", \"prompt\"} (default: the shipped set)")
    p.add_argument("--prompt-limit", type=int, help="use only the first N prompts (kinds interleaved)")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--repeats", type=int, help="measured rounds after the warm-up")
    p.add_argument("--gammas", type=_int_list, help="fixed γ values for greedy draft-model runs, e.g. 1,2,4")
    p.add_argument("--sampling-gammas", type=_int_list, help="fixed γ values for sampling runs")
    p.add_argument("--trees", type=_tree_list, help="token-tree node budgets to run beside the chains, "
                   "'auto' among them (default 16; 0 for chains only)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    p.add_argument("--max-gamma", type=int, help="the engines' max_gamma (default 8); exact mode's row bucket "
                   "is at least max_gamma + 1")
    p.add_argument("--no-peers", action="store_true", help="skip transformers' generate()")
    p.add_argument("--llama-cpp", metavar="DIR", default=os.environ.get(LLAMA_CPP_ENV) or None,
                   help="also run llama.cpp (plain, and speculative with the draft) on GGUF conversions of the "
                        "embedded pair: DIR is what scripts/llama_cpp/build.sh built, with what "
                        f"scripts/llama_cpp/convert.sh wrote (default: ${LLAMA_CPP_ENV})")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="time tokens/s by wall clock (default) or by this process's CPU time (on a machine "
                        "shared with other work; use with --threads 1)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_bench, default_draft=True, compile_drafter=True, compile_target=True)


def settings_from_args(args: argparse.Namespace):
    from quickdraft.assets import default_target_path, embedded_draft_for
    from quickdraft.bench.harness import BenchSettings

    from quickdraft.drafters.factory import lookup_and_model_specs

    early_exit, self_draft, prompt_lookup, draft = "early-exit", "self", "prompt-lookup", args.draft
    if args.drafter:
        lookup_then_model = lookup_and_model_specs(args.drafter)
        if lookup_then_model is not None:  # its rows: prompt lookup, the model drafter, and the two together
            prompt_lookup, model = lookup_then_model
            if model.partition(":")[0] == "self":
                self_draft = model
            else:
                draft = model or None
        elif args.drafter.startswith("early-exit"):
            early_exit = args.drafter
        elif args.drafter.partition(":")[0] == "self":
            self_draft = args.drafter
        elif args.drafter.startswith("prompt-lookup"):
            prompt_lookup = args.drafter
        else:
            draft = args.drafter
    target = args.target or default_target_path()
    draft = draft or embedded_draft_for(target)
    overrides = {k: v for k, v in dict(
        prompts=args.prompts, prompt_limit=args.prompt_limit, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, gammas=args.gammas, trees=args.trees, max_gamma=args.max_gamma, sampling_gammas=args.sampling_gammas, threads=args.threads,
    ).items() if v is not None}
    common = dict(target=target, draft=draft, dtype=args.dtype, draft_dtype=args.draft_dtype,
                  compile_drafter=bool(args.compile_drafter), compile_target=bool(args.compile_target),
                  full_draft_head=bool(args.full_draft_head), quantized_draft=bool(args.quantized_draft), device=args.device,
                  target_bits=args.target_bits,
                  exact=not args.no_exact,
                  early_exit=early_exit, self_draft=self_draft, prompt_lookup=prompt_lookup, peers=not args.no_peers, llama_cpp=args.llama_cpp,
                  temperature=args.temperature, seed=args.seed, clock=args.clock, **overrides)
    return BenchSettings.quick(**common) if args.quick else BenchSettings(**common)


def cmd_bench(args: argparse.Namespace) -> int:
    from quickdraft.bench.harness import run_bench
    from quickdraft.bench.report import markdown_report, write_outputs

    settings = settings_from_args(args)
    report = run_bench(settings, progress=sys.stderr.isatty())
    command = "quickdraft " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else None
    written = write_outputs(report, args.out, command, plots=not args.no_plots)
    print(markdown_report(report, command))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0
