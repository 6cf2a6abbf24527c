import time, torch, json, statistics, sys
from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(1)
acc = {"k": 0.0}
def wrap(name):
    f = getattr(kernels, name)
    def g(*a, **k):
        s = time.perf_counter(); r = f(*a, **k); acc["k"] += time.perf_counter() - s; return r
    setattr(kernels, name, g)
for n in ("forward", "draft_greedy", "first_maxima"): wrap(n)
e = Engine(default_target_path(), sys.argv[1] if len(sys.argv) > 1 else "self", exact=False, dtype="auto")
prompts=[json.loads(l)['prompt'] for l in open('src/quickdraft/bench/prompts/bench.jsonl')]
for p in prompts[:3]: e.generate(p, 128, gamma="auto")
for g in ("auto", 0):
    acc["k"] = 0.0; dec = 0.0; calls = 0; wall = 0.0
    for p in prompts:
        s = time.perf_counter(); r = e.generate(p, 128, gamma=g); wall += time.perf_counter() - s
        dec += r.stats.decode_seconds + r.stats.prefill_seconds; calls += r.stats.target_calls
    print(f"gamma={g}: wall {wall*1e3:.0f} ms, prefill+decode {dec*1e3:.0f} ms, kernels {acc['k']*1e3:.0f} ms, outside kernels {(wall-acc['k'])*1e3:.0f} ms = {(wall-acc['k'])/calls*1e6:.0f} us per target call ({calls} calls)")
