"""The CUDA path end to end, on a GPU machine (`device` lends one to some sessions; CI has none).

For the default pair, in fp32 and bf16, exact mode: every drafter's greedy output against plain
greedy decoding on the same engine, bit for bit; token trees; the batched scheduler against each
prompt decoded alone; a seeded sample alone and beside neighbours. Then speed, as ratios in one
process: plain vs chains vs trees. Each section records its failure and the next one runs.

    python docs/bench/cuda_check.py --device cuda --out cuda_check.json
    python docs/bench/cuda_check.py --device cpu --prompts 2 --tokens 16   # the same script, here
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import LoadedModel, load_model
from quickdraft.sampling_params import SamplingParams

DRAFTERS = ("draft", "self", "early-exit", "prompt-lookup")


def engine_for(target: LoadedModel, drafter: str | None, dtype: str, device: str, **options: object) -> Engine:
    spec = embedded_draft_for(default_target_path()) if drafter == "draft" else drafter
    engine = Engine(target, spec, exact=True, dtype=dtype, device=device, **options)  # type: ignore[arg-type]
    engine.eos_token_ids = frozenset()  # every request runs its whole budget
    return engine


def section(report: dict[str, object], name: str, body: Callable[[], object]) -> None:
    start = time.perf_counter()
    try:
        report[name] = {"result": body(), "seconds": round(time.perf_counter() - start, 1)}
    except Exception:  # noqa: BLE001 - a failing section is the finding; the others still run
        report[name] = {"error": traceback.format_exc(limit=6), "seconds": round(time.perf_counter() - start, 1)}
    print(name, json.dumps(report[name])[:600], flush=True)


def greedy_exactness(target: LoadedModel, prompts: list[list[int]], n: int, dtype: str, device: str) -> dict:
    out: dict[str, object] = {}
    for drafter in DRAFTERS:
        engine = engine_for(target, drafter, dtype, device)
        plain = [engine.generate(p, n, gamma=0).token_ids for p in prompts]
        rows = {}
        for gamma in (4, "auto"):
            spec = [engine.generate(p, n, gamma=gamma) for p in prompts]
            rows[str(gamma)] = {"identical": sum(s.token_ids == t for s, t in zip(spec, plain)),
                                "acceptance": round(statistics.mean(s.stats.acceptance_rate for s in spec), 3)}
        out[drafter] = {"exact_mode": engine.exact, "prompts": len(prompts), **rows}
    return out


def trees(target: LoadedModel, prompts: list[list[int]], n: int, dtype: str, device: str) -> dict:
    engine = engine_for(target, "draft", dtype, device, tree_nodes=16)
    plain = [engine.generate(p, n, gamma=0).token_ids for p in prompts]
    tree = [engine.generate(p, n, gamma=4) for p in prompts]
    return {"exact_mode": engine.exact, "tree_kept": engine.tree_shape is not None,
            "identical": sum(t.token_ids == p for t, p in zip(tree, plain)), "prompts": len(prompts),
            "tokens_per_target_call": round(statistics.mean(t.stats.mean_accepted_length for t in tree), 2)}


def batched(target: LoadedModel, prompts: list[list[int]], n: int, dtype: str, device: str) -> dict:
    engine = engine_for(target, "draft", dtype, device)
    many = (prompts * 4)[:16]
    alone = [engine.generate(p, n, gamma=4).token_ids for p in many]
    together = engine.generate_batch(many, n)
    seeded = SamplingParams(temperature=0.8, seed=7)
    lone = engine.generate_batch([many[0]], n, sampling=seeded)[0].token_ids
    neighbours = many[:8]
    crowd = engine.generate_batch(neighbours, n, sampling=[seeded] + [SamplingParams(temperature=1.0)] * (len(neighbours) - 1))
    crowd = crowd[0].token_ids
    return {"greedy_identical_to_alone": sum(t.token_ids == a for t, a in zip(together, alone)),
            "requests": len(many), "seeded_same_with_neighbours": lone == crowd}


def sampling(target: LoadedModel, prompts: list[list[int]], n: int, dtype: str, device: str) -> dict:
    """Seeded sampling: the coupled rule gives plain seeded sampling's tokens; the rejection rule runs."""
    engine = engine_for(target, "draft", dtype, device)
    out: dict[str, object] = {}
    for name, params in (("t0.8", SamplingParams(temperature=0.8, seed=11)),
                         ("t1_topk20_topp0.9", SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=12))):
        plain = [engine.generate(p, n, gamma=0, sampling=params).token_ids for p in prompts]
        coupled = [engine.generate(p, n, gamma=4, sampling=params) for p in prompts]
        rejection = [engine.generate(p, n, gamma=4, sampling=SamplingParams(temperature=params.temperature,
                     top_k=params.top_k, top_p=params.top_p, seed=params.seed, rule="rejection")) for p in prompts]
        out[name] = {"coupled_identical_to_plain": sum(c.token_ids == t for c, t in zip(coupled, plain)),
                     "coupled_acceptance": round(statistics.mean(c.stats.acceptance_rate for c in coupled), 3),
                     "rejection_acceptance": round(statistics.mean(r.stats.acceptance_rate for r in rejection), 3),
                     "prompts": len(prompts)}
    return out


