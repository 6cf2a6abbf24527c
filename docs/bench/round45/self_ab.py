import sys, time, json, torch, statistics
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.drafters.draft_model import DraftModelDrafter
torch.set_num_threads(1)
e = Engine(default_target_path(), "self", exact=False, dtype="auto")
rec=[]
orig = DraftModelDrafter._propose_natively
def patched(self, *a, **k):
    d = orig(self, *a, **k); rec.append(d.step_seconds); return d
DraftModelDrafter._propose_natively = patched
prompts=[json.loads(l)['prompt'] for l in open('src/quickdraft/bench/prompts/bench.jsonl')]
arms = [0, "auto"]
for p in prompts[:3]:
    for g in arms: e.generate(p, 128, gamma=g)
tot = {g: [] for g in arms}
for rnd in range(3):
    for g in arms:
        rec.clear()
        s = time.perf_counter()
        for p in prompts: e.generate(p, 128, gamma=g)
        tot[g].append(time.perf_counter() - s)
steps0 = statistics.median(s[0] for s in rec)*1e6
later = statistics.median(x for s in rec for x in s[1:])*1e6
print(f"{sys.argv[1]} speedup {statistics.median(tot[0])/statistics.median(tot['auto']):.3f} plain {statistics.median(tot[0]):.3f}s spec {statistics.median(tot['auto']):.3f}s step0 {steps0:.0f}us later {later:.1f}us")
