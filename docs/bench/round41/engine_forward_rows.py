"""Round 41: the target's native calls inside the engine, by row count: CompiledSteps.run wrapped and timed while plain,
self-draft auto γ, self-draft γ = 3 and the self-draft engine at γ = 0 decode the bench's prompts, alternating per
prompt, 2 rounds; medians.  .venv/bin/python docs/bench/round41/engine_forward_rows.py"""
import time, torch, statistics, collections
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.bench.harness import load_prompts, encode_prompt
torch.set_num_threads(1)
target = load_model(default_target_path(), dtype="auto")
prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts()]
plain = Engine(target, None, dtype="auto", exact=False)
selfe = Engine(target, "self", dtype="auto", exact=False)
times = collections.defaultdict(list)
arm = [None]
for e in (plain, selfe):
    steps = e.target_steps
    orig = steps.run
    def run(tokens, length, cache, _orig=orig):
        t = time.perf_counter(); r = _orig(tokens, length, cache); times[(arm[0], len(tokens))].append(time.perf_counter() - t); return r
    steps.run = run
for ids in prompts[:3]:
    plain.generate(ids, 128, gamma=0); selfe.generate(ids, 128, gamma="auto")
times.clear()
for r in range(2):
    for ids in prompts:
        arm[0] = "plain"; plain.generate(ids, 128, gamma=0)
        arm[0] = "self"; selfe.generate(ids, 128, gamma="auto")
        arm[0] = "self3"; selfe.generate(ids, 128, gamma=3)
        arm[0] = "self-plain"; selfe.generate(ids, 128, gamma=0)
for k in sorted(times, key=str):
    v = times[k]
    print(k, len(v), f"{statistics.median(v)*1e6:.0f} us")
