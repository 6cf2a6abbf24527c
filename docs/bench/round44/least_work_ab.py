"""Round 44. The demo's workload (2 threads) with the kernels' least work per thread at several values, arms alternating
in one process.

    .venv/bin/python docs/bench/round44/least_work_ab.py REPS VALUE... [--drafter SPEC]

Default drafter: the demo's (prompt lookup then the draft model). Outputs are asserted identical across values."""
import sys, statistics, torch
torch.set_num_threads(2)
from quickdraft import kernels
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.demo import DEMO_PROMPT, DEMO_SAMPLING, MAX_NEW_TOKENS
from quickdraft.sampling import GREEDY
args = sys.argv[2:]
drafter = args[args.index("--drafter") + 1] if "--drafter" in args else f"prompt-lookup+{default_draft_path()}"
values = [int(v) for v in args[:args.index("--drafter")]] if "--drafter" in args else [int(v) for v in args]
e = Engine(default_target_path(), drafter, exact=True, dtype="auto", compile_drafter=True)
e.generate(DEMO_PROMPT, 16, gamma="auto")
ref = {}
for rep in range(int(sys.argv[1])):
    out = []
    for name, s in (("greedy", GREEDY), ("sampled", DEMO_SAMPLING)):
        rates = {(v, g): [] for v in values for g in (0, "auto")}
        for r in range(6):
            order = [(v, g) for v in values for g in (0, "auto")]
            for v, g in (order if r % 2 == 0 else order[::-1]):
                kernels.set_min_task_work(v)
                res = e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, s, gamma=g)
                assert ref.setdefault((name, g), res.token_ids) == res.token_ids
                rates[v, g].append(res.stats.tokens_per_s)
        m = {k: statistics.median(x) for k, x in rates.items()}
        base = values[0]
        out.append(name + " " + " ".join(f"[{v}: plain {m[v,0]:.0f} ({m[v,0]/m[base,0]:.3f}) spec {m[v,'auto']:.0f} ({m[v,'auto']/m[base,'auto']:.3f})]" for v in values))
    print(rep, " | ".join(out), flush=True)