def speed(target: LoadedModel, prompts: list[list[int]], n: int, dtype: str, device: str, repeats: int) -> dict:
    arms: dict[str, tuple[Engine, dict[str, object]]] = {
        "plain": (engine_for(target, "draft", dtype, device), {"gamma": 0}),
        "chain_auto": (engine_for(target, "draft", dtype, device), {"gamma": "auto"}),
        "chain_4": (engine_for(target, "draft", dtype, device), {"gamma": 4}),
        "tree_16": (engine_for(target, "draft", dtype, device, tree_nodes=16), {"gamma": 4}),
        "tree_32": (engine_for(target, "draft", dtype, device, tree_nodes=32), {"gamma": 4}),
        "self_auto": (engine_for(target, "self", dtype, device), {"gamma": "auto"}),
        "lookup_auto": (engine_for(target, "prompt-lookup", dtype, device), {"gamma": "auto"}),
    }
    rates: dict[str, list[float]] = {name: [] for name in arms}
    calls: dict[str, list[float]] = {name: [] for name in arms}
    for name, (engine, kwargs) in arms.items():  # warm-up
        engine.generate(prompts[0], 8, **kwargs)  # type: ignore[arg-type]
    for round_index in range(repeats):
        order = list(arms)[round_index % len(arms):] + list(arms)[:round_index % len(arms)]
        for name in order:
            engine, kwargs = arms[name]
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            results = [engine.generate(p, n, **kwargs) for p in prompts]  # type: ignore[arg-type]
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            rates[name].append(sum(len(r.token_ids) for r in results) / (time.perf_counter() - start))
            calls[name].append(statistics.mean(r.stats.mean_accepted_length for r in results))
    plain = statistics.median(rates["plain"])
    return {name: {"tokens_per_s": round(statistics.median(r), 1), "vs_plain": round(statistics.median(r) / plain, 3),
                   "tokens_per_target_call": round(statistics.median(calls[name]), 2)} for name, r in rates.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("cuda_check.json"))
    parser.add_argument("--sections", default="greedy,trees,batched,sampling,speed")
    ns = parser.parse_args()
    report: dict[str, object] = {"torch": torch.__version__, "device": ns.device,
                                 "device_name": torch.cuda.get_device_name() if ns.device.startswith("cuda") else "cpu"}
    for dtype in ("fp32", "bf16"):
        target = load_model(default_target_path(), dtype=dtype, device=ns.device)
        prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts(None, ns.prompts)]
        bodies = {"greedy": lambda: greedy_exactness(target, prompts, ns.tokens, dtype, ns.device),
                  "trees": lambda: trees(target, prompts, ns.tokens, dtype, ns.device),
                  "batched": lambda: batched(target, prompts, ns.tokens, dtype, ns.device),
                  "sampling": lambda: sampling(target, prompts, ns.tokens, dtype, ns.device),
                  "speed": lambda: speed(target, prompts, ns.tokens, dtype, ns.device, ns.repeats)}
        for name in ns.sections.split(","):
            section(report, f"{name}_{dtype}", bodies[name])
        ns.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if not any("error" in v for v in report.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
