import sys, time, json, torch, statistics
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(1)
e = Engine(default_target_path(), sys.argv[1], exact=False, dtype="auto")
prompts=[json.loads(l)['prompt'] for l in open('src/quickdraft/bench/prompts/bench.jsonl')]
arms = [0, "auto", 3, 4, 5, 6]
for p in prompts[:3]:
    for g in arms: e.generate(p, 128, gamma=g)
tot = {g: [] for g in arms}
for rnd in range(3):
    for g in arms:
        s = time.perf_counter()
        for p in prompts: e.generate(p, 128, gamma=g)
        tot[g].append(time.perf_counter() - s)
base = statistics.median(tot[0])
for g in arms: print(g, f"{base/statistics.median(tot[g]):.3f}x", [f"{x:.2f}" for x in tot[g]])
