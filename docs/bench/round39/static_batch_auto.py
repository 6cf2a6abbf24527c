"""A static batch through the scheduler (generate_batch, exact mode, prompt lookup then the draft model): gamma=0 against
gamma="auto", alternating, 3 rounds; bf16 or int8 target. `python docs/bench/round39/static_batch_auto.py none|8 [batch]`."""
import sys, time, statistics, torch
from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
torch.set_num_threads(1)
bits = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "none" else None
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
t = default_target_path()
e = Engine(t, f"prompt-lookup+{embedded_draft_for(t)}", exact=True, dtype="auto", target_bits=bits)
prompts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(n)]
for g in (0, "auto"): e.generate_batch(prompts, 32, gamma=g)
res = {0: [], "auto": []}
for r in range(3):
    for g in ((0, "auto") if r % 2 == 0 else ("auto", 0)):
        s = time.perf_counter(); out = e.generate_batch(prompts, 48, gamma=g); el = time.perf_counter() - s
        res[g].append(sum(len(o.token_ids) for o in out) / el)
        if g == "auto": drafted = statistics.mean(o.stats.drafted / max(1, o.stats.target_calls) for o in out); calls = statistics.mean(o.stats.target_calls for o in out)
print(f"bits {bits} batch {n}: plain {statistics.median(res[0]):.0f} tok/s, auto {statistics.median(res['auto']):.0f} tok/s, ratio {statistics.median(res['auto'])/statistics.median(res[0]):.2f}; drafted/call {drafted:.2f}, calls {calls:.0f}")
