"""Auto γ with the verify cost timed at an empty cache (today) vs at 128 tokens of context, one process."""
import collections, random, statistics, sys, time, torch
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams
torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
spec = sys.argv[2] if len(sys.argv) > 2 else str(default_draft_path())
target = load_model(default_target_path(), dtype="auto")
prompts = [p["prompt"] for p in load_prompts(None, 14)]
engines = {"plain": Engine(target, None, exact=False), "v at empty cache": Engine(target, spec, exact=False),
           "v at 128 tokens": Engine(target, spec, exact=False)}
for name, e in engines.items():
    e.generate(prompts[0], 16, gamma=0 if name == "plain" else "auto")
# time rows at context 128 with the target's native forward
m = target.model; cache = m.new_cache(512); toks = list(range(100, 300))
m.prefill(torch.tensor([toks[:140]]), 0, cache)
def run(rows):
    cache.length = 128
    m(torch.tensor([toks[128:128 + rows]]), 128, cache)
times = {r: [] for r in range(1, 10)}
for _ in range(15):
    for r in range(1, 10):
        s = time.perf_counter(); run(r); times[r].append(time.perf_counter() - s)
sec, floor = {}, 0.0
for r in range(1, 10):
    floor = max(floor, statistics.median(times[r])); sec[r] = floor
at128 = lambda gamma: sec[gamma + 1] / sec[1] if gamma + 1 in sec else 1.0
print("v empty:", [round(engines["v at empty cache"]._verify_cost(g), 2) for g in range(1, 9)])
print("v 128  :", [round(at128(g), 2) for g in range(1, 9)])
engines["v at 128 tokens"]._verify_cost = at128
rates = collections.defaultdict(list); tot = collections.defaultdict(collections.Counter); rng = random.Random(3)
for r in range(rounds):
    for label, temp in (("greedy", 0.0), ("T=0.8", 0.8)):
        names = list(engines); rng.shuffle(names)
        for name in names:
            tokens = secs = 0.0
            for i, p in enumerate(prompts):
                st = engines[name].generate(p, 128, None if temp == 0 else SamplingParams(temp, seed=i), gamma=0 if name == "plain" else "auto").stats
                tokens += st.generated_tokens; secs += st.decode_seconds
                tot[(label, name)].update(tokens=st.generated_tokens, calls=st.target_calls, drafted=st.drafted)
            rates[(label, name)].append(tokens / secs)
print(f"{rounds} rounds, drafter {spec}")
print("| decoding | verify cost | speedup (median) | every round | tokens/call | drafted/call |")
print("|---|---|---|---|---|---|")
for label in ("greedy", "T=0.8"):
    plain = rates[(label, "plain")]
    for name in ("v at empty cache", "v at 128 tokens"):
        t = tot[(label, name)]; sp = [a / b for a, b in zip(rates[(label, name)], plain)]
        print(f"| {label} | {name} | {statistics.median(sp):.2f}× | {' '.join(f'{x:.2f}' for x in sp)} | {t['tokens']/t['calls']:.2f} | {t['drafted']/t['calls']:.2f} |")
