"""Round 44 (needs docs/bench/round44/dynamic_tasks.patch applied: measured and not kept). The demo's workload at 2 threads with the kernels' shared calls split in equal shares (torch's parallel_for)
or taken a chunk at a time (dynamic), arms alternating in one process; outputs asserted identical.

    .venv/bin/python docs/bench/round44/dynamic_tasks_ab.py REPS
"""
import statistics, sys, torch
torch.set_num_threads(2)
from quickdraft import kernels
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.demo import DEMO_PROMPT, DEMO_SAMPLING, MAX_NEW_TOKENS
from quickdraft.engine import Engine
from quickdraft.sampling import GREEDY

e = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto", compile_drafter=True)
e.generate(DEMO_PROMPT, 16, gamma="auto")
reference = {}
for rep in range(int(sys.argv[1])):
    line = []
    for name, sampling in (("greedy", GREEDY), ("sampled", DEMO_SAMPLING)):
        rates = {(arm, g): [] for arm in ("static", "dynamic") for g in (0, "auto")}
        for r in range(6):
            order = [(arm, g) for arm in ("static", "dynamic") for g in (0, "auto")]
            for arm, g in (order if r % 2 == 0 else order[::-1]):
                kernels.set_dynamic_tasks(arm == "dynamic")
                result = e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, sampling, gamma=g)
                assert reference.setdefault((name, g), result.token_ids) == result.token_ids
                rates[arm, g].append(result.stats.tokens_per_s)
        m = {k: statistics.median(v) for k, v in rates.items()}
        line.append(f"{name} plain {m['static', 0]:.0f} -> {m['dynamic', 0]:.0f} ({m['dynamic', 0] / m['static', 0]:.3f}), "
                    f"speculative {m['static', 'auto']:.0f} -> {m['dynamic', 'auto']:.0f} "
                    f"({m['dynamic', 'auto'] / m['static', 'auto']:.3f})")
    print(rep, " | ".join(line), flush=True)
kernels.set_dynamic_tasks(True)
