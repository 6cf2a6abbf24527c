"""Round 44. Packed weights on 2 MiB pages or on torch's 4 KiB ones: two engines in one process, one built with huge
pages refused, arms alternating; the demo's prompt, 160 tokens, greedy; plain decoding and speculation with DRAFTER
(default: the demo's, prompt lookup then the draft model; `self` for the self-draft).

    .venv/bin/python docs/bench/round44/huge_pages_ab.py THREADS REPS [DRAFTER]
"""
import statistics, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from quickdraft import huge_pages
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.demo import DEMO_PROMPT, MAX_NEW_TOKENS
from quickdraft.engine import Engine
from quickdraft.sampling import GREEDY

drafter = sys.argv[3] if len(sys.argv) > 3 else f"prompt-lookup+{default_draft_path()}"
engines = {}
offered = huge_pages.huge_pages_available
for arm in ("4k", "2m"):
    huge_pages.huge_pages_available = offered if arm == "2m" else (lambda: False)
    engines[arm] = Engine(default_target_path(), drafter, exact=True, dtype="auto", compile_drafter=True)
    engines[arm].generate(DEMO_PROMPT, 16, gamma="auto")
huge_pages.huge_pages_available = offered
weights = {arm: [t for t in e.model.native.weights if t.numel() > 1000] for arm, e in engines.items()}
print("target products on huge pages:", {arm: sum(huge_pages.huge_page_bytes(t) > 0 for t in w) for arm, w in weights.items()},
      "of", len(weights["2m"]), f"(threads {torch.get_num_threads()}, drafter {drafter})")
reference = {}
for rep in range(int(sys.argv[2])):
    rates = {(arm, g): [] for arm in engines for g in (0, "auto")}
    for r in range(6):
        order = [(arm, g) for arm in engines for g in (0, "auto")]
        for arm, g in (order if r % 2 == 0 else order[::-1]):
            result = engines[arm].generate(DEMO_PROMPT, MAX_NEW_TOKENS, GREEDY, gamma=g)
            assert reference.setdefault(g, result.token_ids) == result.token_ids
            rates[arm, g].append(result.stats.tokens_per_s)
    m = {k: statistics.median(v) for k, v in rates.items()}
    print(rep, f"plain 4k {m['4k', 0]:.0f} 2m {m['2m', 0]:.0f} ({m['2m', 0] / m['4k', 0]:.3f}) | speculative 4k "
          f"{m['4k', 'auto']:.0f} 2m {m['2m', 'auto']:.0f} ({m['2m', 'auto'] / m['4k', 'auto']:.3f})", flush=True)
