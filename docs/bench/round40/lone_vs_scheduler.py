"""One sequence at a time: the batch scheduler against the single-sequence engine (what the one-at-a-time
server runs), plain and auto γ, in one process; arms alternate per request so that the machine's
drift falls on all alike. LONE_ROW_BUCKETS=6,7,8 adds a scheduler whose steps also take those row counts;
BUCKETED_LONE_ROWS=1 one whose lone sequence pads its steps to the row buckets (before round 40's LONE_ROWS). `python docs/bench/round40/lone_vs_scheduler.py [rounds] [greedy|sampled|mixed]`; run it from
two checkouts (PYTHONPATH=<checkout>/src), alternating, to compare scheduler code by its ratio to the lone
engine."""
import collections, os, statistics, sys, time
import torch
import quickdraft.batch.shapes as shapes
from quickdraft.batch.scheduler import BatchScheduler
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import GREEDY, SamplingParams

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
# One engine for every arm: its weights (25 MB) are shared, where two engines' copies do not fit this
# CPU's 32 MB L3 together and each arm paid for the other's (an engine of its own per scheduler made the
# arms' 1-row forwards differ by up to 10% for no reason in their code).
lone = Engine(default_target_path(), default_draft_path(), dtype="bf16")
schedulers = {"scheduler": lone.batch_scheduler(32)}
if os.environ.get("LONE_ROW_BUCKETS"):  # a second scheduler whose steps take these row counts too
    shapes.ROW_BUCKETS, buckets = tuple(sorted({*shapes.ROW_BUCKETS, *map(int, os.environ["LONE_ROW_BUCKETS"].split(","))})), shapes.ROW_BUCKETS
    schedulers["scheduler, more row buckets"] = BatchScheduler(lone, 32)
    shapes.ROW_BUCKETS = buckets
if os.environ.get("BUCKETED_LONE_ROWS"):  # a second scheduler whose lone sequence's steps pad to the row buckets
    shapes.LONE_ROWS, lone_rows = 1, shapes.LONE_ROWS
    schedulers["scheduler, lone rows bucketed"] = BatchScheduler(lone, 32)
    shapes.LONE_ROWS = lone_rows
for s in schedulers.values():
    s.measure_step_costs()


SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=1)  # the load test's sampled requests
KIND = sys.argv[2] if len(sys.argv) > 2 else "greedy"  # greedy, sampled, or mixed (alternating, as the load test)


def sampling_for(i: int) -> SamplingParams:
    return GREEDY if KIND == "greedy" or (KIND == "mixed" and i % 2 == 0) else SAMPLED


def scheduled(scheduler, prompt: str, n: int, gamma, sampling: SamplingParams):
    scheduler.submit(prompt, n, sampling, gamma)
    while True:
        for _, event in scheduler.step():
            if event.result is not None:
                return event.result


arms = ["lone", *schedulers]
ratios = collections.defaultdict(list)
tokens_per_call = collections.defaultdict(list)
for r in range(rounds + 1):
    for gamma in (0, "auto"):
        spent = collections.Counter()
        for i, prompt in enumerate(TEXT_PROMPTS[:8]):
            order = arms[(i + r) % len(arms):] + arms[:(i + r) % len(arms)]
            for arm in order:
                t0 = time.perf_counter()
                out = (lone.generate(prompt, max_new_tokens=64, gamma=gamma, sampling=sampling_for(i)) if arm == "lone"
                       else scheduled(schedulers[arm], prompt, 64, gamma, sampling_for(i)))
                spent[arm] += time.perf_counter() - t0
                spent[arm, "tokens"] += len(out.token_ids)
                spent[arm, "calls"] += out.stats.target_calls
        if r:  # the first round warms up
            for arm in arms:
                ratios[gamma, arm].append((spent[arm, "tokens"] / spent[arm]) / (spent["lone", "tokens"] / spent["lone"]))
                tokens_per_call[gamma, arm].append(spent[arm, "tokens"] / spent[arm, "calls"])
            ratios[gamma, "lone tokens/s"].append(spent["lone", "tokens"] / spent["lone"])
for gamma in (0, "auto"):
    print(f"gamma {gamma}: lone engine {statistics.median(ratios[gamma, 'lone tokens/s']):.0f} tokens/s, "
          f"{statistics.median(tokens_per_call[gamma, 'lone']):.2f} tokens/call")
    for arm in schedulers:
        print(f"  {arm}: {statistics.median(ratios[gamma, arm]):.3f} of the lone engine "
              f"(rounds {', '.join(f'{x:.2f}' for x in ratios[gamma, arm])}), "
              f"{statistics.median(tokens_per_call[gamma, arm]):.2f} tokens/call")
