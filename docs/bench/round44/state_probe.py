"""Round 44. One process's plain and speculative speed (the demo's prompt, 2 threads, 7 alternations, medians) and the CPU its
two busiest threads last ran on: does the main thread's CPU tell a fast-plain process? Run it in several processes."""
import os, statistics, sys, torch, time
torch.set_num_threads(2)
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.demo import DEMO_PROMPT, MAX_NEW_TOKENS
from quickdraft.sampling import GREEDY
e = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto", compile_drafter=True)
e.generate(DEMO_PROMPT, 16, gamma="auto")
def cpus():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(f[36]), int(f[11]) + int(f[12]))  # processor, utime+stime
    return out
before = cpus()
pl, sp = [], []
for _ in range(7):
    pl.append(e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, GREEDY, gamma=0).stats.tokens_per_s)
    sp.append(e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, GREEDY, gamma="auto").stats.tokens_per_s)
after = cpus()
busy = sorted(((after[t][1] - before[t][1], t == os.getpid(), after[t][0]) for t in after if t in before), reverse=True)[:2]
print(f"plain {statistics.median(pl):.0f} spec {statistics.median(sp):.0f} ratio {statistics.median(sp)/statistics.median(pl):.2f} busiest threads (ticks, main?, cpu): {busy}", flush=True)
