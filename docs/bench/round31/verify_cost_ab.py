"""prompt-lookup+draft: the choice with the engine's measured verify cost vs the constant 1.4, one process.

Ran at commit 6b701e4, where ``Engine._measured_verify_cost`` handed the engine's v(γ) to the lookup choice;
the next commit removed it (output: verify_cost_ab.md beside this file). Kept as the record of that measurement.
"""
import collections, random, statistics, sys, torch
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.drafters import lookup_then_model
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams
torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
target = load_model(default_target_path(), dtype="auto")
prompts = [p["prompt"] for p in load_prompts(None, 14)]
spec = f"prompt-lookup+{default_draft_path()}"
engines = {"plain": Engine(target, None, exact=False), "measured v": Engine(target, spec, exact=False),
           "constant v 1.4": Engine(target, spec, exact=False)}
engines["constant v 1.4"]._measured_verify_cost = lambda: None
steps = collections.Counter()
observe = lookup_then_model.LookupOrModel.observe
def counted(self, by_lookup, drafted, accepted):
    steps[by_lookup] += 1
    observe(self, by_lookup, drafted, accepted)
lookup_then_model.LookupOrModel.observe = counted
for name, e in engines.items():
    for s in (None, SamplingParams(0.8, seed=1)):
        e.generate(prompts[0], 32, s, gamma=0 if name == "plain" else "auto")
rates = collections.defaultdict(list); tot = collections.defaultdict(collections.Counter)
rng = random.Random(1)
for r in range(rounds):
    for label, temp in (("greedy", 0.0), ("T=0.8", 0.8)):
        names = list(engines); rng.shuffle(names)
        for name in names:
            steps.clear(); tokens = secs = 0.0
            for i, p in enumerate(prompts):
                st = engines[name].generate(p, 128, None if temp == 0 else SamplingParams(temp, seed=i), gamma=0 if name == "plain" else "auto").stats
                tokens += st.generated_tokens; secs += st.decode_seconds
                tot[(label, name)].update(tokens=st.generated_tokens, calls=st.target_calls)
            tot[(label, name)].update(lookup=steps[True], steps=steps[True] + steps[False])
            rates[(label, name)].append(tokens / secs)
print(f"{rounds} rounds")
print("| decoding | rule | speedup (median) | every round | tokens/call | lookup steps |")
print("|---|---|---|---|---|---|")
for label in ("greedy", "T=0.8"):
    plain = rates[(label, "plain")]
    for name in ("measured v", "constant v 1.4"):
        t = tot[(label, name)]; sp = [a / b for a, b in zip(rates[(label, name)], plain)]
        print(f"| {label} | {name} | {statistics.median(sp):.2f}× | {' '.join(f'{x:.2f}' for x in sp)} | {t['tokens']/t['calls']:.2f} | {t['lookup']}/{t['steps']} |")
