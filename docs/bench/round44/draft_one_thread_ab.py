"""Round 44 (run before the least-work change, on 663e495^). Does the draft's native work on one thread (target on two)
change the demo's speeds? Arms alternate in one process.

    .venv/bin/python docs/bench/round44/draft_one_thread_ab.py REPS   (three processes ran 3 reps each)
"""
import sys, statistics, torch, time
torch.set_num_threads(2)
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.demo import DEMO_PROMPT, DEMO_SAMPLING, MAX_NEW_TOKENS, ROUNDS
from quickdraft.sampling import GREEDY
from quickdraft.model.native import NativeForward
e = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto", compile_drafter=True)
drafter = e.drafter
model_drafter = drafter.model if hasattr(drafter, "model") and hasattr(drafter.model, "model") else drafter
native = model_drafter.model.native
MODE = {"one": False}
class OneThread(NativeForward):
    def _wrap(name):
        base = getattr(NativeForward, name)
        def f(self, *a, **k):
            if not MODE["one"]:
                return base(self, *a, **k)
            torch.set_num_threads(1)
            try:
                return base(self, *a, **k)
            finally:
                torch.set_num_threads(2)
        return f
    __call__ = _wrap("__call__"); draft_greedy = _wrap("draft_greedy"); draft_batch = _wrap("draft_batch")
native.__class__ = OneThread
e.generate(DEMO_PROMPT, 16, gamma="auto")
for rep in range(int(sys.argv[1])):
    line = []
    for s in (GREEDY, DEMO_SAMPLING):
        rates = {"two": [], "one": [], "plain": []}
        for r in range(ROUNDS):
            rates["plain"].append(e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, s, gamma=0).stats.tokens_per_s)
            for arm in (("two", "one") if r % 2 == 0 else ("one", "two")):
                MODE["one"] = arm == "one"
                rates[arm].append(e.generate(DEMO_PROMPT, MAX_NEW_TOKENS, s, gamma="auto").stats.tokens_per_s)
            MODE["one"] = False
        m = {k: statistics.median(v) for k, v in rates.items()}
        line.append(f"draft-2thr {m['two']:.0f} draft-1thr {m['one']:.0f} plain {m['plain']:.0f} one/two {m['one']/m['two']:.3f}")
    print(rep, " | ".join(line), flush=True)
