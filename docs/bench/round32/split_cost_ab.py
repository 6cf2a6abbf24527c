"""Auto γ planning the draft call's fixed cost apart from its steps ("split", the product) against the
same engine with the drafts' step times dropped (c from the whole call, no fixed cost: the planning
before round 32), in one process.

    python docs/bench/round32/split_cost_ab.py ROUNDS rejection,coupled,greedy [DRAFT]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from arm_rounds import REQUESTS, print_speedups, product_engines, prompt_ids, speculative_rounds  # noqa: E402
from quickdraft.assets import default_draft_path  # noqa: E402

rounds, which = int(sys.argv[1]), sys.argv[2].split(",")
spec = sys.argv[3] if len(sys.argv) > 3 else str(default_draft_path())
target, plain, engines = product_engines({"split": spec, "nosplit": spec})
drafter = engines["nosplit"].drafter
inner = drafter.model if hasattr(drafter, "lookup") else drafter  # behind prompt lookup, its model drafter
timed_propose = inner.propose


def untimed_propose(*args, **kwargs):
    draft = timed_propose(*args, **kwargs)
    draft.step_seconds = None
    return draft


inner.propose = untimed_propose
arms = {name: (engine, "auto") for name, engine in engines.items()}
for name in which:
    results = speculative_rounds(prompt_ids(target), plain, arms, REQUESTS[name], rounds)
    print(f"## {name}, {spec}, {rounds} rounds")
    print_speedups(results, list(arms))
    memory = engines["split"].acceptance_memory
    print("  split memory c, f:", {str(k): (round(c, 3), round(memory.fixed_costs.get(k, 0.0), 3))
                                   for k, c in memory.costs.items()})
