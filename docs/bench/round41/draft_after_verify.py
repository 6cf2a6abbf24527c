"""Round 41: a drafted token (self-draft, chains of 5 over 200 cached tokens) right after a 6-row verify and with
its weights still in the caches, and the target's 6-row and 1-row calls.  .venv/bin/python docs/bench/round41/draft_after_verify.py"""
import statistics, sys, time, torch
from quickdraft.assets import default_target_path
from quickdraft.drafters.factory import make_drafter
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
CONTEXT, CHAIN, ROUNDS = 200, 5, 60
torch.set_num_threads(1)
target = load_model(default_target_path(), dtype="auto")
engine = Engine(target, None, dtype="auto")
drafter = make_drafter("self", target)
drafter.model.quantize_native_products(4)
prompt = [(i * 37) % 8000 + 5 for i in range(CONTEXT)]
tc = target.model.new_cache(1024); target.model.prefill(torch.tensor([prompt]), 0, tc)
dc = drafter.model.new_cache(1024); drafter.model.prefill(torch.tensor([prompt[:-1]]), 0, dc)
res = {"after verify": [], "hot": [], "verify6": [], "plain1": []}
for _ in range(ROUNDS):
    t=time.perf_counter(); engine.target_steps.run(list(range(10, 16)), CONTEXT, tc); res["verify6"].append(time.perf_counter()-t)
    dc.set_length(CONTEXT - 1)
    t = time.perf_counter(); drafter.model.native.draft_greedy([prompt[-1]], CHAIN, 8192, dc); res["after verify"].append((time.perf_counter()-t)/CHAIN)
    dc.set_length(CONTEXT - 1)
    t = time.perf_counter(); drafter.model.native.draft_greedy([prompt[-1]], CHAIN, 8192, dc); res["hot"].append((time.perf_counter()-t)/CHAIN)
    t=time.perf_counter(); engine.target_steps.run([10], CONTEXT, tc); res["plain1"].append(time.perf_counter()-t)
for k, v in res.items():
    print(f"{k}: {statistics.median(v)*1e6:.1f} us")
