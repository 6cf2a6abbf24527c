"""Round 43. Two threads, then one, beside a CPU hog started after the engine: the premise of the thread governor.

    .venv/bin/python docs/bench/round43/hog_premise.py
"""
import torch, time, subprocess, sys
from quickdraft.assets import default_target_path, default_draft_path
from quickdraft.engine import Engine
torch.set_num_threads(2)
e = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto")
p = 'def parse(line):\n'
e.generate(p, 16)
def rate(n=3):
    return sorted(e.generate(p, 128, gamma="auto").stats.tokens_per_s for _ in range(n))[n // 2]
print("idle 2 threads", rate())
torch.set_num_threads(1); print("idle 1 thread", rate()); torch.set_num_threads(2)
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
time.sleep(0.5)
print("hog 2 threads", rate())
torch.set_num_threads(1); print("hog 1 thread", rate())
torch.set_num_threads(2); print("hog 2 threads again", rate())
hog.kill()
