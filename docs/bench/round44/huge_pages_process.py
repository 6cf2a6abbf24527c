"""Round 44. One engine per process, its packed weights on 2 MiB pages (2m) or with huge pages refused (4k): the
demo's prompt, 160 tokens, greedy, plain and speculative alternating, 9 rounds, medians. Alternate processes:

    for i in 1 2 3 4; do for arm in 4k 2m; do .venv/bin/python docs/bench/round44/huge_pages_process.py $arm 1; done; done
"""
import statistics, sys, torch
torch.set_num_threads(int(sys.argv[2]))
from quickdraft import huge_pages
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.demo import DEMO_PROMPT, MAX_NEW_TOKENS
from quickdraft.engine import Engine
from quickdraft.sampling import GREEDY

arm = sys.argv[1]
drafter = sys.argv[3] if len(sys.argv) > 3 else f"prompt-lookup+{default_draft_path()}"
if arm == "4k":
    huge_pages.huge_pages_available = lambda: False
engine = Engine(default_target_path(), drafter, exact=True, dtype="auto", compile_drafter=True)
engine.generate(DEMO_PROMPT, 16, gamma="auto")
rates = {0: [], "auto": []}
for _ in range(9):
    for g in (0, "auto"):
        rates[g].append(engine.generate(DEMO_PROMPT, MAX_NEW_TOKENS, GREEDY, gamma=g).stats.tokens_per_s)
plain, spec = statistics.median(rates[0]), statistics.median(rates["auto"])
print(f"{arm} threads {sys.argv[2]}: plain {plain:.0f} speculative {spec:.0f} ({spec / plain:.2f}x)", flush=True)
