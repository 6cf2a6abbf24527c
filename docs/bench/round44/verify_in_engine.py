"""Round 44. Each native forward's time by its shape [sequences, rows] inside the engine (the demo's prompt, 5 speculative
and 3 plain generations of 256 tokens), then each thread's CPU ticks, last CPU, allowed CPUs and context switches over 3
more speculative generations.

    .venv/bin/python docs/bench/round44/verify_in_engine.py THREADS [MIN_TASK_WORK]
"""
import sys, time, torch, statistics, collections
torch.set_num_threads(int(sys.argv[1]))
from quickdraft import kernels
if len(sys.argv) > 2: kernels.set_min_task_work(int(sys.argv[2]))
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.demo import DEMO_PROMPT
from quickdraft.sampling import GREEDY
e = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto", compile_drafter=True)
e.generate(DEMO_PROMPT, 16, gamma="auto")
times = collections.defaultdict(list)
orig = kernels.forward
def timed(tokens, *a, **k):
    s = time.perf_counter(); r = orig(tokens, *a, **k); times[tuple(tokens.shape)].append(time.perf_counter() - s); return r
kernels.forward = timed
for _ in range(5):
    r = e.generate(DEMO_PROMPT, 256, GREEDY, gamma="auto")
for _ in range(3):
    e.generate(DEMO_PROMPT, 256, GREEDY, gamma=0)
print(f"threads {sys.argv[1]}:", "; ".join(f"{k}: n={len(v)} median {statistics.median(v)*1e6:.0f} us" for k, v in sorted(times.items(), key=lambda kv: -len(kv[1]))[:5]))
import os
def threads_info():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        allowed = [l for l in open(f"/proc/self/task/{tid}/status") if l.startswith("Cpus_allowed_list")][0].split()[1]
        ctx = [l.split()[1] for l in open(f"/proc/self/task/{tid}/status") if "ctxt_switches" in l]
        out[int(tid)] = (int(f[11]) + int(f[12]), int(f[36]), allowed, ctx)
    return out
b = threads_info()
for _ in range(3):
    e.generate(DEMO_PROMPT, 256, GREEDY, gamma="auto")
a = threads_info()
print(sorted([(a[t][0] - b[t][0], a[t][1], a[t][2], a[t][3]) for t in a if t in b], reverse=True)[:3])
