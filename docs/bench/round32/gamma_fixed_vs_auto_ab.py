"""Auto γ against fixed γ for the default pair as `quickdraft generate` runs it, in one process.

    python docs/bench/round32/gamma_fixed_vs_auto_ab.py ROUNDS [REQUESTS] [ARMS] [DRAFT]
    (REQUESTS e.g. rejection,greedy; ARMS e.g. auto,2,3,4,5)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from arm_rounds import REQUESTS, print_speedups, product_engines, prompt_ids, speculative_rounds  # noqa: E402
from quickdraft.assets import default_draft_path  # noqa: E402

rounds = int(sys.argv[1])
which = sys.argv[2].split(",") if len(sys.argv) > 2 else ["rejection", "greedy"]
gammas = sys.argv[3].split(",") if len(sys.argv) > 3 else ["auto", "2", "3", "4", "5"]
spec = sys.argv[4] if len(sys.argv) > 4 else str(default_draft_path())
target, plain, engines = product_engines({"draft": spec})
arms = {g: (engines["draft"], g if g == "auto" else int(g)) for g in gammas}
for name in which:
    results = speculative_rounds(prompt_ids(target), plain, arms, REQUESTS[name], rounds)
    print(f"## {name}, {spec}, {rounds} rounds")
    print_speedups(results, list(arms))
