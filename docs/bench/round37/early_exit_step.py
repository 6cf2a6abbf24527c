"""Early exit at layer 2 of the embedded target as a draft model over the truncated target: a greedy chain of
4 after 200 cached tokens in one native call, its products unquantised against int8, and the full target for
scale (one thread; median of 200 chains, three repeats).

    .venv/bin/python docs/bench/round37/early_exit_step.py
"""
import statistics, time, torch
from torch import nn
from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.model.loader import load_model
from quickdraft.model.native import NativeForward
from quickdraft.model.transformer import shallow_copy
from dataclasses import replace
torch.set_num_threads(1); assert kernels.available()
target = load_model(default_target_path(), dtype="bf16"); target.model.pack_products()
ids = target.tokenizer.encode(open(__file__).read())[:201]
L = 2
m = shallow_copy(target.model); m.layers = nn.ModuleList(list(target.model.layers[:L])); m.config = replace(target.model.config, n_layer=L)
m.pack_products()
def chain(model, native):
    cache = model.new_cache(512)
    pos = torch.arange(200)[None]; mask = torch.ones(200, 200, dtype=torch.bool).tril()[None]
    native(torch.tensor([ids[:200]]), pos, pos, mask, cache, logits_rows=0)
    ts = []
    for _ in range(200):
        cache.length = 200; t0 = time.perf_counter(); native.draft_greedy([ids[200]], 4, 8192, cache); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) / 4 * 1e6
full = target.model
for _ in range(3):
    print(f"early exit at {L}: truncated bf16 {chain(m, m.native):.0f} us/token; truncated int8 {chain(m, NativeForward(m, int8_products=True)):.0f} us/token; full target {chain(full, full.native):.0f} us/token")
