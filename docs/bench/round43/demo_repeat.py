"""Round 43. The demo's measurement (its prompt, 160 tokens, 9 alternations of plain and speculative, medians) repeated REPS
times in one process with THREADS torch threads: does a process keep its ratio?

    .venv/bin/python docs/bench/round43/demo_repeat.py THREADS REPS
"""
import sys, statistics, torch, time
torch.set_num_threads(int(sys.argv[1]))
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.demo import DEMO_PROMPT, DEMO_SAMPLING, MAX_NEW_TOKENS, ROUNDS
from quickdraft.sampling import GREEDY
e = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto", compile_drafter=True, compile_target=True)
e.generate(DEMO_PROMPT, 16, gamma="auto")
out = []
for rep in range(int(sys.argv[2])):
    line = []
    for s in (GREEDY, DEMO_SAMPLING):
        sp, pl = [], []
        for _ in range(ROUNDS):
            pl.append(e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, s, gamma=0).stats.tokens_per_s)
            sp.append(e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, s, gamma="auto").stats.tokens_per_s)
        line.append(f"{statistics.median(sp)/statistics.median(pl):.2f} ({statistics.median(sp):.0f}/{statistics.median(pl):.0f})")
    print(rep, *line, flush=True)
