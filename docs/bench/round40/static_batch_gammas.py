"""A static batch through the scheduler (generate_batch, exact mode, prompt lookup then the draft model): plain against
fixed gammas and auto, alternating order per round, 3 rounds. `python docs/bench/round40/static_batch_gammas.py [batch] [gammas...]`."""
import sys, time, statistics, torch
from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
arms = [0] + [int(g) if g != "auto" else g for g in (sys.argv[2:] or ["2", "3", "4", "auto"])]
t = default_target_path()
e = Engine(t, f"prompt-lookup+{embedded_draft_for(t)}", exact=True, dtype="auto")
prompts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(n)]
for g in arms: e.generate_batch(prompts, 32, gamma=g)
res = {g: [] for g in arms}; drafted = {}
for r in range(3):
    for g in (arms if r % 2 == 0 else arms[::-1]):
        s = time.perf_counter(); out = e.generate_batch(prompts, 64, gamma=g); el = time.perf_counter() - s
        res[g].append(sum(len(o.token_ids) for o in out) / el)
        drafted[g] = statistics.mean(o.stats.drafted / max(1, o.stats.target_calls) for o in out), statistics.mean(len(o.token_ids) / max(1, o.stats.target_calls) for o in out)
plain = statistics.median(res[0])
for g in arms:
    m = statistics.median(res[g])
    print(f"batch {n} gamma {g}: {m:.0f} tok/s, {m / plain:.2f}x plain; drafted/call {drafted[g][0]:.2f}, tokens/call {drafted[g][1]:.2f}")
