"""Round 41: a 6-row verify of the target after a self-draft chain of 5 against one after another verify (and 1-row
calls alike), contexts 100-228 in steps as a decode advances, 5 rounds.  .venv/bin/python docs/bench/round41/verify_after_chain.py"""
import statistics, time, torch
from quickdraft.assets import default_target_path
from quickdraft.drafters.factory import make_drafter
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
torch.set_num_threads(1)
target = load_model(default_target_path(), dtype="auto")
engine = Engine(target, None, dtype="auto")
drafter = make_drafter("self", target)
drafter.model.quantize_native_products(4)
prompt = [(i * 37) % 8000 + 5 for i in range(400)]
tc = target.model.new_cache(512); target.model.prefill(torch.tensor([prompt]), 0, tc)
dc = drafter.model.new_cache(512); drafter.model.prefill(torch.tensor([prompt[:-1]]), 0, dc)
steps = engine.target_steps
res = {}
def timed(key, f):
    t = time.perf_counter(); f(); res.setdefault(key, []).append(time.perf_counter() - t)
for rnd in range(5):
    for ctx in range(100, 228):  # plain: 1 row a step
        tc.set_length(ctx); timed("plain 1", lambda: steps.run([5], ctx, tc))
    for ctx in range(100, 228, 5):  # spec: chain of 5 then 6 rows
        dc.set_length(ctx - 1)
        timed("chain", lambda: drafter.model.native.draft_greedy([prompt[ctx]], 5, 8192, dc))
        tc.set_length(ctx); timed("spec 6", lambda: steps.run(list(range(5, 11)), ctx, tc))
    for ctx in range(100, 228, 5):  # 6 rows a step without drafts
        tc.set_length(ctx); timed("6 alone", lambda: steps.run(list(range(5, 11)), ctx, tc))
    for ctx in range(100, 228):  # plain again
        tc.set_length(ctx); timed("plain 1b", lambda: steps.run([5], ctx, tc))
for k, v in res.items(): print(f"{k}: {statistics.median(v)*1e6:.0f} us (n={len(v)})")
