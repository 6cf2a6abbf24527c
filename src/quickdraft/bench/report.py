"""Bench output: JSON, a Markdown table, PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CLOCK_NAMES = {"wall": "wall-clock time", "cpu": "the process's CPU time (the machine was shared)"}

COLUMNS = (
    ("method", "method"), ("decoding", "decoding"), ("rule", "rule"), ("tokens/s", "tokens_per_s"), ("speedup", "speedup"),
    ("speedup by prompt kind", "speedup_by_kind"), ("α", "alpha"), ("accepted/drafted", "acceptance_rate"), ("tokens/call", "mean_accepted_length"),
    ("mean γ", "gamma_mean"), ("c", "cost"), ("verify cost", "verify_cost"), ("bound", "bound"),
    ("efficiency", "efficiency"), ("bound (verify cost)", "bound_with_verify_cost"), ("= plain", "equals_plain_fraction"), ("per-position acceptance", "per_position_acceptance"),
)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key == "speedup_by_kind":
        return " · ".join(f"{kind} {v:.2f}×" for kind, v in value.items()) or "–"
    if key == "per_position_acceptance":
        return " ".join("–" if v is None else f"{v:.2f}" for v in value)
    if key == "equals_plain_fraction":
        return "yes" if value == 1 else f"{value:.0%}"
    if key == "speedup":
        return f"{value:.2f}×"
    if key == "tokens_per_s":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def markdown_table(report: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in report["results"]:
        lines.append("| " + " | ".join(_fmt(k, row.get(k)) for _, k in COLUMNS) + " |")
    return "\n".join(lines)


def markdown_report(report: dict[str, Any], command: str | None = None) -> str:
    s, m = report["settings"], report["machine"]
    t, d = report["target"], report["draft"]
    out = []
    if command:
        out.append(f"Command: `{command}`\n")
    out.append(f"Machine: {m['cpu']}, {m['cpus']} CPUs, torch {m['torch']} ({m['torch_threads']} threads), "
               f"quickdraft kernels: {m.get('kernels') or 'none'}, "
               f"transformers {m.get('transformers') or 'not installed'}, Python {m['python']}.")
    out.append(f"Target: {t['parameters'] / 1e6:.1f}M parameters ({t['layers']} layers, width {t['hidden_size']}); "
               + (f"draft: {d['parameters'] / 1e6:.2f}M ({d['layers']} layers, width {d['hidden_size']}"
                  + (f"; drafting over the {d['head_tokens']:,} most frequent of its {d['vocab_size']:,} tokens"
                     if d.get("head_tokens") else "") + ")." if d else
                  "no draft model."))
    kinds: dict[str, int] = {}
    for p in report["prompts"]:
        kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
    out.append(f"{len(report['prompts'])} prompts ({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
               f"{s['max_new_tokens']} new tokens each (EOS ignored), target {s['dtype']}"
               + (" with int8 weight products (--target-bits 8: plain decoding runs the same int8 target)"
                  if s.get("target_bits") == 8 else "")
               + (" (native forwards)" if s.get("native_forwards")
                  else " (compiled target steps)" if s.get("compile_target") else "")
               + (f", draft {s.get('draft_dtype')}{' compiled' if s.get('compile_drafter') else ''}" if d else "")
               + (", the drafts' weight products quantised (draft model int8; self-draft and early exit "
                  "layers int4; heads int8)" if s.get("quantized_products") else "")
               + f", {s['repeats']} measured rounds "
               f"after a warm-up; medians; tokens/s by {CLOCK_NAMES.get(s.get('clock', 'wall'))}. "
               f"The bench took {report['wall_seconds']:.0f} s.\n")
    headline = headline_lines(report.get("headline", {}))
    if headline:
        out.append("\n".join(headline) + "\n")
    out.append(markdown_table(report))
    out.append("\nspeedup: tokens/s over our plain decoding (exact mode off, 1-row forwards) with the same sampling "
               "parameters, in the same round, median over rounds. α: per-token acceptance probability, accepted / (accepted + rejections). "
               "c: drafter forward / plain 1-row target forward. verify cost: one verifying target forward / a "
               "plain 1-row forward (Leviathan's bound assumes 1). bound: (1 − α^(γ+1)) / ((1 − α)(γc + 1)) at the "
               "mean γ; efficiency = speedup / bound; bound (verify cost): the same with γc + verify cost below. "
               "= plain: greedy output identical to plain greedy of the same mode (exact vs exact).")
    for note in report.get("notes", []):
        out.append(f"\nNote: {note}")
    return "\n".join(out) + "\n"


def headline_lines(h: dict[str, Any]) -> list[str]:
    lines = []
    for decoding in ("greedy", "sampling"):
        label = "greedy" if decoding == "greedy" else "sampling"
        d = h.get(f"best_draft_{decoding}")
        if d:
            eff = f", efficiency {d['efficiency']:.2f}" if d.get("efficiency") is not None else ""
            lines.append(f"- {label}: best draft-model speculation **{d['speedup']:.2f}×** our plain decoding "
                         f"({d['method']}, {d['tokens_per_s']:.1f} tokens/s{eff})")
        e = h.get(f"best_draft_{decoding}_exact")
        if e:
            lines.append(f"- {label}, exact mode: {e['speedup']:.2f}× ({e['method']})")
        b = h.get(f"best_{decoding}")
        if b and (not d or b["method"] != d["method"]):
            lines.append(f"- {label}: best of all drafters {b['speedup']:.2f}× ({b['method']})")
        if f"vs_hf_assisted_{decoding}" in h:
            lines.append(f"- {label}: best draft-model tokens/s / transformers assisted generation = "
                         f"**{h[f'vs_hf_assisted_{decoding}']:.2f}×**")
        if f"plain_vs_hf_plain_{decoding}" in h:
            lines.append(f"- {label}: our plain / transformers plain tokens/s = {h[f'plain_vs_hf_plain_{decoding}']:.2f}×")
    for key, theirs in (("plain_vs_llama_cpp_plain", "llama.cpp plain"),
                        ("plain_exact_vs_llama_cpp_plain", "llama.cpp plain"),
                        ("draft_vs_llama_cpp_speculative", "llama.cpp speculative"),
                        ("draft_exact_vs_llama_cpp_speculative", "llama.cpp speculative")):
        if key in h:
            wall = f" (with our prefill: {h[key]['ratio_wall']:.2f}×)" if "ratio_wall" in h[key] else ""
            lines.append(f"- greedy: {h[key]['method']} / {theirs} tokens/s, decode only = "
                         f"**{h[key]['ratio']:.2f}×**{wall}")
    return lines


def write_outputs(report: dict[str, Any], out_dir: Path, command: str | None = None, plots: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "bench.json", out_dir / "bench.md"]
    written[0].write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    written[1].write_text(markdown_report(report, command))
    if plots:
        written += plot_speedup_vs_gamma(report, out_dir / "speedup_vs_gamma.png")
        written += plot_tokens_per_s(report, out_dir / "tokens_per_s.png")
    return written


def plot_speedup_vs_gamma(report: dict[str, Any], path: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["family"] == "draft" and not r["exact"]]
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for decoding, colour in (("greedy", "tab:blue"), (None, "tab:orange")):
        group = [r for r in rows if (r["decoding"] == "greedy") == (decoding == "greedy")]
        fixed = sorted((r for r in group if isinstance(r["gamma"], int)), key=lambda r: r["gamma"])
        label = group[0]["decoding"] if group else ""
        if fixed:
            ax.plot([r["gamma"] for r in fixed], [r["speedup"] for r in fixed], "o-", color=colour,
                    label=f"measured, {label}")
            ax.plot([r["gamma"] for r in fixed], [r["bound"] or float("nan") for r in fixed], "s--", color=colour,
                    alpha=0.6, label=f"bound, {label}")
            ax.plot([r["gamma"] for r in fixed], [r.get("bound_with_verify_cost") or float("nan") for r in fixed],
                    "^:", color=colour, alpha=0.6, label=f"bound with measured verify cost, {label}")
            ax.set_xticks(sorted({r["gamma"] for r in rows if isinstance(r["gamma"], int)}))
        for r in group:
            if r["gamma"] == "auto":
                ax.axhline(r["speedup"], color=colour, linestyle=":", label=f"auto γ, {label}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("Draft-model speculation: measured vs Leviathan bound")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return [path]


def plot_tokens_per_s(report: dict[str, Any], path: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if not (r["family"] == "draft" and isinstance(r["gamma"], int))]
    # keep the best fixed γ per decoding as well
    for decoding in {r["decoding"] for r in report["results"]}:
        fixed = [r for r in report["results"] if r["family"] == "draft" and isinstance(r["gamma"], int)
                 and r["decoding"] == decoding]
        if fixed:
            rows.append(max(fixed, key=lambda r: r["tokens_per_s"]))
    rows.sort(key=lambda r: (r["decoding"] != "greedy", r["peer"], r["method"]))
    fig, ax = plt.subplots(figsize=(7.2, 0.32 * len(rows) + 1.2), dpi=100)
    colours = ["tab:grey" if r["peer"] else ("tab:green" if r["family"] == "plain" else "tab:blue") for r in rows]
    y = list(range(len(rows)))[::-1]
    ax.barh(y, [r["tokens_per_s"] for r in rows], color=colours)
    ax.set_yticks(y, [r["method"] for r in rows], fontsize=8)
    for yi, r in zip(y, rows):
        ax.text(r["tokens_per_s"], yi, f" {r['tokens_per_s']:.0f} ({r['speedup']:.2f}×)", va="center", fontsize=7)
    ax.set_xlabel("tokens/s (median)")
    ax.set_title("tokens/s per method (blue: quickdraft speculative, green: plain, grey: transformers)", fontsize=9)
    ax.margins(x=0.2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return [path]
