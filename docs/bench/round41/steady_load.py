"""Round 41. Steady load without HTTP: CLIENTS requests always in flight in one scheduler (a finished one replaced at once),
auto γ against γ = 0 in alternating blocks of SECONDS; tokens/s per block, and auto's steps by goodput's γ.

    .venv/bin/python docs/bench/round41/steady_load.py [CLIENTS] [SECONDS] [BLOCKS] [prof]   (prof: cProfile of a block of each)
"""
import sys, time, statistics, collections, torch, cProfile, pstats
from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.sampling import GREEDY, SamplingParams
torch.set_num_threads(1)
clients = int(sys.argv[1]) if len(sys.argv) > 1 else 16
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5
blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 3
t = default_target_path()
e = Engine(t, f"prompt-lookup+{embedded_draft_for(t)}", exact=True, dtype="auto")
s = e.batch_scheduler(32); s.measure_step_costs()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
counter = [0]
def submit(g):
    i = counter[0]; counter[0] += 1
    s.submit(TEXT_PROMPTS[i % len(TEXT_PROMPTS)], 32, GREEDY if i % 2 == 0 else SAMPLED, g)
def block(g, secs):
    for _ in range(clients): submit(g)
    tokens = 0; start = time.perf_counter(); gammas = collections.Counter(); step_times = collections.defaultdict(list)
    while time.perf_counter() - start < secs:
        t0 = time.perf_counter(); events = s.step(); dt = time.perf_counter() - t0
        gammas[s.last_gamma if g == "auto" else 0] += 1; step_times[s.last_gamma if g == "auto" else 0].append(dt)
        for r, ev in events:
            if ev.result is not None:
                tokens += len(ev.result.token_ids); submit(g)
    el = time.perf_counter() - start
    for r in list(s.active) + list(s.waiting): s.cancel(r)
    while not s.idle: s.step()
    return tokens / el, gammas, {k: statistics.median(v) * 1e3 for k, v in step_times.items()}
block("auto", 2); block(0, 2)
ratios = []
for b in range(blocks):
    order = (0, "auto") if b % 2 == 0 else ("auto", 0)
    res = {g: block(g, seconds) for g in order}
    ratios.append(res["auto"][0] / res[0][0])
    print(f"block {b}: plain {res[0][0]:.0f} tok/s ({res[0][2]}), auto {res['auto'][0]:.0f} tok/s, ratio {ratios[-1]:.3f}; auto steps by γ {dict(res['auto'][1])}, median ms {({k: round(v, 2) for k, v in res['auto'][2].items()})}")
print(f"median ratio {statistics.median(ratios):.3f}") if ratios else None
if len(sys.argv) > 4:
    for g in (0, "auto"):
        cProfile.run(f"block({g!r}, 4)", f"/tmp/r41/prof_steady_{g}")
        st = pstats.Stats(f"/tmp/r41/prof_steady_{g}")
        print("=====", g, "steps", st.stats.get(("/work/main/src/quickdraft/batch/scheduler.py", 215, "step"), (0, 0))[:2])
        st.sort_stats("tottime").print_stats(18)
